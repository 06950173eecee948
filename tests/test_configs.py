"""Every entry's smoke variant loads, runs and gives finite metrics: a method that trains runs 2
steps; an evaluate-only one (no loss, no step) runs its one evaluation.

Parametrized over configs/*.py (each with its `DECLARATIONS`, core/declarations.py) and the
test-defined kinds of tests/kinds.py, so each new method is covered as soon as its config
exists. Convention: every config accepts `size=smoke` (a tiny model, 2 steps), or declares
another smoke variant.
"""

import dataclasses
import math
import pathlib

import pytest

import methods
from core import declarations, train
from core.declarations import Declarations
from core.errors import ConfigError
from tests.entries import BY_NAME, NAMES

CONFIG_DIR = pathlib.Path(__file__).resolve().parents[1] / "configs"
CONFIGS = sorted(p.stem for p in CONFIG_DIR.glob("*.py") if p.stem not in ("__init__", "common"))


def test_configs_exist():
    assert "lm" in CONFIGS


def test_every_config_is_declared_and_compiled_ahead_of_time():
    """The loader finds every configs/<slug>.py (this test's own listing of the folder), and
    every method package has a config: tests/aot and the scaling table compile each entry's
    smoke and largest configs, so a method missing here would never be checked off this
    machine."""
    assert [entry.name for entry in declarations.entries()] == CONFIGS
    assert set(methods.available()) <= set(CONFIGS)
    for name in CONFIGS:
        entry = declarations.entry(name)
        assert entry.declarations == declarations.of(name)
        # The largest config builds, with every override landing on an existing field.
        arg, overrides = entry.largest
        config = entry.config(arg, overrides)
        for path, value in overrides.items():
            node = config
            for key in path.split("."):
                node = node[key]
            assert node == value, (name, path)


@pytest.mark.parametrize(
    "declared, field",
    [
        ({"largest": "size=base"}, "DECLARATIONS must be a core.declarations.Declarations"),
        (Declarations(largest=3), "DECLARATIONS.largest=3"),
        (Declarations(largest_overrides=[("train.steps", 1)]), "DECLARATIONS.largest_overrides"),
        (Declarations(no_matmul=True), "DECLARATIONS.no_matmul=True"),
        (Declarations(largest_overrides={"": 1}), "DECLARATIONS.largest_overrides: ''"),
    ],
)
def test_malformed_declarations_are_one_line_errors(declared, field):
    with pytest.raises(ConfigError) as e:
        declarations.check("lm", declared)
    assert str(e.value).startswith(f"configs/lm.py: {field}") and "\n" not in str(e.value)


def test_an_override_of_a_missing_field_is_a_one_line_error():
    entry = dataclasses.replace(
        declarations.entry("lm"), declarations=Declarations(largest_overrides={"train.nope": 1})
    )
    with pytest.raises(ConfigError, match=r"^lm: DECLARATIONS override 'train.nope': no such"):
        entry.config(*entry.largest)


@pytest.mark.parametrize("name", NAMES)
def test_smoke_variant_runs(name, tmp_path):
    entry = BY_NAME[name]
    config = entry.smoke_config(mesh="cpu")
    assert config.method == name or config.method in methods.available()
    config.train.steps = 2
    method = entry.method(config)
    result = train.run(config, method, str(tmp_path))
    for row in result.history:
        assert all(math.isfinite(v) for v in row.values()), row
    if not method.trains:  # evaluate-only: one evaluation of the initial state, no step
        assert [row["step"] for row in result.history] == [0]
        assert any(key.startswith("eval/") for key in result.history[0])
        assert int(result.state.step) == 0
        return
    rows = [row for row in result.history if "loss" in row]
    assert [row["step"] for row in rows] == [1, 2]
    assert int(result.state.step) == 2
