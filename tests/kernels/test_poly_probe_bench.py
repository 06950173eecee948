"""core/kernels/poly_probe/bench.py's smoke report, checked in detail.

tests/test_bench.py's smoke test runs the benchmark (`launch.bench --smoke`) and, after its
generic checks, calls `check_bench` here (found by this file's name: tests/bench_checks.py)."""

from tests.bench_checks import positive


def check_bench(entry: dict) -> None:
    """`entry`: the benchmark's record in the report (its ratios, details and notes)."""
    check_poly_probe(entry["details"])


def check_poly_probe(d: dict) -> None:
    assert (d["B"], d["N"]) == (64, 3)
    assert [(r["D"], r["R"]) for r in d["shapes"]] == [(16, 2), (16, 4)]
    for r in d["shapes"]:
        s = r["seconds"]
        assert set(s) == {"op", "one_matmul", "order_by_order", "per_truncation", "matmul"}
        assert all(positive(v) for v in s.values())
        assert r["C"] == 1 + 2 * r["R"] and r["flops"] == 2 * 64 * 16 * r["C"]
        assert r["examples_per_second"] == {name: 64 / v for name, v in s.items()}
        # What each variant computes: the same Y, from 2, N (one per order) and N (N + 1) / 2
        # matmuls (the per-truncation recompute is not merged away by XLA's CSE); the op at
        # these ranks (< PER_ORDER_MIN_RANK) takes the one-matmul form.
        assert r["hlo_dots"] == {
            "op": 2,
            "one_matmul": 2,
            "order_by_order": 3,
            "per_truncation": 6,
            "matmul": 1,
        }
        # float32 sums of the same products in another order: ~1e-6 relative rounding.
        assert max(r["max_abs_diff_vs_op"].values()) <= 1e-5 * max(1.0, r["max_abs_op"])
