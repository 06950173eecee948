"""launch.bench on the smoke LM: a complete, self-consistent report (no timing thresholds: the
numbers depend on the machine and its load, so only their consistency is checked)."""

import json
import math
import os
import subprocess
import sys

import jax
import pytest

from configs import lm
from launch import bench

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def smoke_config():
    config = lm.get_config("size=smoke,task=copy")
    config.task.length = 8
    return config


def check_report(r: dict, *, steps: int, num_devices: int) -> None:
    step = r["train_step"]
    positive = [
        r["peak_flops_per_s"],
        r["mfu"],
        step["compile_s"],
        step["seconds"],
        step["steps_per_s"],
        step["tokens_per_s"],
        step["flops_per_token"],
        step["achieved_flops_per_s"],
        step["xla_flops_per_s"],
        *(v["flops_per_s"] for v in r["matmul"]["float32"]["by_size"].values()),
    ]
    assert all(isinstance(x, float) and math.isfinite(x) and x > 0 for x in positive), positive
    assert r["backend"] == "cpu" and r["num_devices"] == num_devices
    assert r["peak_dtype"] == step["compute_dtype"] == "float32"
    assert r["peak_flops_per_s"] == max(
        v["flops_per_s"] for v in r["matmul"]["float32"]["by_size"].values()
    )
    assert r["mfu"] == pytest.approx(step["achieved_flops_per_s"] / r["peak_flops_per_s"])
    assert step["steps"] == steps
    assert step["steps_per_s"] == pytest.approx(steps / step["seconds"])
    assert step["tokens_per_step"] == 8 * (2 * 8 + 2)  # batch 8 x copy length 2L + 2
    assert step["tokens_per_s"] == pytest.approx(step["steps_per_s"] * step["tokens_per_step"])
    assert step["achieved_flops_per_s"] == pytest.approx(
        step["flops_per_token"] * step["tokens_per_s"]
    )
    assert step["num_params"] > 0 and math.isfinite(step["final_loss"])


@pytest.mark.parametrize("num_devices", [1, 8])
def test_measure_reports_consistent_numbers(tmp_path, num_devices):
    r = bench.measure(
        smoke_config(),
        steps=3,
        devices=jax.devices()[:num_devices],
        matmul_sizes=(64, 128),
        repeats=2,
    )
    path = str(tmp_path / "out" / "bench.json")
    bench.write_json(r, path)
    with open(path) as f:
        check_report(json.load(f), steps=3, num_devices=num_devices)
    assert r["train_step"]["xla_flops_per_step"] > 0
    assert any(line.startswith("summary: ") for line in bench.report_lines(r))


def test_command_line_writes_the_report(tmp_path):
    out = tmp_path / "bench.json"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch.bench",
            "--config=configs/lm.py:size=smoke",
            "--config.task.length=8",
            "--steps=2",
            "--matmul_sizes=64",
            "--matmul_repeats=2",
            f"--out={out}",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "summary: " in proc.stdout and "MFU" in proc.stdout
    with open(out) as f:
        check_report(json.load(f), steps=2, num_devices=1)
