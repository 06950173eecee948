"""The training core end to end on the LM: sharding equivalence, resume, compile count."""

import jax
import numpy as np
import pytest

import methods
from configs import lm
from core import train
from core import workdir as workdir_lib
from core.checkpoint import Checkpointer


def lm_config(steps=20, **overrides):
    config = lm.get_config("size=smoke,task=copy")
    config.train.steps = steps
    config.train.log_every = 10
    config.train.checkpoint_every = 0
    config.train.eval_every = -1
    config.task.length = 8
    config.task.num_symbols = 8
    config.fsdp_min_size = 0  # shard every divisible leaf, so fsdp=2 really splits the smoke model
    for key, value in overrides.items():
        config[key] = value
    return config


def run_losses(config, shape, workdir):
    config.mesh.shape = shape
    mesh_devices = int(np.prod(shape))
    result = train.run(
        config, methods.make(config), str(workdir), devices=jax.devices()[:mesh_devices]
    )
    return np.array([row["loss"] for row in result.history if "loss" in row]), result.state


def test_one_device_data8_and_data4_fsdp2_give_the_same_losses(tmp_path):
    config = lm_config()
    ref, ref_state = run_losses(lm_config(), (1, 1, 1), tmp_path / "one")
    dp, _ = run_losses(lm_config(), (8, 1, 1), tmp_path / "dp")
    fsdp, fsdp_state = run_losses(lm_config(), (4, 2, 1), tmp_path / "fsdp")
    assert len(ref) == config.train.steps
    # The loss itself must move, or equal losses would prove nothing.
    assert ref[-1] < ref[0] - 0.1
    # float32: the sharded runs sum gradients in another order (per-device partial sums, then an
    # all-reduce), which changes results in the last bits (~1e-7 relative per reduction), and
    # AdamW's 1/sqrt(v) can amplify that on tiny gradients. Measured over these 20 steps: loss
    # 2e-7 (data=8) and 3.5e-7 (4 x 2) relative, params 1.6e-7 absolute. 1e-5 leaves 30x room
    # for rounding; a sharding bug (a gradient summed instead of averaged, a batch shard
    # dropped) moves the loss by far more.
    np.testing.assert_allclose(dp, ref, rtol=1e-5)
    np.testing.assert_allclose(fsdp, ref, rtol=1e-5)
    for a, b in zip(
        jax.tree.leaves(fsdp_state.params), jax.tree.leaves(ref_state.params), strict=True
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
    # FSDP really sharded something.
    kernel_shardings = [x.sharding.spec for x in jax.tree.leaves(fsdp_state.params)]
    assert any("fsdp" in str(spec) for spec in kernel_shardings)


class _Interrupted(Exception):
    pass


def _stop_after(method, num_batches):
    """The same method, whose data iterator dies after `num_batches` batches (a crash)."""

    class Dying:
        def __init__(self, inner):
            self.inner, self.left = inner, num_batches

        def __iter__(self):
            return self

        def __next__(self):
            if self.left == 0:
                raise _Interrupted
            self.left -= 1
            return next(self.inner)

        def get_state(self):
            return self.inner.get_state()

        def set_state(self, state):
            self.inner.set_state(state)

    return method._replace(dataset=lambda *a, **k: Dying(method.dataset(*a, **k)))


def test_restart_from_checkpoint_continues_with_the_same_losses(tmp_path):
    config = lm_config(steps=12)
    config.train.checkpoint_every = 5
    full, full_state = run_losses(config, (8, 1, 1), tmp_path / "full")

    workdir = tmp_path / "resumed"
    method = methods.make(config)
    with pytest.raises(_Interrupted):
        train.run(config, _stop_after(method, 7), str(workdir))  # dies after step 7
    assert Checkpointer(str(workdir / "checkpoints")).latest_step() == 5
    result = train.run(config, method, str(workdir))
    resumed = np.array([row["loss"] for row in result.history if "loss" in row])
    assert [row["step"] for row in result.history] == list(range(6, 13))
    # The workdir keeps the whole curve: steps 1-5 from the first call (6 and 7, written after
    # its last checkpoint, were rewound and written again, once).
    whole = workdir_lib.read_metrics(workdir)
    assert [row["step"] for row in whole] == list(range(1, 13))
    np.testing.assert_array_equal([row["loss"] for row in whole], full)
    # Same program, same devices, same data and per-step rng: bitwise equal.
    np.testing.assert_array_equal(resumed, full[5:])
    for a, b in zip(
        jax.tree.leaves(result.state.params), jax.tree.leaves(full_state.params), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_train_step_compiles_once():
    config = lm_config(steps=5)
    session = train.init(config, methods.make(config))
    state = session.state
    for _ in range(5):
        state, metrics = session.step(state, session.next_batch())
    jax.block_until_ready(metrics)
    assert session.step._cache_size() == 1
    assert int(state.step) == 5
