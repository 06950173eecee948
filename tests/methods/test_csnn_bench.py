"""methods/csnn/bench.py's smoke report, checked in detail.

tests/test_bench.py's smoke test runs the benchmark (`launch.bench --smoke`) and, after its
generic checks, calls `check_bench` here (found by this file's name: tests/bench_checks.py)."""

from tests.bench_checks import positive


def check_bench(entry: dict) -> None:
    """`entry`: the benchmark's record in the report (its ratios, details and notes)."""
    check_csnn(entry["details"])


def check_csnn(d: dict) -> None:
    from methods.csnn import bench as csnn_bench

    rows = d["rows"]
    assert [r["target_edges"] for r in rows] == [500, 2000]
    for r in rows:
        n, edges = csnn_bench.graph(r["target_edges"])
        assert (r["nodes"], r["edges"]) == (n, len(edges.senders_E)) == (n, len(edges.receivers_E))
        numbers = [k for k in r if k.endswith(("_seconds", "_edges_per_s")) or "_over_" in k]
        assert len(numbers) == 12 and all(positive(r[k]) for k in numbers), r
