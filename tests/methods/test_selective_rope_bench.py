"""methods/selective_rope/bench.py's smoke report, checked in detail.

tests/test_bench.py's smoke test runs the benchmark (`launch.bench --smoke`) and, after its
generic checks, calls `check_bench` here (found by this file's name: tests/bench_checks.py)."""

from tests.bench_checks import positive


def check_bench(entry: dict) -> None:
    """`entry`: the benchmark's record in the report (its ratios, details and notes)."""
    check_selective_rope(entry["details"])


def check_selective_rope(d: dict) -> None:
    assert d["sizes"] == {"B": 2, "T": 8}
    assert set(d["seconds_per_step"]) == {"gla", "transformer"}
    for s in d["seconds_per_step"].values():
        assert positive(s["rope"]) and positive(s["selective"])
