"""Every method config's smoke variant loads, trains 2 steps and gives finite metrics.

Parametrized over configs/*.py, so each new method is covered as soon as its config exists.
Convention: every config accepts `size=smoke` (a tiny model, 2 steps).
"""

import importlib
import math
import pathlib

import pytest

import methods
from core import train

CONFIG_DIR = pathlib.Path(__file__).resolve().parents[1] / "configs"
CONFIGS = sorted(p.stem for p in CONFIG_DIR.glob("*.py") if p.stem not in ("__init__", "common"))


def test_configs_exist():
    assert "lm" in CONFIGS


def test_every_config_is_compiled_ahead_of_time():
    """tests/aot compiles each method's smoke and largest configs (`launch.aot.LARGEST`) for
    TPU and GPU targets; a method missing there would never be checked off this machine."""
    from launch import aot

    assert sorted(aot.LARGEST) == CONFIGS


@pytest.mark.parametrize("name", CONFIGS)
def test_smoke_variant_trains(name, tmp_path):
    config = importlib.import_module(f"configs.{name}").get_config("mesh=cpu,size=smoke")
    assert config.method == name or config.method in methods.available()
    config.train.steps = 2
    result = train.run(config, methods.make(config), str(tmp_path))
    rows = [row for row in result.history if "loss" in row]
    assert [row["step"] for row in rows] == [1, 2]
    for row in result.history:
        assert all(math.isfinite(v) for v in row.values()), row
    assert int(result.state.step) == 2
