"""Bad generic config values are refused by `core.validate.config` in one line naming the
method and the field, for every method config (configs/*.py), before anything is traced."""

import importlib
import inspect
import os

import pytest

import methods
from core import train, validate
from core.errors import ConfigError
from tests.test_configs import CONFIGS

# (field, bad value): each is a mistake a user makes by hand on the command line.
BAD_VALUES = [
    ("train.batch_size", 0),
    ("train.batch_size", -1),
    ("train.steps", -5),
    ("train.log_every", 0),
    ("train.checkpoint_every", -1),
    ("train.keep_checkpoints", 0),
    ("seed", -1),
    ("optim.lr", -1e-3),
    ("optim.warmup_steps", -10),
    ("optim.grad_clip", -1.0),
    ("optim.b2", 1.0),
    ("optim.name", "adamz"),
    ("optim.schedule", "cosin"),
    ("dtype", "bfloat8"),
]


def smoke_config(name: str):
    return importlib.import_module(f"configs.{name}").get_config("mesh=cpu,size=smoke")


def with_value(config, field: str, value):
    *parents, leaf = field.split(".")
    node = config
    for parent in parents:
        node = node[parent]
    node[leaf] = value
    return config


@pytest.mark.parametrize("name", CONFIGS)
def test_every_config_passes_and_so_does_zero_steps(name):
    config = smoke_config(name)
    validate.config(config)
    # 0 steps is legal: the run evaluates the initial state and stops (a baseline of the
    # untrained model, or of train.init_from's parameters), as an evaluate-only method's does.
    validate.config(with_value(config, "train.steps", 0))


@pytest.mark.parametrize("name", CONFIGS)
def test_bad_generic_values_are_one_line_errors_naming_method_and_field(name):
    for field, value in BAD_VALUES:
        config = with_value(smoke_config(name), field, value)
        with pytest.raises(ConfigError) as e:
            validate.config(config)
        message = str(e.value)
        assert "\n" not in message, message
        assert message.startswith(f"{config.method}: "), message
        assert f"{field}={value!r}" in message, (field, message)


def test_errors_raised_without_the_config_get_the_method_name_once():
    config = smoke_config("lm")
    with pytest.raises(ConfigError, match=r"^lm: mesh too small$"), validate.naming(config):
        raise ConfigError("mesh too small")
    with pytest.raises(ConfigError, match=r"^lm: named already$"), validate.naming(config):
        raise ConfigError("lm: named already")


@pytest.mark.skipif(
    "validate.config(" not in inspect.getsource(train),
    reason="core.train does not call core.validate.config yet (the lead wires it into plan)",
)
@pytest.mark.parametrize(("field", "value"), [("train.batch_size", 0), ("train.steps", -5)])
def test_a_run_with_a_bad_config_writes_nothing(tmp_path, field, value):
    config = with_value(smoke_config("lm"), field, value)
    workdir = tmp_path / "w"
    with pytest.raises(ConfigError, match=f"^lm: {field}="):
        train.run(config, methods.make(config), str(workdir))
    assert not os.path.exists(workdir)


def test_zero_steps_evaluates_the_initial_state_and_stops(tmp_path):
    config = with_value(smoke_config("lm"), "train.steps", 0)
    result = train.run(config, methods.make(config), str(tmp_path))
    assert int(result.state.step) == 0
    assert [row["step"] for row in result.history] == [0]  # one evaluation row, no training
    assert all(key.startswith("eval/") for key in result.history[0] if key != "step")
