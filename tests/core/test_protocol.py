"""Every form of the Method protocol through `core.train`: no loss, no optimiser, named
optimiser states, a switch with a reset, a host hook (resumed bitwise), core-run evaluation on
any mesh, an evaluate-only run, host arrays from `init`, and `train.init_from`."""

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs.common import base_config
from core import data, steps, train
from core.errors import ConfigError
from core.method import Method

W_TRUE = np.array([1.0, -2.0, 0.5, 3.0], np.float32)
N_EVAL = 13  # not a multiple of the eval batch: the last batch is padded


def example(rng):
    x = rng.normal(size=W_TRUE.shape).astype(np.float32)
    return {"x": x, "y": np.float32(x @ W_TRUE)}


def eval_arrays():
    x = np.random.default_rng(99).normal(size=(N_EVAL, W_TRUE.size)).astype(np.float32)
    return {"x": x, "y": x @ W_TRUE}


def init(rng, batch_spec):
    return {"params": {"w": jax.random.normal(rng, (batch_spec["x"].shape[-1],)) * 0.1}}


def mse(params, batch, *, rng, extra):
    del rng, extra
    return jnp.mean((batch["x"] @ params["w"] - batch["y"]) ** 2), {}


def eval_step(state, batch, *, rng):
    del rng
    err_B = batch["x"] @ state.params["w"] - batch["y"]
    mask_B = batch["mask"].astype(jnp.float32)
    return {"mse": (jnp.sum(mask_B * err_B**2), jnp.sum(mask_B))}


def dataset(split, *, shard, seed, batch=8):
    if split == "eval":
        return data.one_pass(eval_arrays(), global_batch=8, shard=shard)
    return data.synthetic(example, global_batch=batch, seed=seed, shard=shard)


def config(steps_=6, **train):
    c = base_config(mesh="auto")
    c.train.steps, c.train.batch_size, c.train.log_every = steps_, 8, 100
    c.train.checkpoint_every, c.train.eval_every = 0, -1
    c.optim.lr = 0.05
    for k, v in train.items():
        c.train[k] = v
    return c


def one():
    return jax.devices()[:1]


def expected_eval_mse(w):
    arrays = eval_arrays()
    return float(np.mean((arrays["x"] @ np.asarray(w) - arrays["y"]) ** 2))


def test_a_step_without_loss_or_optimiser_has_no_optimiser_state(tmp_path):
    def halve(state, batch, *, rng):  # a closed-form-like update that needs no optimiser
        del batch, rng
        return state.replace(params={"w": state.params["w"] * 0.5}), {"loss": jnp.float32(0)}

    method = Method(init=init, step=halve, dataset=dataset)
    result = train.run(config(3), method, str(tmp_path), devices=one())
    assert isinstance(result.state.opt_state, optax.EmptyState)
    start = train.init(config(3), method, devices=one()).state.params["w"]
    np.testing.assert_array_equal(result.state.params["w"], np.asarray(start) * 0.125)


def test_named_optimiser_states_alternate_like_a_gan(tmp_path):
    """Two optimisers, two states, branches on the step's parity: each state counts only the
    steps of its own branch, and each branch moves only its own parameters."""

    def init2(rng, batch_spec):
        return {"params": {"g": jnp.ones(2), "d": jnp.ones(2)}}

    def branch(name, tx):
        def step(state, batch, *, rng):
            del batch, rng
            grads = {k: jnp.ones(2) * (k == name) for k in state.params}
            updates, opt = tx.update(grads, state.opt_state, state.params)
            params = optax.apply_updates(state.params, updates)
            return state.replace(params=params, opt_state=opt), {f"{name}_step": jnp.float32(1)}

        return step

    txs = {"g": optax.adam(0.1), "d": optax.adam(0.1)}
    step = steps.switch(
        [branch("g", txs["g"]), branch("d", txs["d"])],
        lambda state: state.step % 2,
        opt_keys=("g", "d"),
    )
    result = train.run(config(5), Method(init2, step=step, tx=txs, dataset=dataset), str(tmp_path))
    counts = {k: int(s[0].count) for k, s in result.state.opt_state.items()}
    assert counts == {"g": 3, "d": 2}
    assert [r["branch"] for r in result.history] == [0, 1, 0, 1, 0]
    assert "d_step" not in result.history[0]  # the other branch's NaN-padded metric is left out
    # Adam's first steps move each parameter by ~lr per step of its own branch.
    np.testing.assert_allclose(result.state.params["g"], 1 - 0.1 * 3, atol=1e-3)
    np.testing.assert_allclose(result.state.params["d"], 1 - 0.1 * 2, atol=1e-3)


@pytest.mark.parametrize("reset", [True, False])
def test_switch_resets_the_optimiser_at_each_branch_start(tmp_path, reset):
    tx = optax.adam(0.1)
    lengths = [2, 3]
    step = steps.switch(
        [steps.gradient_step(mse, tx)] * 3,
        steps.by_step(lengths),
        reset=steps.at_branch_start(lengths) if reset else None,
        tx=tx,
    )
    result = train.run(config(7), Method(init, step=step, tx=tx, dataset=dataset), str(tmp_path))
    assert [r["branch"] for r in result.history] == [0, 0, 1, 1, 1, 2, 2]
    # Adam's count: with resets it restarted at step 5 (2 steps of the last branch since).
    assert int(result.state.opt_state[0].count) == (2 if reset else 7)


def test_switch_rejects_mismatched_options():
    with pytest.raises(ConfigError, match="2 opt_keys for 1 branches"):
        steps.switch([steps.gradient_step(mse, optax.sgd(1))], lambda s: 0, opt_keys=("a", "b"))
    with pytest.raises(ConfigError, match="reset needs tx"):
        steps.switch([steps.gradient_step(mse, optax.sgd(1))], lambda s: 0, reset=lambda s: True)


def hooked_method():
    """Branch chosen on the host every 3 steps from the parameters (a surrogate's decision),
    the host also shrinking the weights: both live in the state."""
    tx = optax.sgd(0.05)

    def init_b(rng, batch_spec):
        return {**init(rng, batch_spec), "branch": jnp.int32(0)}

    def hook(state, *, step):
        if step % 3:
            return None
        w = np.asarray(state.params["w"])
        branch = np.int32(w.sum() > 0.4)
        return state.replace(params={"w": w * 0.9}, extra={"branch": branch})

    def fast(params, batch, *, rng, extra):
        value, metrics = mse(params, batch, rng=rng, extra=extra)
        return 3 * value, metrics

    step = steps.switch(
        [steps.gradient_step(mse, tx), steps.gradient_step(fast, tx)], steps.from_extra("branch")
    )
    return Method(init_b, step=step, tx=tx, dataset=dataset, hook=hook)


def test_a_host_hook_changes_the_state_and_a_resumed_run_repeats_it_bitwise(tmp_path):
    c = config(12, checkpoint_every=4, keep_checkpoints=5)
    whole = train.run(c, hooked_method(), str(tmp_path / "whole"), devices=one())
    assert {r["branch"] for r in whole.history} == {0, 1}  # the host really switched
    run_dir = tmp_path / "killed"
    train.run(c, hooked_method(), str(run_dir), devices=one())
    for lost in ("8", "12"):  # as if killed after step 4's checkpoint
        shutil.rmtree(run_dir / "checkpoints" / lost)
    resumed = train.run(c, hooked_method(), str(run_dir), devices=one())
    assert int(resumed.state.step) == 12
    for a, b in zip(jax.tree.leaves(resumed.state), jax.tree.leaves(whole.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_hook_may_not_change_the_state_structure(tmp_path):
    def bad(state, *, step):
        return state.replace(params={"w": state.params["w"], "new": jnp.zeros(1)})

    method = Method(init, loss=mse, dataset=dataset, hook=bad)
    with pytest.raises(ConfigError, match="structure differs"):
        train.run(config(2), method, str(tmp_path), devices=one())


def test_eval_step_on_eight_devices_equals_one_device_and_skips_padding(tmp_path):
    method = Method(init, loss=mse, dataset=dataset, eval_step=eval_step)
    c1 = config(4, eval_every=2)
    one_dev = train.run(c1, method, str(tmp_path / "one"), devices=one())
    eight = train.run(config(4, eval_every=2), method, str(tmp_path / "eight"))
    evals1 = [r["eval/mse"] for r in one_dev.history if "eval/mse" in r]
    evals8 = [r["eval/mse"] for r in eight.history if "eval/mse" in r]
    assert len(evals1) == 2
    # Float32 sums over 13 rows added per device then across devices (another order): last-bit
    # differences, ~1e-7 relative; 1e-5 leaves room. Counting a padded row would change the
    # mean by ~1/13.
    np.testing.assert_allclose(evals8, evals1, rtol=1e-5)
    np.testing.assert_allclose(evals1[-1], expected_eval_mse(one_dev.state.params["w"]), rtol=1e-5)


def test_a_method_that_trains_nothing_is_evaluated_once(tmp_path):
    def fixed(rng, batch_spec):
        return {"params": {"w": np.asarray(W_TRUE * 0.5)}}

    method = Method(fixed, dataset=dataset, eval_step=eval_step)
    result = train.run(config(), method, str(tmp_path))
    assert [r["step"] for r in result.history] == [0]
    np.testing.assert_allclose(
        result.history[0]["eval/mse"], expected_eval_mse(W_TRUE * 0.5), rtol=1e-5
    )
    with pytest.raises(ConfigError, match="no loss, no step and no evaluation"):
        train.run(config(), Method(fixed, dataset=dataset), str(tmp_path / "x"))


def test_host_arrays_from_init_are_placed_not_compiled_in():
    """Pretrained-like numpy params (256 x 256 float32, 256 KiB) come back bitwise, FSDP-sharded
    over 8 devices; the init program takes them as arguments (its text stays small, while a
    constant would be printed as 512 KiB of hex)."""
    weights = np.random.default_rng(0).normal(size=(256, 256)).astype(np.float32)

    def pretrained(rng, batch_spec):
        return {"params": {"w": weights, "b": jax.random.normal(rng, (4,))}}

    c = config()
    c.mesh.shape = (1, 8, 1)
    method = Method(pretrained, loss=mse, dataset=dataset)
    session = train.init(c, method)
    np.testing.assert_array_equal(np.asarray(session.state.params["w"]), weights)
    assert "fsdp" in str(session.state.params["w"].sharding.spec)
    spec = {"x": jax.ShapeDtypeStruct((8, 4), np.float32)}
    make_state = train.make_state_fn(method, optax.sgd(0.1), spec)
    rng = np.asarray(jax.random.PRNGKey(0))
    concrete = train.host_leaves(make_state, rng)
    host = [x for x in concrete if x is not None]
    assert len(host) == 1 and host[0] is weights
    text = jax.jit(train.with_host_leaves(make_state, concrete)).lower(rng, host).as_text()
    assert len(text) < 100_000, len(text)


def test_init_from_takes_another_runs_params_into_a_new_layout(tmp_path):
    source = train.run(
        config(5, checkpoint_every=5), Method(init, loss=mse, dataset=dataset), str(tmp_path / "a")
    ).state
    c = config()
    c.train.init_from = str(tmp_path / "a")
    c.mesh.shape = (1, 8, 1)
    scorer = Method(init, dataset=dataset, eval_step=eval_step)  # scores the other run's weights
    result = train.run(c, scorer, str(tmp_path / "b"))
    np.testing.assert_array_equal(
        np.asarray(result.state.params["w"]), np.asarray(source.params["w"])
    )
    np.testing.assert_allclose(
        result.history[0]["eval/mse"], expected_eval_mse(source.params["w"]), rtol=1e-5
    )
    c.train.init_from = str(tmp_path / "missing")
    with pytest.raises(ConfigError, match="no checkpoint folder"):
        train.run(c, scorer, str(tmp_path / "c"))
