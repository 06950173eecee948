"""Bad input gets a clear one-line error that names the problem."""

import os
import subprocess
import sys

import jax
import pytest

import methods
from configs import lm
from core import train
from core.errors import ConfigError
from core.mesh import make_mesh


def one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message, message
    return message


def smoke():
    return lm.get_config("size=smoke")


def test_unknown_method():
    config = smoke()
    config.method = "no_such_method"
    with pytest.raises(ConfigError) as e:
        methods.make(config)
    assert "unknown method 'no_such_method'" in one_line(e) and "lm" in one_line(e)


def test_override_of_the_wrong_type_on_the_command_line(tmp_path):
    repo = os.path.dirname(os.path.dirname(os.path.abspath(lm.__file__)))
    cmd = [sys.executable, "-m", "launch.train", "--config=configs/lm.py:size=smoke"]
    cmd += ["--config.train.steps=ten", f"--workdir={tmp_path}"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "flag --config.train.steps=ten: invalid literal for int()" in out.stderr
    assert not os.listdir(tmp_path)  # nothing ran


def test_override_of_the_wrong_type_in_python():
    config = smoke()
    with pytest.raises(TypeError) as e:
        config.train.steps = "ten"
    assert "steps" in one_line(e)


@pytest.mark.parametrize(
    "shape, needle",
    [((3, 1, 1), "needs 3 devices but 8 are available"), ((-1, 3, 1), "not divisible by 3")],
)
def test_mesh_that_does_not_fit(shape, needle):
    config = smoke()
    config.mesh.shape = shape
    with pytest.raises(ConfigError) as e:
        make_mesh(config.mesh)
    assert needle in one_line(e)


def test_mesh_for_another_platform():
    config = lm.get_config("size=smoke,mesh=tpu")
    with pytest.raises(ConfigError) as e:
        make_mesh(config.mesh)
    assert "mesh.platform='tpu'" in one_line(e) and "cpu" in one_line(e)


def test_batch_not_divisible_by_data_parallel_size():
    config = smoke()
    config.train.batch_size = 12  # 8 data-parallel devices
    with pytest.raises(ConfigError) as e:
        train.init(config, methods.make(config))
    assert "train.batch_size=12 is not divisible by the data-parallel size 8" in one_line(e)


def test_unwritable_workdir(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    config = smoke()
    with pytest.raises(ConfigError) as e:
        train.run(config, methods.make(config), str(blocker / "run"))
    assert "is not writable" in one_line(e) and str(blocker) in one_line(e)


def test_unknown_config_option():
    with pytest.raises(ConfigError) as e:
        lm.get_config("size=huge")
    assert "size='huge' is unknown" in one_line(e)


def test_non_finite_loss_stops_with_the_step(tmp_path):
    config = smoke()
    config.train.steps = 5
    config.optim.lr = 1e30  # diverges within a few steps
    config.optim.grad_clip = 0.0
    config.train.checkpoint_every = 0
    with pytest.raises(FloatingPointError) as e:
        train.run(config, methods.make(config), str(tmp_path))
    message = one_line(e)
    assert "non-finite loss" in message and "at step" in message
    assert jax.device_count() == 8
