"""methods/lm/bench.py's smoke report, checked in detail.

tests/test_bench.py's smoke test runs the benchmark (`launch.bench --smoke`) and, after its
generic checks, calls `check_bench` here (found by this file's name: tests/bench_checks.py)."""

import math

import jax
import pytest

from tests.bench_checks import positive


def check_bench(entry: dict) -> None:
    """`entry`: the benchmark's record in the report (its ratios, details and notes)."""
    check_lm(entry["details"])


def check_lm(d: dict, *, num_devices: int = 1) -> None:
    step = d["train_step"]
    by_size = d["matmul"]["float32"]["by_size"].values()
    numbers = [
        d["peak_flops_per_s"],
        d["mfu"],
        step["compile_s"],
        step["seconds"],
        step["steps_per_s"],
        step["tokens_per_s"],
        step["flops_per_token"],
        step["achieved_flops_per_s"],
        step["xla_flops_per_s"],
        *(v["flops_per_s"] for v in by_size),
    ]
    assert all(positive(x) for x in numbers), numbers
    assert d["num_devices"] == num_devices
    assert d["peak_dtype"] == step["compute_dtype"] == "float32"
    assert d["peak_flops_per_s"] == max(v["flops_per_s"] for v in by_size)
    assert d["mfu"] == pytest.approx(step["achieved_flops_per_s"] / d["peak_flops_per_s"])
    assert step["steps"] == 3
    assert step["steps_per_s"] == pytest.approx(step["steps"] / step["seconds"])
    assert step["tokens_per_step"] == 8 * (2 * 8 + 2)  # batch 8 x copy length 2L + 2
    assert step["tokens_per_s"] == pytest.approx(step["steps_per_s"] * step["tokens_per_step"])
    assert step["achieved_flops_per_s"] == pytest.approx(
        step["flops_per_token"] * step["tokens_per_s"]
    )
    assert step["xla_flops_per_step"] > 0
    assert step["num_params"] > 0 and math.isfinite(step["final_loss"])


def test_lm_bench_on_every_device():
    from methods.lm import bench as lm_bench

    result = lm_bench.measure(smoke=True, devices=jax.device_count())
    check_lm(result.details, num_devices=jax.device_count())
