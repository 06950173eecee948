"""launch.bench_deql at tiny sizes: a complete report, the NumPy/SciPy baseline equal to the JAX
solver (no timing thresholds: the numbers depend on the machine and its load)."""

import math

import numpy as np

from launch import bench_deql as bench
from methods.deql import solvers


def test_numpy_baseline_is_the_same_algorithm():
    K = bench.synthetic_gram(60, density=0.1)
    W = bench.numpy_deql(K, **bench.HP)
    W_jax = np.asarray(solvers.deql(K, **bench.HP))
    # Both float64 from the same Cholesky-based formula; rounding of a 60 x 60 solve (~1e-15).
    np.testing.assert_allclose(W, W_jax, rtol=0, atol=1e-9 * np.abs(W_jax).max())


def test_report_is_complete(tmp_path):
    rows = bench.measure(sizes=(40, 80), repeats=1)
    assert [r["n"] for r in rows] == [40, 80]
    for r in rows:
        for key in ("jax_seconds", "numpy_seconds", "numpy_over_jax"):
            assert math.isfinite(r[key]) and r[key] > 0
        assert r["max_abs_diff"] <= 1e-9 * r["max_abs_w"]  # float64 rounding (see above)
    fits = bench.summary(rows)
    assert all(math.isfinite(v) for v in fits.values())
    lines = bench.report_lines(rows, fits)
    assert sum(line.startswith("| 40 |") or line.startswith("| 80 |") for line in lines) == 2
    assert any("log-log slope" in line for line in lines)
    bench.plot(rows, str(tmp_path / "curve.png"))
    assert (tmp_path / "curve.png").stat().st_size > 1000


def test_slope_of_exact_cubic_is_three():
    rows = [{"n": n, "t": 1e-9 * n**3} for n in (500, 1000, 2000)]
    assert abs(bench.slope(rows, "t") - 3) < 1e-9  # exact power law, float rounding only
