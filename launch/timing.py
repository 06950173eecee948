"""Shared by the benchmarks: the machine a run measured, wall-time medians, JSON reports."""

import json
import os
import statistics
import time

import jax


def environment() -> dict:
    """What a timing depends on: jax, the backend and device, the host's cores and its load
    (a loaded 2-core machine halves the numbers)."""
    return {
        "jax_version": jax.__version__,
        "backend": jax.default_backend(),
        "device_kind": jax.devices()[0].device_kind,
        "host_cpu_count": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


def median_seconds(fn, repeats: int) -> float:
    """Median wall time of `fn()` (which must block on its result), after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def write_json(result: dict, path: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
