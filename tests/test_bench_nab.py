"""launch.bench_nab at tiny sizes: a complete report (no timing thresholds: the numbers depend
on the machine and its load)."""

import math

from launch import bench_nab as bench


def test_first_layer_report_is_complete():
    r = bench.first_layer(size=16, M=20, F=8, repeats=1)
    for impl in ("xla", "tiled", "interpret"):
        for name in ("fwd", "fwd_bwd"):
            assert math.isfinite(r[f"{impl}_{name}_seconds"]) and r[f"{impl}_{name}_seconds"] > 0
    assert r["features_bytes"] == 16 * 16 * 20 * 4
    rates = {"small/nab": {"image": 64, "steps_per_second": 2.0}}
    lines = bench.report_lines(r, rates)
    assert any("NOT measured" in line for line in lines)
    assert any("2.00 steps/s" in line for line in lines)
    assert sum("reference / tiled time" in line for line in lines) == 2


def test_train_rates_thread_the_donated_state():
    rates = bench.train_rates(sizes=("smoke",), steps=2)
    assert set(rates) == {"smoke/nab", "smoke/nab-xla", "smoke/rff"}
    assert all(r["steps_per_second"] > 0 and r["image"] == 16 for r in rates.values())
