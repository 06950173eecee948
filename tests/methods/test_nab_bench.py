"""methods/nab/bench.py's smoke report, checked in detail.

tests/test_bench.py's smoke test runs the benchmark (`launch.bench --smoke`) and, after its
generic checks, calls `check_bench` here (found by this file's name: tests/bench_checks.py)."""

from tests.bench_checks import positive


def check_bench(entry: dict) -> None:
    """`entry`: the benchmark's record in the report (its ratios, details and notes)."""
    check_nab(entry["details"])


def check_nab(d: dict) -> None:
    rates = d["train"]
    assert set(rates) == {"smoke/nab", "smoke/nab-xla", "smoke/rff"}
    assert all(positive(r["steps_per_second"]) and r["image"] == 16 for r in rates.values())
