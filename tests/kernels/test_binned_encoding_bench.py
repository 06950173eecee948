"""core/kernels/binned_encoding/bench.py's smoke report, checked in detail.

tests/test_bench.py's smoke test runs the benchmark (`launch.bench --smoke`) and, after its
generic checks, calls `check_bench` here (found by this file's name: tests/bench_checks.py)."""

from tests.bench_checks import positive


def check_bench(entry: dict) -> None:
    """`entry`: the benchmark's record in the report (its ratios, details and notes)."""
    check_binned_encoding(entry["details"])


def check_binned_encoding(d: dict) -> None:
    for impl in ("xla", "tiled", "interpret"):
        for name in ("fwd", "fwd_bwd"):
            assert positive(d[f"{impl}_{name}_seconds"])
    assert d["features_bytes"] == 16 * 16 * 20 * 4  # N x M float32 at the smoke size
