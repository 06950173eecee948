"""launch.bench_tpc at tiny sizes: a complete, self-consistent report (no timing thresholds: the
numbers depend on the machine and its load)."""

import json
import math

import numpy as np
import pytest

from launch import bench_tpc as bench
from methods.tpc import cascade, model


@pytest.fixture(scope="module")
def result():
    return {
        "environment": bench.environment(),
        "throughput": bench.throughput(B=64, N=3, dims=(16,), ranks=(2, 4), repeats=1),
        "cascade": [
            bench.cascade_saving(
                D=16, N=3, R=4, train_rows=512, rows=256, epochs=1, taus=(0.6, 0.9), repeats=1
            )
        ],
        "pallas_kernel_accelerator_timing": None,
        "not_measured": bench.NOT_MEASURED,
    }


def test_throughput_report_is_consistent(result):
    t = result["throughput"]
    assert (t["B"], t["N"]) == (64, 3) and [(r["D"], r["R"]) for r in t["shapes"]] == [
        (16, 2),
        (16, 4),
    ]
    for r in t["shapes"]:
        s = r["seconds"]
        assert set(s) == set(bench.VARIANTS)
        assert all(math.isfinite(v) and v > 0 for v in s.values())
        assert r["C"] == 1 + 2 * r["R"] and r["flops"] == 2 * 64 * 16 * r["C"]
        assert r["examples_per_second"] == {name: 64 / v for name, v in s.items()}
        for name in ("one_matmul", "order_by_order", "per_truncation"):
            assert r[f"ratio_{name}_over_op"] == s[name] / s["op"]
        assert r["op_fraction_of_matmul"] == s["matmul"] / s["op"]
        assert r["op_gflops_per_second"] == r["flops"] / s["op"] / 1e9
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
        assert max(r["max_abs_diff_vs_op"].values()) <= 1e-5 * max(1.0, r["max_abs_op"])


def test_cascade_report_is_consistent(result):
    (c,) = result["cascade"]
    N, B = c["N"], c["rows"]
    counts_N = model.param_counts(c["D"], N, c["R"])
    assert c["full_params"] == counts_N[-1] and len(c["test_f1_by_order"]) == N
    assert [r["tau"] for r in c["taus"]] == [0.6, 0.9]
    for r in c["taus"]:
        fractions = np.array(r["exit_fraction"])
        assert len(fractions) == N and abs(fractions.sum() - 1) < 1e-9
        assert r["mean_params"] == pytest.approx(float(counts_N @ fractions))
        assert r["cost_fraction"] == r["mean_params"] / counts_N[-1]
        assert 0 < r["cost_fraction"] <= 1 and 0 < r["work_fraction_padded"] <= 1
        assert r["mean_exit_order"] == pytest.approx(float(np.arange(1, N + 1) @ fractions))
        # Stage k sees the rows that have not exited before k, padded up to a bucket.
        remaining = [B - round(B * fractions[: k - 1].sum()) for k in range(1, N + 1)]
        assert r["stage_rows"] == remaining
        assert r["stage_bucket_rows"][0] == B
        for n, computed in zip(r["stage_rows"][1:], r["stage_bucket_rows"][1:], strict=True):
            assert computed == (cascade.bucket(n, B) if n else 0) and computed >= n
        assert r["full_seconds"] == c["full_seconds"] > 0 and r["cascade_seconds"] > 0
        assert r["time_ratio_cascade_over_full"] == r["cascade_seconds"] / r["full_seconds"]


def test_report_lines_and_json(result, tmp_path):
    lines = bench.report_lines(result)
    assert sum("NOT measured" in line for line in lines) == 1
    assert sum(line.startswith("   16 ") for line in lines) == 2  # one row per (D, R)
    assert sum(line.lstrip().startswith(("0.60 ", "0.90 ")) for line in lines) == 2  # per tau
    assert any("host round trip" in line for line in lines)
    path = tmp_path / "out" / "bench_tpc.json"
    bench.write_json(result, str(path))
    assert json.loads(path.read_text()) == json.loads(json.dumps(result))
