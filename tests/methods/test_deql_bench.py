"""methods/deql/bench.py's smoke report, checked in detail.

tests/test_bench.py's smoke test runs the benchmark (`launch.bench --smoke`) and, after its
generic checks, calls `check_bench` here (found by this file's name: tests/bench_checks.py)."""

import math

from tests.bench_checks import positive


def check_bench(entry: dict) -> None:
    """`entry`: the benchmark's record in the report (its ratios, details and notes)."""
    check_deql(entry["details"])


def check_deql(d: dict) -> None:
    assert [r["n"] for r in d["rows"]] == [40, 80]
    for r in d["rows"]:
        assert all(positive(r[k]) for k in ("jax_seconds", "numpy_seconds", "numpy_over_jax"))
        # Both float64 from the same Cholesky-based formula: rounding of an 80 x 80 solve.
        assert r["max_abs_diff"] <= 1e-9 * r["max_abs_w"]
    assert all(math.isfinite(v) for v in d["fits"].values())
