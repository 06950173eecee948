"""methods/tpc/bench.py's smoke report, checked in detail.

tests/test_bench.py's smoke test runs the benchmark (`launch.bench --smoke`) and, after its
generic checks, calls `check_bench` here (found by this file's name: tests/bench_checks.py)."""

import numpy as np
import pytest


def check_bench(entry: dict) -> None:
    """`entry`: the benchmark's record in the report (its ratios, details and notes)."""
    check_tpc(entry["details"])


def check_tpc(d: dict) -> None:
    from methods.tpc import cascade, model

    (c,) = d["cascade"]
    N, B = c["N"], c["rows"]
    counts_N = model.param_counts(c["D"], N, c["R"])
    assert c["full_params"] == counts_N[-1] and len(c["test_f1_by_order"]) == N
    assert [r["tau"] for r in c["taus"]] == [0.6, 0.9]
    for r in c["taus"]:
        fractions = np.array(r["exit_fraction"])
        assert len(fractions) == N and abs(fractions.sum() - 1) < 1e-9  # float64 sum of N
        assert r["mean_params"] == pytest.approx(float(counts_N @ fractions))
        assert r["cost_fraction"] == r["mean_params"] / counts_N[-1]
        assert 0 < r["cost_fraction"] <= 1 and 0 < r["work_fraction_padded"] <= 1
        assert r["mean_exit_order"] == pytest.approx(float(np.arange(1, N + 1) @ fractions))
        # Stage k sees the rows that have not exited before k, padded up to a bucket.
        remaining = [B - round(B * fractions[: k - 1].sum()) for k in range(1, N + 1)]
        assert r["stage_rows"] == remaining
        assert r["stage_bucket_rows"][0] == B
        for n, computed in zip(r["stage_rows"][1:], r["stage_bucket_rows"][1:], strict=True):
            assert computed == (cascade.bucket(n, B) if n else 0) and computed >= n
        assert r["full_seconds"] == c["full_seconds"] > 0 and r["cascade_seconds"] > 0
        assert r["time_ratio_cascade_over_full"] == r["cascade_seconds"] / r["full_seconds"]
