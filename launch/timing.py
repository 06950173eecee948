"""Shared by the benchmarks: wall-time medians and JSON reports."""

import json
import os
import statistics
import time


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
