"""What the per-benchmark checks share, and how tests/test_bench.py finds them.

A benchmark's own checks of its report live with its tests, by convention: `check_bench(entry)`
in tests/methods/test_<slug>_bench.py for methods/<slug>/bench.py, and in
tests/kernels/test_<op>_bench.py for core/kernels/<op>/bench.py. The generic smoke test runs
every benchmark and calls its `check_bench` after the checks every report must pass.
"""

import importlib
import importlib.util
import math
from collections.abc import Callable

KERNEL_PREFIX = "kernels/"  # as launch.bench names a kernel's benchmark


def positive(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


def module_name(bench_name: str) -> str:
    """The test module holding `bench_name`'s `check_bench` (it may not exist)."""
    if bench_name.startswith(KERNEL_PREFIX):
        return f"tests.kernels.test_{bench_name[len(KERNEL_PREFIX) :]}_bench"
    return f"tests.methods.test_{bench_name}_bench"


def checker(bench_name: str) -> Callable[[dict], None] | None:
    """`check_bench` of `bench_name`'s test module, or None when it has none."""
    name = module_name(bench_name)
    if importlib.util.find_spec(name) is None:
        return None
    return importlib.import_module(name).check_bench
