"""launch.bench: discovery, one-line errors, and every benchmark's smoke run, whose report must be
complete and self-consistent. No timing thresholds: the numbers depend on the machine and its
load, so only their consistency is checked (each figure is its two numbers' ratio, each number
is the one in the details, the sizes are the smoke sizes). Each benchmark's own detail checks
live with its tests (`check_bench` in tests/methods/test_<slug>_bench.py or
tests/kernels/test_<op>_bench.py, tests/bench_checks.py): no table of them here."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import pytest

from core.errors import ConfigError
from launch import bench
from tests import bench_checks, kinds
from tests.bench_checks import positive

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------ the entry point


@pytest.mark.parametrize("name", [*bench.select(None, None), *kinds.BENCHES])
def test_smoke_run_writes_a_consistent_report(name, tmp_path):
    """Every benchmark, and those of the methods tests/kinds.py defines (evaluate-only,
    data-free), through the same report."""
    record = bench.run([name], str(tmp_path), smoke=True, modules=kinds.BENCHES)
    json_path, md_path, *figures = record["files"]
    with open(json_path) as f:
        written = json.load(f)
    assert written["smoke"] is True and written["machine"]["backend"] == jax.default_backend()
    (entry,) = written["benches"].values()
    assert list(written["benches"]) == [name] and entry["ratios"]
    for r in entry["ratios"]:
        assert positive(float(r["a"])) and positive(float(r["b"])), r
        assert r["ratio"] == r["a"] / r["b"]
    with open(md_path) as f:
        table = f.read()
    rows = [line for line in table.splitlines() if line.startswith(f"| {name} |")]
    assert len(rows) == len(entry["ratios"])
    for line, r in zip(rows, entry["ratios"], strict=True):
        assert line.split(" | ")[1] == r["figure"] and line.endswith(f" | {r['ratio']:.3g} |")
    for path in figures:
        assert os.path.getsize(path) > 1000  # a rendered PNG, not an empty file
    # The benchmark's own checks of its details, kept with its tests (tests/bench_checks.py).
    check_bench = bench_checks.checker(name)
    if check_bench is not None:
        check_bench(entry)


def test_each_benchmark_check_is_found_by_its_name():
    """The per-benchmark checks are found by convention, so a misnamed file would silently
    check nothing: every check module names a benchmark that exists, and the lookup finds
    the ones the benchmarks have."""
    tests = pathlib.Path(__file__).parent
    files = {
        *(f"{p.stem[5:-6]}" for p in (tests / "methods").glob("test_*_bench.py")),
        *(f"kernels/{p.stem[5:-6]}" for p in (tests / "kernels").glob("test_*_bench.py")),
    }
    everything = bench.select(None, None)
    assert files <= set(everything), sorted(files - set(everything))
    assert {name for name in everything if bench_checks.checker(name)} == files


def test_selection_discovers_methods_and_kernels():
    everything = bench.select(None, None)
    assert {"lm", "nab", "kernels/selective_rotary", "kernels/poly_probe"} <= set(everything)
    assert set(bench.method_benches()) <= set(everything)
    assert bench.select(["nab"], ["binned_encoding"]) == ["nab", "kernels/binned_encoding"]
    assert bench.select(None, ["poly_probe"]) == ["kernels/poly_probe"]
    assert bench.select(["deql", "lm", "deql"], None) == ["deql", "lm"]


@pytest.mark.parametrize(
    "methods, kernels, field",
    [(["nab", "nope"], None, "--methods"), (None, ["lm"], "--kernels"), ([], [], "")],
)
def test_unknown_or_no_names_are_one_line_errors(methods, kernels, field):
    with pytest.raises(ConfigError) as e:
        bench.select(methods, kernels)
    message = str(e.value)
    assert "\n" not in message and field in message
    if methods:
        assert "nope" in message and ", ".join(bench.method_benches()) in message
    elif kernels:
        assert "lm" in message and ", ".join(bench.kernel_benches()) in message


def test_command_line(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "1"}
    command = [sys.executable, "-m", "launch.bench", f"--out={tmp_path}"]
    proc = subprocess.run(
        [*command, "--methods=deql", "--smoke"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| deql | DEQL(L2) solve, float64, n=40 |" in proc.stdout
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".json", ".md", ".png"]
    proc = subprocess.run(
        [*command, "--methods=nope"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        f"error: --methods: no benchmark for nope; available: {', '.join(bench.method_benches())}"
    ]
