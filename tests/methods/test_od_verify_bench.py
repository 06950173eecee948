"""methods/od_verify/bench.py's smoke report, checked in detail.

tests/test_bench.py's smoke test runs the benchmark (`launch.bench --smoke`) and, after its
generic checks, calls `check_bench` here (found by this file's name: tests/bench_checks.py)."""

import math

from tests.bench_checks import positive


def check_bench(entry: dict) -> None:
    """`entry`: the benchmark's record in the report (its ratios, details and notes)."""
    d = entry["details"]
    for key in ("vectorised_seconds", "loop_seconds"):
        assert positive(d[key]), key
    parts = d["parts"]
    assert positive(parts["part1"]) and parts["part3_sampling"] >= 0
    assert parts["exact_search_solver"] >= 0
    assert set(parts["statuses"]) <= {"safe", "unsafe", "unknown"}
    assert len(parts["decided_by"]) == len(parts["statuses"])
    # The counts are the formulas' at the smoke detector's output size (64 cells x 6 numbers).
    assert d["output_dim"] == 6 * 64
    ci = d["counts"]["ci"]
    assert ci["rcp_n"] == math.ceil(40 * (math.log(20) + 6 * 64))
    assert ci["odpv"] == 2000 + 270 + 2 * 10 + 500
