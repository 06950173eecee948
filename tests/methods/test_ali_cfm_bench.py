"""methods/ali_cfm/bench.py: its jitted Sinkhorn (uniform marginals; the exact permutation's
argmax on a well-separated case), its smoke report checked in detail, and the official PyTorch
GAN and CFM steps on our weights equal to ours (only where ALI_CFM_OFFICIAL names a checkout of
the official code and ALI_CFM_TORCH_PYTHON, or this interpreter, imports torch).

tests/test_bench.py's smoke test runs the benchmark (`launch.bench --smoke`) and, after its
generic checks, calls `check_bench` here (found by this file's name: tests/bench_checks.py)."""

import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from core import ot
from methods.ali_cfm import bench
from tests.bench_checks import positive


def check_bench(entry: dict) -> None:
    """`entry`: the benchmark's record in the report (its ratios, details and notes)."""
    d = entry["details"]
    datasets = [ds for ds in bench.DATASETS if ds in d]
    assert datasets == (["trimodal"] if d["size"] == "smoke" else list(bench.DATASETS))
    by_figure = {r["figure"]: r for r in entry["ratios"]}
    for ds in datasets:
        r = d[ds]
        for key in ("gan_step_s", "cfm_step_s", "otcfm_step_s", "batch_s", "draw_s", "chain_s",
                    "exact_pair_s", "sinkhorn_pair_s"):  # fmt: skip
            assert positive(r[key]), (ds, key)
        assert 0 <= r["sinkhorn_agreement"] <= 1 and r["sinkhorn_row_error"] >= 0
        batch = by_figure[f"{ds}: host batch (draws + OT chain) / jitted GAN step, B={r['batch']}"]
        assert (batch["a"], batch["b"]) == (r["batch_s"], r["gan_step_s"])
        assert len(r["ours"]["d_loss"]) == bench.CHECKED_STEPS
        if "import_error" in r["theirs"]:
            assert any(n.startswith(f"{ds}: official PyTorch comparison skipped")
                       for n in entry["notes"])  # fmt: skip
        else:  # the official steps ran, and their losses matched ours before any timing
            for stage in ("gan", "cfm"):  # set against the official's faster thread count
                threads, seconds = r[f"official_{stage}"]
                assert seconds == min(t[stage] for t in r["theirs"]["seconds"].values())
                assert r["theirs"]["seconds"][str(threads)][stage] == seconds
                assert r[f"{stage}_speedup"] == seconds / r[f"{stage}_step_s"]
            gan = [f for f in by_figure if f.startswith(f"{ds}: GAN step throughput")]
            assert len(gan) == 1 and by_figure[gan[0]]["ratio"] == pytest.approx(r["gan_speedup"])


# ------------------------------------------------------------------ the jitted Sinkhorn


def test_sinkhorn_plan_has_uniform_marginals():
    """64 uniform points in [0, 1]^2 each side, eps 0.05: the last sweep sets the columns to
    1/M, and at this eps the rows converge well within 200 sweeps (measured: 7e-7), so both
    marginals are uniform up to float32 rounding of logsumexps over 64 terms (at most about
    64 * 2^-24 = 4e-6 relative): 1e-5. A wrong sweep (a sign, an axis, a missing log-weight)
    is off by O(1)."""
    rng = np.random.default_rng(0)
    x_ND, y_MD = (jnp.asarray(rng.uniform(size=(64, 2)), jnp.float32) for _ in range(2))
    plan_NM = np.asarray(bench.sinkhorn_plan(x_ND, y_MD, eps=0.05, iters=200), np.float64)
    np.testing.assert_allclose(plan_NM.sum(1) * 64, 1, atol=1e-5)
    np.testing.assert_allclose(plan_NM.sum(0) * 64, 1, atol=1e-5)


def test_sinkhorn_argmax_is_the_exact_permutation_when_well_separated():
    """8 points 0.3 apart and a shuffled copy moved by ~0.01: the exact plan is the
    shuffle, and at eps = 0.01 every wrong pairing costs >= 0.3^2 - 2 * 0.3 * 0.03 (~0.07, so
    exp(-7) of the right one's weight): the Sinkhorn argmax is the exact permutation, and the
    plan's mass off it is below 8 * 7 * e^-7 / 64 = 8e-4."""
    grid = np.stack(np.meshgrid(np.arange(3), np.arange(3)), -1).reshape(-1, 2)[:8] * 0.3
    rng = np.random.default_rng(0)
    shuffle = rng.permutation(8)
    x_ND = grid.astype(np.float32)
    y_ND = (grid[shuffle] + rng.normal(0, 0.01, (8, 2))).astype(np.float32)
    exact = ot.exact_coupling(x_ND, y_ND)
    np.testing.assert_array_equal(exact, np.argsort(shuffle))
    x, y = jnp.asarray(x_ND), jnp.asarray(y_ND)
    np.testing.assert_array_equal(np.asarray(bench.sinkhorn_map(x, y)), exact)
    plan_NM = np.asarray(bench.sinkhorn_plan(x, y), np.float64)
    assert 1 - plan_NM[np.arange(8), exact].sum() < 8e-4


# ------------------------------------------------------------------ the official steps


def _official_missing() -> str | None:
    """Why the official comparison cannot run here, or None."""
    checkout = os.environ.get("ALI_CFM_OFFICIAL")
    if not checkout or not os.path.isfile(os.path.join(checkout, "ali_cfm", "nets.py")):
        return "ALI_CFM_OFFICIAL names no checkout of the official code"
    python = os.environ.get("ALI_CFM_TORCH_PYTHON") or sys.executable
    probe = subprocess.run([python, "-c", "import torch"], capture_output=True, check=False)
    return f"{python} cannot import torch" if probe.returncode else None


@pytest.mark.parametrize("dataset", bench.DATASETS)
def test_the_official_losses_equal_ours_on_our_weights(dataset):
    """Both data sets: trimodal (D = 1) checks the official CFM loss against its [B, B]
    broadcast, rotating_gmm both CFM steps against ours; the GAN's D, G, adversarial and
    regulariser losses of two steps each (the second after both Adam updates)."""
    if reason := _official_missing():
        pytest.skip(reason)
    r = bench.measure_dataset("smoke", dataset, repeats=1, host_repeats=1)
    theirs = r["theirs"]
    assert "import_error" not in theirs, theirs
    bench.check_official(r)  # rtol 1e-5: see bench.RTOL
    assert all(t["gan"] > 0 and t["cfm"] > 0 for t in theirs["seconds"].values())
    assert all(len(theirs[k]) == bench.CHECKED_STEPS for k in r["ours"] if k in theirs)
