"""methods/brain_semantoks/bench.py: its smoke report checked in detail, and the official PyTorch
step on our weights equal to ours (only where torch, einops and a checkout of the official code
are: BRAIN_SEMANTOKS_OFFICIAL).

tests/test_bench.py's smoke test runs the benchmark (`launch.bench --smoke`) and, after its
generic checks, calls `check_bench` here (found by this file's name: tests/bench_checks.py)."""

import os

import jax
import numpy as np
import pytest

from configs import brain_semantoks as bs_config
from core import train
from methods import brain_semantoks as bs
from methods.brain_semantoks import bench
from tests.bench_checks import positive


def check_bench(entry: dict) -> None:
    """`entry`: the benchmark's record in the report (its ratios, details and notes)."""
    d = entry["details"]
    for key in ("step_seconds", "scans_per_second", "tokenizer_seconds", "windows_seconds"):
        assert positive(d[key]), key
    assert abs(d["scans_per_second"] * d["step_seconds"] - d["batch_scans"]) < 1e-6
    # Both formulations were timed on the same views (and checked equal before timing).
    assert d["windows_over_toeplitz"] == d["windows_seconds"] / d["tokenizer_seconds"]
    if "official_over_ours" in d:  # the official step ran, after its outputs matched ours
        assert d["official_over_ours"] == d["official_step_seconds"] / d["step_seconds"]
        assert set(d["checked_equal"]) == {"loss", "cls_loss", "network_loss", "mask_loss",
                                           "grad_norm"}  # fmt: skip
    else:
        assert any("official PyTorch step is not measured" in n for n in entry["notes"])


def test_the_official_loss_and_gradient_equal_ours_on_our_weights():
    if not os.environ.get("BRAIN_SEMANTOKS_OFFICIAL"):
        pytest.skip("BRAIN_SEMANTOKS_OFFICIAL names no checkout of the official code")
    pytest.importorskip("torch")
    pytest.importorskip("einops")
    c = bs_config.get_config("size=smoke")
    c.dtype = "float32"
    state = train.init(c, bs.make(c), devices=jax.devices()[:1]).state
    cfg = bs.model_config(c)
    ours, theirs = bench.official_comparison(c, cfg, state.params, state.extra["buffers"], 1)
    assert theirs["step_seconds"] > 0
    for key, value in ours.items():
        # float32 on both sides, sums and a Cholesky in another order: 1e-4 relative.
        np.testing.assert_allclose(theirs[key], value, rtol=1e-4, err_msg=key)
