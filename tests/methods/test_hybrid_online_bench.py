"""methods/hybrid_online/bench.py's smoke report, checked in detail.

tests/test_bench.py's smoke test runs the benchmark (`launch.bench --smoke`) and, after its
generic checks, calls `check_bench` here (found by this file's name: tests/bench_checks.py)."""

import pytest


def check_bench(entry: dict) -> None:
    """`entry`: the benchmark's record in the report (its ratios, details and notes)."""
    check_hybrid_online(entry["details"])


def check_hybrid_online(d: dict) -> None:
    assert d["T"] == 60 and d["sizes"] == [50, 100, 200]
    # the jitted learner and the NumPy reference play the same rounds: same oracle calls and
    # predictions (float64, different summation orders)
    assert d["oracle_calls"] == d["numpy_oracle_calls"]
    assert d["max_prediction_difference"] < 1e-9
    for per_round, per_call, calls in zip(
        d["seconds_per_round"], d["seconds_per_call"], d["calls_per_round"], strict=True
    ):
        assert per_call == pytest.approx(per_round / calls)
