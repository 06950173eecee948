"""launch/device_check.py: kernels against their references, method steps, one JSON.

On this CPU machine the kernels run in the Pallas interpreter at their smoke sizes; the same
code runs them natively on a GPU or TPU.
"""

import json

import jax.numpy as jnp
import pytest

from core.benchmark import FLOAT32_KERNEL_TOL, KernelCase
from launch import device_check


def scaled_case(factor: float) -> KernelCase:
    """A "kernel" that is its reference times `factor` (1: exact; else a planted error)."""
    x = jnp.linspace(-1.0, 1.0, 64).reshape(8, 8)

    def fn(a, b, impl):
        out = jnp.tanh(a) @ b
        return out * factor if impl != "xla" else out

    return KernelCase("scaled", fn, (x, x.T), (0, 1), 3 * 64 * 4, FLOAT32_KERNEL_TOL)


def test_a_kernel_equal_to_its_reference_passes_and_a_wrong_one_fails():
    good = device_check.check_kernel(scaled_case(1.0), "interpret", 1, bandwidth=1e9)
    assert good["passed"] and good["max_relative_error"] == 0.0
    # 1e-3 off: ten times the tolerance, in the forward and in both gradients.
    bad = device_check.check_kernel(scaled_case(1.001), "interpret", 1, bandwidth=1e9)
    assert not bad["passed"]
    assert {k for k, v in bad["errors"].items() if v > FLOAT32_KERNEL_TOL} == {
        "forward",
        "gradient[0]",
        "gradient[1]",
    }
    assert bad["fraction_of_measured_bandwidth"] == pytest.approx(
        bad["native_fwd_bytes_per_s"] / 1e9
    )


def test_one_run_writes_one_json(tmp_path):
    out = tmp_path / "check.json"
    report = device_check.run(
        str(out), smoke=True, budget_s=600, kernels=("poly_probe",), method_names=("deql",)
    )
    saved = json.loads(out.read_text())
    assert saved["passed"] and saved["complete"] and saved == json.loads(json.dumps(report))
    kernel = saved["kernels"]["poly_probe"]
    assert kernel["impl"] == "interpret" and kernel["max_relative_error"] <= kernel["tol"]
    assert set(kernel["errors"]) == {"forward", *(f"gradient[{i}]" for i in range(5))}
    method = saved["methods"]["deql"]
    assert method["steps"] == device_check.METHOD_STEPS and method["passed"]
    assert saved["bandwidth"]["bytes_per_s"] > 0


def test_items_past_the_budget_are_skipped_and_the_run_is_incomplete(tmp_path, capsys):
    out = tmp_path / "check.json"
    report = device_check.run(
        str(out), smoke=True, budget_s=0, kernels=("poly_probe",), method_names=("deql",)
    )
    assert report["skipped"] == ["kernels/poly_probe", "methods/deql"]
    assert not report["complete"]
    assert (
        device_check.main(
            ["--smoke", f"--out={out}", "--budget_s=0", "--methods=deql", "--kernels=poly_probe"]
        )
        == 1
    )


def test_unknown_names_are_refused(capsys):
    with pytest.raises(SystemExit):
        device_check.main(["--kernels=flash"])
    assert "--kernels: unknown ['flash']" in capsys.readouterr().err


def test_every_kernel_with_a_benchmark_is_checked():
    """No list of kernels to keep: `KERNELS` is every core/kernels/<op>/ with a bench.py (this
    test's own listing of the folder), each of which gives the `device_case` that is run."""
    import importlib
    import pathlib

    import core.kernels

    folder = pathlib.Path(next(iter(core.kernels.__path__)))
    ops = sorted(p.parent.name for p in folder.glob("*/bench.py"))
    assert list(device_check.KERNELS) == ops and len(ops) >= 3
    for op in ops:
        assert callable(importlib.import_module(f"core.kernels.{op}.bench").device_case)
