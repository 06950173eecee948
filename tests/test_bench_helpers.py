"""The benchmarks' own pieces: the baselines compute what they stand in for (a Python-loop decode
draws the sampler's tokens, the NumPy DEQL solve equals the JAX one), the CSNN graphs and layers
are the ones the docstring names, and the core's timing and table helpers."""

import dataclasses

import jax
import numpy as np
import pytest

from core import benchmark
from core.nn import sampler
from methods.csnn import bench as csnn_bench
from methods.csnn import data as csnn_data
from methods.deql import bench as deql_bench
from methods.deql import solvers
from methods.rlcr import bench as rlcr_bench

# ------------------------------------------------------------------ core.benchmark


def test_median_seconds_warms_up_then_times_each_repeat():
    calls = []
    seconds = benchmark.median_seconds(lambda: calls.append(1), 5, warmup=2)
    assert len(calls) == 7 and 0 <= seconds < 1
    with pytest.raises(ValueError, match="repeats"):
        benchmark.median_seconds(lambda: None, 0)


def test_table_has_a_row_per_ratio_and_flags_a_busy_host():
    start = {**benchmark.machine(), "host_cpu_count": 2, "load_avg_1m": 0.5}
    result = benchmark.Result(
        [
            benchmark.Ratio("fwd", "fused", 0.002, "reference", 0.004, "s"),
            benchmark.Ratio("rate", "jit", 3.0e6, "loop", 1.5e6, "tokens/s"),
        ],
        notes=["kernel NOT measured"],
    )
    table = benchmark.markdown({"x": result}, start, load_after=5.0)
    assert "| x | fwd | fused: 2 ms | reference: 4 ms | 0.5 |" in table
    assert "| x | rate | jit: 3 Mtokens/s | loop: 1.5 Mtokens/s | 2 |" in table
    assert "- x: kernel NOT measured" in table and "host busy (load 5.0 on 2 CPUs)" in table
    quiet = benchmark.markdown({"x": result}, start, load_after=1.0)
    assert "host busy" not in quiet


# ------------------------------------------------------------------ csnn


def test_csnn_side_gives_the_nearest_king_grid():
    for side in (2, 5, 36, 113):
        exact_E = len(csnn_data.undirected(csnn_data.grid_king_edges(side), side * side)[0])
        assert csnn_bench.king_directed_edges(side) == exact_E
    for target_E in (500, 2000, *csnn_bench.SIZES):
        side = csnn_bench.side_for_edges(target_E)
        gap = abs(csnn_bench.king_directed_edges(side) - target_E)
        assert all(gap <= abs(csnn_bench.king_directed_edges(s) - target_E) for s in range(2, 400))


def test_csnn_layers_take_and_return_the_stated_shapes():
    n, edges = csnn_bench.graph(500)
    per_model = csnn_bench.inputs(n, jax.random.key(1))
    csnn_fn, gcn_fn = csnn_bench.layer_fns()
    layer, x_NDC = per_model["csnn"]
    assert x_NDC.shape == (n, 3, 32) and len(layer["phi_t"]["layers"]) == 2
    assert layer["phi_t"]["layers"][0]["w"].shape == (96, 64)  # MLP learner on vec x_i
    out_NDC = csnn_fn(layer, x_NDC, edges)
    assert out_NDC.shape == (n, 3, 32) and np.isfinite(np.asarray(out_NDC)).all()
    layer, x_NC = per_model["gcn"]
    assert x_NC.shape == (n, 96) and layer["w"].shape == (96, 96)
    out_NC = gcn_fn(layer, x_NC, edges)
    assert out_NC.shape == (n, 96) and np.isfinite(np.asarray(out_NC)).all()


# ------------------------------------------------------------------ deql


def test_deql_numpy_baseline_is_the_same_algorithm():
    K = deql_bench.synthetic_gram(60, density=0.1)
    W = deql_bench.numpy_deql(K, **deql_bench.HP)
    W_jax = np.asarray(solvers.deql(K, **deql_bench.HP))
    # Both float64 from the same Cholesky-based formula; rounding of a 60 x 60 solve (~1e-15).
    np.testing.assert_allclose(W, W_jax, rtol=0, atol=1e-9 * np.abs(W_jax).max())


def test_deql_slope_of_exact_cubic_is_three():
    rows = [{"n": n, "t": 1e-9 * n**3} for n in (500, 1000, 2000)]
    assert abs(deql_bench.slope(rows, "t") - 3) < 1e-9  # exact power law, float rounding only


# ------------------------------------------------------------------ rlcr

NEW_TOKENS = 3


@pytest.fixture(scope="module")
def tiny():
    return rlcr_bench.setup("smoke", prompts=4, group=4)


def _both(s, eos_id):
    prompt_RP, prompt_mask_RP = rlcr_bench.group_prompts(s)
    cfg = dataclasses.replace(s.cfg, max_len=prompt_RP.shape[1] + NEW_TOKENS)
    kw = dict(rng=jax.random.key(3), max_new_tokens=NEW_TOKENS, temperature=0.0, eos_id=eos_id)
    out = sampler.sample(cfg, s.params, prompt_RP, prompt_mask_BP=prompt_mask_RP, **kw)
    tokens_RN, mask_RN = rlcr_bench.python_loop_decode(
        cfg, s.params, prompt_RP, prompt_mask_RP, **kw
    )
    return out, np.asarray(tokens_RN), np.asarray(mask_RN)


def test_rlcr_python_loop_matches_sampler_greedy(tiny):
    out, tokens_RN, mask_RN = _both(tiny, eos_id=None)
    np.testing.assert_array_equal(tokens_RN, out.tokens_BN)
    np.testing.assert_array_equal(mask_RN, out.mask_BN)
    assert mask_RN.sum() == out.lengths_B.sum() == tokens_RN.size  # no eos: every row full


def test_rlcr_python_loop_matches_sampler_with_eos(tiny):
    # Random params rarely emit the task's eos; take as eos the token row 0 emits second, so
    # some rows stop early and the pad/mask handling after eos is compared too.
    first, _, _ = _both(tiny, eos_id=None)
    eos_id = int(first.tokens_BN[0, 1])
    out, tokens_RN, mask_RN = _both(tiny, eos_id=eos_id)
    np.testing.assert_array_equal(tokens_RN, out.tokens_BN)
    np.testing.assert_array_equal(mask_RN, out.mask_BN)
    assert out.lengths_B.min() < NEW_TOKENS
