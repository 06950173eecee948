"""core/kernels/selective_rotary/bench.py's smoke report, checked in detail.

tests/test_bench.py's smoke test runs the benchmark (`launch.bench --smoke`) and, after its
generic checks, calls `check_bench` here (found by this file's name: tests/bench_checks.py)."""

from tests.bench_checks import positive


def check_bench(entry: dict) -> None:
    """`entry`: the benchmark's record in the report (its ratios, details and notes)."""
    check_selective_rotary(entry["details"])
    # Each figure is the selective op's time over RoPE's, from the details' seconds.
    s = entry["details"]["seconds"]
    assert [(r["a"], r["b"]) for r in entry["ratios"]] == [
        (s["selective_fwd"], s["rope_fwd"]),
        (s["selective_fwd_bwd"], s["rope_fwd_bwd"]),
    ]


def check_selective_rotary(d: dict) -> None:
    s = d["seconds"]
    assert set(s) == {"rope_fwd", "selective_fwd", "rope_fwd_bwd", "selective_fwd_bwd"}
    assert all(positive(v) for v in s.values())
    assert d["sizes"] == {"B": 1, "T": 16, "H": 2, "K": 8, "dtype": "float32"}
    # q, k read and written (4 x B T H K float32) plus phi read (B T H K/2 float32).
    assert d["selective_fwd_min_bytes"] == 4 * (1 * 16 * 2 * 8) * 4 + (1 * 16 * 2 * 4) * 4
