"""Named evaluation streams (`core.Evaluator`), data-free methods and `needs_init_from` through
`core.train`: each stream at its own interval on its own split, the same numbers on 8 devices
as on one, and every misdeclared stream refused before anything is written."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core import data, train
from core.errors import ConfigError
from core.method import Evaluator, Method
from tests.core.test_protocol import W_TRUE, config, example, init, mse, one

SIZES = {"short": 13, "long": 21}  # neither a multiple of the batch: the last one is padded


def split_arrays(split):
    x = np.random.default_rng(SIZES[split]).normal(size=(SIZES[split], 4)).astype(np.float32)
    return {"x": x, "y": x @ W_TRUE}


def dataset(split, *, shard, seed):
    if split in SIZES:
        return data.one_pass(split_arrays(split), global_batch=8, shard=shard)
    if split == "train":
        return data.synthetic(example, global_batch=8, seed=seed, shard=shard)
    raise KeyError(split)


def sq_error(state, batch, *, rng):
    err_B = batch["x"] @ state.params["w"] - batch["y"]
    mask_B = batch["mask"].astype(jnp.float32)
    return {"mse": (jnp.sum(mask_B * err_B**2), jnp.sum(mask_B))}


def w_norm(state, *, seed):  # a host evaluation: what cannot be a sum over batches
    return {"w_norm": float(np.linalg.norm(np.asarray(state.params["w"])))}


def mse_of(w, split):
    arrays = split_arrays(split)
    return float(np.mean((arrays["x"] @ np.asarray(w) - arrays["y"]) ** 2))


STREAMS = (
    Evaluator("short", sq_error, split="short", every=2),
    Evaluator("long", sq_error, w_norm, split="long"),  # train.eval_every: at the end
)


def test_named_streams_run_at_their_intervals_and_eight_devices_equal_one(tmp_path):
    method = Method(init, loss=mse, dataset=dataset, evaluators=STREAMS)
    one_dev = train.run(config(5, eval_every=0), method, str(tmp_path / "one"), devices=one())
    eight = train.run(config(5, eval_every=0), method, str(tmp_path / "eight"))
    evals = {r["step"]: r for r in one_dev.history if any(k.startswith("eval/") for k in r)}
    assert sorted(evals) == [2, 4, 5]
    assert set(evals[2]) == set(evals[4]) == {"step", "eval/short/mse"}
    assert set(evals[5]) == {"step", "eval/short/mse", "eval/long/mse", "eval/long/w_norm"}
    w = one_dev.state.params["w"]
    # float32 sums of 13 / 21 rows against a float64 NumPy mean: ~1e-7 relative; 1e-5 leaves
    # room. Counting a padded row or reading the other split would be off by > 5 %.
    np.testing.assert_allclose(evals[5]["eval/short/mse"], mse_of(w, "short"), rtol=1e-5)
    np.testing.assert_allclose(evals[5]["eval/long/mse"], mse_of(w, "long"), rtol=1e-5)
    rows8 = [r for r in eight.history if "eval/long/mse" in r or "eval/short/mse" in r]
    rows1 = [r for r in one_dev.history if "eval/long/mse" in r or "eval/short/mse" in r]
    assert [sorted(r) for r in rows8] == [sorted(r) for r in rows1]
    for r8, r1 in zip(rows8, rows1, strict=True):
        # The same sums added per device, then across devices: last-bit differences only.
        np.testing.assert_allclose([r8[k] for k in sorted(r8)], [r1[k] for k in sorted(r1)], 1e-5)


@pytest.mark.parametrize(
    "streams, message",
    [
        ((Evaluator("test", sq_error, split="test"),), "evaluator 'test' reads dataset"),
        ((Evaluator("a", sq_error, split="short"),) * 2, "two evaluators are named 'a'"),
        ((Evaluator("a b", sq_error, split="short"),), "evaluator name 'a b'"),
        ((Evaluator("empty"),), "has neither eval_step nor evaluate"),
    ],
)
def test_a_misdeclared_stream_is_one_line_before_anything_is_written(tmp_path, streams, message):
    method = Method(init, loss=mse, dataset=dataset, evaluators=streams)
    with pytest.raises(ConfigError, match=message) as e:
        train.run(config(2), method, str(tmp_path / "w"), devices=one())
    assert "\n" not in str(e.value)
    assert not (tmp_path / "w").exists()


def roll(state, batch, *, rng):
    """A data-free step: it draws its own data (a known linear map) from the step's key."""
    assert batch is None
    x_BD = jax.random.normal(rng, (16, 4))
    grad = 2 * x_BD.T @ (x_BD @ state.params["w"] - x_BD @ W_TRUE) / 16
    return state.replace(params={"w": state.params["w"] - 0.1 * grad}), {"loss": jnp.sum(grad**2)}


def fixed_init(rng, batch_spec):
    assert batch_spec is None
    return {"params": {"w": jnp.zeros(4)}}


def test_a_data_free_method_trains_resumes_bitwise_and_is_evaluated(tmp_path):
    streams = (Evaluator("fit", evaluate=w_norm),)
    method = Method(fixed_init, step=roll, evaluators=streams)
    c = config(40, eval_every=0)  # its train.batch_size is not read: there is no dataset
    whole = train.run(c, method, str(tmp_path / "whole"), devices=one())
    assert whole.history[-1]["eval/fit/w_norm"] == pytest.approx(np.linalg.norm(W_TRUE), 1e-3)
    half = config(20, eval_every=0, checkpoint_every=20)
    train.run(half, method, str(tmp_path / "split"), devices=one())
    resumed = train.run(c, method, str(tmp_path / "split"), devices=one(), allow_config_change=True)
    np.testing.assert_array_equal(resumed.state.params["w"], whole.state.params["w"])


def test_needs_init_from_is_refused_without_it_before_anything_is_written(tmp_path):
    scorer = Method(init, dataset=dataset, evaluators=STREAMS[1:], needs_init_from=True)
    c = config()
    c.method = "scorer"
    with pytest.raises(ConfigError, match="scorer: evaluates another run's parameters"):
        train.run(c, scorer, str(tmp_path / "w"), devices=one())
    assert not (tmp_path / "w").exists()
