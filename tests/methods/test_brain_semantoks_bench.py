"""methods/brain_semantoks/bench.py's smoke report, checked in detail.

tests/test_bench.py's smoke test runs the benchmark (`launch.bench --smoke`) and, after its
generic checks, calls `check_bench` here (found by this file's name: tests/bench_checks.py)."""

from tests.bench_checks import positive


def check_bench(entry: dict) -> None:
    """`entry`: the benchmark's record in the report (its ratios, details and notes)."""
    d = entry["details"]
    for key in ("step_seconds", "scans_per_second", "tokenizer_seconds", "windows_seconds"):
        assert positive(d[key]), key
    assert abs(d["scans_per_second"] * d["step_seconds"] - d["batch_scans"]) < 1e-6
    # Both formulations were timed on the same views (and checked equal before timing).
    assert d["windows_over_toeplitz"] == d["windows_seconds"] / d["tokenizer_seconds"]
    assert any("torch" in n for n in entry["notes"])
