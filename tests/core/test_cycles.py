"""core.cycles: optimiser switching in cycles of tau steps through core.train."""

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs.common import base_config
from core import cycles, data, train
from core.errors import ConfigError
from core.method import Method

W_TRUE = np.array([1.0, -2.0, 0.5, 3.0], np.float32)
TAU = 4
POOL = {
    "sgd": {"kind": "sgd", "lr": 0.05},
    "adam": {"kind": "adam", "lr": 0.02},
    "sgdm": {"kind": "sgd", "lr": 0.02, "momentum": 0.9},
}


def example(rng):
    x = rng.normal(size=W_TRUE.shape).astype(np.float32)
    return {"x": x, "y": np.float32(x @ W_TRUE)}


def init(rng, batch_spec):
    return {"params": {"w": jax.random.normal(rng, (batch_spec["x"].shape[-1],)) * 0.1}}


def noisy_mse(params, batch, *, rng, extra):
    # The rng enters the loss, so a micro-step given another key than plain training's differs.
    noise_B = 0.1 * jax.random.normal(rng, batch["y"].shape)
    return jnp.mean((batch["x"] @ params["w"] - batch["y"] + noise_B) ** 2), {}


def dataset(split, *, shard, seed):
    return data.synthetic(example, global_batch=8, seed=seed, shard=shard)


def config(steps, **train_options):
    c = base_config(mesh="auto")
    c.train.steps, c.train.batch_size, c.train.log_every = steps, 8, 100
    c.train.checkpoint_every, c.train.eval_every = 0, -1
    for k, v in train_options.items():
        c.train[k] = v
    return c


def one():
    return jax.devices()[:1]


def loss_driven_hook(state, *, step):
    """A policy whose choice depends on the last cycle's losses (so a resumed run repeats it
    only if those, in the checkpointed extra, are restored)."""
    losses = np.asarray(state.extra[cycles.LOSSES])
    choice = np.int32((step + int(losses.sum() * 1e3)) % len(POOL))
    return state.replace(extra={**state.extra, cycles.OPTIMIZER: choice})


def cycled(pool=POOL, hook=loss_driven_hook, **options):
    base = Method(init, loss=noisy_mse, dataset=dataset)
    return cycles.with_cycles(base, tau=TAU, pool=pool, hook=hook, **options)


def test_one_optimizer_in_the_pool_equals_plain_training_bitwise(tmp_path):
    num_cycles = 3
    plain = Method(init, loss=noisy_mse, dataset=dataset, tx=optax.adam(0.02))
    expected = train.run(config(num_cycles * TAU), plain, str(tmp_path / "plain"), devices=one())
    one_pool = {"adam": {"kind": "adam", "lr": 0.02}}
    method = cycled(one_pool, hook=None)
    got = train.run(config(num_cycles), method, str(tmp_path / "cycles"), devices=one())
    np.testing.assert_array_equal(got.state.params["w"], expected.state.params["w"])
    plain_losses = [row["loss"] for row in expected.history if "loss" in row]
    np.testing.assert_array_equal(
        np.asarray(got.state.extra[cycles.LOSSES]), np.float32(plain_losses[-TAU:])
    )
    assert int(got.state.step) == num_cycles


def test_no_recompilation_after_each_optimizers_first_cycle():
    schedule = [0, 1, 2, 2, 0, 1, 0]

    def scripted(state, *, step):
        nxt = schedule[min(step, len(schedule) - 1)]
        return state.replace(extra={**state.extra, cycles.OPTIMIZER: np.int32(nxt)})

    method = cycled(hook=scripted, first=schedule[0])
    session = train.init(config(len(schedule)), method, devices=one())
    compiles = []
    record = lambda event, duration, **kw: compiles.append(event)
    session.train(1)  # compiles the cycle program
    jax.monitoring.register_event_duration_secs_listener(record)
    try:
        rows = session.train(len(schedule) - 1)
    finally:
        jax.monitoring.unregister_event_duration_listener(record)
    assert [int(r[cycles.OPTIMIZER]) for r in rows] == schedule[1:]
    assert not [e for e in compiles if "compile" in e], compiles
    assert session.step._cache_size() == 1


@pytest.mark.parametrize("inherit", [False, True])
def test_a_switch_restarts_the_optimiser_unless_it_inherits(inherit):
    schedule = [1, 1, 0, 1]  # adam, adam, sgd, adam

    def scripted(state, *, step):
        nxt = schedule[min(step, len(schedule) - 1)]
        return state.replace(extra={**state.extra, cycles.OPTIMIZER: np.int32(nxt)})

    method = cycled(hook=scripted, inherit=inherit, first=schedule[0])
    session = train.init(config(4), method, devices=one())
    session.train(4)
    count = int(session.state.opt_state["adam"][0].count)
    # Fresh after the sgd cycle: one cycle's steps; inherited: all three adam cycles'.
    assert count == (3 * TAU if inherit else TAU)


def test_a_run_killed_between_cycles_resumes_bitwise(tmp_path):
    c = config(8, checkpoint_every=2, keep_checkpoints=10)
    whole = train.run(c, cycled(), str(tmp_path / "whole"), devices=one())
    assert len({r[cycles.OPTIMIZER] for r in whole.history if cycles.OPTIMIZER in r}) > 1
    run_dir = tmp_path / "killed"
    shutil.copytree(tmp_path / "whole", run_dir)
    for lost in ("6", "8"):  # as if killed in cycle 5, after cycle 4's checkpoint
        shutil.rmtree(run_dir / "checkpoints" / lost)
    resumed = train.run(c, cycled(), str(run_dir), devices=one())
    for a, b in zip(jax.tree.leaves(resumed.state), jax.tree.leaves(whole.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bad_cycle_options_are_one_line_errors():
    with pytest.raises(ConfigError, match="kind='nesterov' is unknown"):
        cycles.make_pool({"x": {"kind": "nesterov", "lr": 0.1}})
    with pytest.raises(ConfigError, match="lr must be > 0"):
        cycles.make_pool({"x": {"kind": "sgd", "lr": 0}})
    with pytest.raises(ConfigError, match="pool is empty"):
        cycles.make_pool({})
    with pytest.raises(ConfigError, match="tau=0 must be an int >= 1"):
        cycles.cycle_step(noisy_mse, cycles.make_pool(POOL), 0)
