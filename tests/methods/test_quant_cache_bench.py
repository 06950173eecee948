"""methods/quant_cache/bench.py's smoke report, checked in detail.

tests/test_bench.py's smoke test runs the benchmark (`launch.bench --smoke`) and, after its
generic checks, calls `check_bench` here (found by this file's name: tests/bench_checks.py)."""


def check_bench(entry: dict) -> None:
    """`entry`: the benchmark's record in the report (its ratios, details and notes)."""
    d = entry["details"]
    assert set(d["seconds"]) == {"fp", "c2", "w4a8+c2", "w8a8 int8"}
    assert all(s > 0 for s in d["seconds"].values())
    # The accounting: W4A8 + cache needs far fewer bit operations than full precision (at
    # least the 32 x 32 / (4 x 8) = 32x of the quantised layers, diluted by the float ones).
    assert d["bops"]["fp"] > 4 * d["bops"]["w4a8+c2"] > 0
    assert any("int8 speed" in note for note in entry["notes"])
