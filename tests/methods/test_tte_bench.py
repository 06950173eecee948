"""methods/tte/bench.py's smoke report, checked in detail (called by tests/test_bench.py's smoke
test after its generic checks; found by this file's name: tests/bench_checks.py)."""

from tests.bench_checks import positive


def check_bench(entry: dict) -> None:
    """`entry`: the benchmark's record in the report (its ratios, details and notes)."""
    d = entry["details"]
    assert set(d["step_seconds"]) == {"plain", "grad_cache"}
    assert all(positive(s) for s in d["step_seconds"].values())
    for name, by_batch in d["temp_mib"].items():
        sizes = sorted(by_batch, key=int)
        assert sizes and all(positive(by_batch[n]) for n in sizes), name
        # the largest batch reported is the largest measured one within the budget
        within = [int(n) for n in sizes if by_batch[n] <= d["budget_mib"]]
        assert d["largest_batch"][name] == (max(within) if within else 0)
    assert positive(d["decode_tokens_per_s"]) and positive(d["decode_seconds"])
