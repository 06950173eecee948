"""launch.bench_selective_rotary at tiny sizes: a complete, self-consistent report (no timing
thresholds: the numbers depend on the machine and its load)."""

import json
import math

from launch import bench_selective_rotary as bench


def test_report_is_complete_and_consistent(tmp_path):
    r = bench.measure(1, 16, 2, 8, repeats=2)
    s = r["seconds"]
    assert set(s) == {"rope_fwd", "selective_fwd", "rope_fwd_bwd", "selective_fwd_bwd"}
    assert all(math.isfinite(v) and v > 0 for v in s.values())
    assert r["overhead_fwd"] == s["selective_fwd"] / s["rope_fwd"]
    assert r["overhead_fwd_bwd"] == s["selective_fwd_bwd"] / s["rope_fwd_bwd"]
    assert r["selective_fwd_min_bytes"] == 4 * (1 * 16 * 2 * 8) * 4 + (1 * 16 * 2 * 4) * 4
    assert r["pallas_kernel_accelerator_timing"] is None and "NOT measured" in r["not_measured"]
    lines = bench.report_lines(r)
    assert any("overhead x" in line for line in lines)
    assert any("NOT measured" in line for line in lines)
    path = tmp_path / "out" / "bench.json"
    bench.write_json(r, str(path))
    assert json.loads(path.read_text()) == r


def test_model_step_comparison_reports_both_architectures():
    m = bench.model_steps(B=2, T=8, repeats=1)
    for arch in ("gla", "transformer"):
        s = m["seconds_per_step"][arch]
        assert s["rope"] > 0 and s["selective"] > 0
        assert s["overhead"] == s["selective"] / s["rope"]
    assert len(bench.model_report_lines(m)) == 3
