"""Benchmarks: wall-time medians, the machine a run measured, and figures as ratios.

A benchmark is one function, `measure(*, smoke=False) -> Result`, in `methods/<slug>/bench.py`
(a method's costs: its training step, its solver, its rollout) or `core/kernels/<op>/bench.py`
(an op against its reference); `launch.bench` finds them, runs them and writes the table.

Every figure is a `Ratio` of two quantities measured in the same process, on the same inputs,
one after the other: fused vs reference, jitted sampler vs Python loop, achieved FLOP/s vs this
machine's measured matmul peak. On a shared host the load moves absolute times by 2x between
runs; a ratio of two numbers taken seconds apart moves far less, and a claim about speed can
rest on it. The absolute numbers stay in `Result.details` (the JSON) for context, and the
machine description (jax, backend, devices, host cores, load average) goes with every run.
"""

import dataclasses
import datetime
import math
import os
import statistics
import time
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


class Ratio(NamedTuple):
    """`a / b`: two quantities in one unit, measured side by side in the same run."""

    figure: str  # what is compared, at which size: "first layer forward, 256^2 px, M=456"
    a_label: str  # what `a` is: "reference (jnp)"
    a: float
    b_label: str
    b: float
    unit: str  # of a and b: "s", "tokens/s", "FLOP/s", "bytes"

    @property
    def value(self) -> float:
        return float(self.a) / float(self.b)

    def to_dict(self) -> dict:
        return {**self._asdict(), "a": float(self.a), "b": float(self.b), "ratio": self.value}


@dataclasses.dataclass
class Result:
    """What one benchmark measured: its figures, every raw number (JSON-ready), and notes on
    what it could not measure here (a kernel with no accelerator to run on)."""

    ratios: list[Ratio]
    details: dict = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)


class KernelCase(NamedTuple):
    """One kernel at one size, as `launch.device_check` runs it natively against its reference:
    `fn(*args, impl=...)` returns a pytree of arrays; gradients are taken in the `wrt`
    arguments; `min_bytes` is the least memory traffic of one forward (its inputs read once,
    its outputs written once), for the fraction of memory bandwidth reached; `tol` bounds
    max |kernel - reference| / max |reference| per output and per gradient."""

    name: str
    fn: Callable
    args: tuple
    wrt: tuple[int, ...]
    min_bytes: int
    tol: float


# Kernel and reference add float32 terms in different orders: over n terms that moves a sum by
# about sqrt(n) * 2^-24 of its scale (n = 65,536 pixels in binned_encoding's weight gradient:
# 1.5e-5). 1e-4 of the scale keeps a margin, while a dropped term, a wrong index or a bfloat16
# pass shows as 1e-3 or more.
FLOAT32_KERNEL_TOL = 1e-4


# ------------------------------------------------------------------------------ measuring


def load_avg_1m() -> float | None:
    """The host's 1-minute load average (None where the OS has none)."""
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def machine() -> dict:
    """What a timing depends on: jax, the backend and devices, the host's cores and its load
    (a 2-core host at load 4 halves the numbers)."""
    devices = jax.devices()
    return {
        "jax_version": jax.__version__,
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
        "host_cpu_count": os.cpu_count(),
        "load_avg_1m": load_avg_1m(),
        "utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"),
    }


def median_seconds(fn, repeats: int, *, warmup: int = 1) -> float:
    """Median wall time of `fn()` (which must block on its result) over `repeats` calls, after
    `warmup` untimed calls (the first compiles; later ones can still pay one-off allocations)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def step_seconds(session, batch, repeats: int, *, warmup: int = 2) -> float:
    """Median seconds of a `core.train` session's jitted step on `batch` (already on the
    device). The step donates its state, so each call takes the previous call's output; the
    session keeps the last state (its params are the trained ones afterwards)."""
    state = session.state

    def one():
        nonlocal state
        state, metrics = session.step(state, batch)
        jax.block_until_ready(metrics)

    try:
        return median_seconds(one, repeats, warmup=warmup)
    finally:
        session.state = state


def matmul_peak(devices, sizes=(1024, 1536, 2048), repeats: int = 10, dtype="float32") -> dict:
    """Best jitted N x N matmul FLOP/s (2 N^3 per product) over `sizes`, summed over `devices`:
    each device multiplies its own pair, which is how data parallelism uses them (and on fake
    CPU devices sharing cores, the sum is what the cores can really do, not n times one)."""
    n_dev = len(devices)
    mesh = Mesh(np.asarray(devices), ("d",))
    sharding = NamedSharding(mesh, P("d") if n_dev > 1 else P())
    matmul = jax.jit(jnp.matmul, out_shardings=sharding)
    by_size = {}
    for n in sizes:
        shape = (n_dev, n, n) if n_dev > 1 else (n, n)
        kx, ky = jax.random.split(jax.random.PRNGKey(n))
        x = jax.device_put(jax.random.normal(kx, shape, dtype), sharding)
        y = jax.device_put(jax.random.normal(ky, shape, dtype), sharding)
        seconds = median_seconds(lambda x=x, y=y: matmul(x, y).block_until_ready(), repeats)
        by_size[str(n)] = {"seconds": seconds, "flops_per_s": n_dev * 2 * n**3 / seconds}
    best = max(by_size, key=lambda k: by_size[k]["flops_per_s"])
    return {
        "dtype": str(jnp.dtype(dtype)),
        "repeats": repeats,
        "by_size": by_size,
        "best_size": int(best),
        "peak_flops_per_s": by_size[best]["flops_per_s"],
    }


# ------------------------------------------------------------------------------ reporting

_PREFIXES = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def format_quantity(value: float, unit: str) -> str:
    """A number for a table: seconds as s/ms/us, bytes as MB, rates with k/M/G/T prefixes."""
    if value is None or not math.isfinite(value):
        return "n/a"
    if unit == "s":
        for scale, name in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
            if abs(value) >= scale:
                return f"{value / scale:.3g} {name}"
        return f"{value * 1e9:.3g} ns"
    if unit == "bytes":
        return f"{value / 2**20:.3g} MiB"
    for scale, prefix in _PREFIXES:
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def machine_line(start: dict, load_after: float | None) -> str:
    m = start
    return (
        f"jax {m['jax_version']}, {m['backend']} ({m['device_kind']} x{m['device_count']}), "
        f"{m['host_cpu_count']} host CPUs, load average (1 min) {m['load_avg_1m']} "
        f"at the start and {load_after} at the end, {m['utc']} UTC"
    )


def markdown(results: dict[str, Result], start: dict, load_after: float | None) -> str:
    """One table: a row per ratio of every benchmark, then the machine and the notes."""
    lines = [
        "# Benchmarks",
        "",
        machine_line(start, load_after) + ".",
        "Each ratio is A / B, both measured in this run, one after the other.",
        "",
        "| bench | figure | A | B | A / B |",
        "|---|---|---|---|---|",
    ]
    for name, result in results.items():
        for r in result.ratios:
            a, b = format_quantity(r.a, r.unit), format_quantity(r.b, r.unit)
            lines.append(
                f"| {name} | {r.figure} | {r.a_label}: {a} | {r.b_label}: {b} | {r.value:.3g} |"
            )
    notes = [f"- {name}: {note}" for name, result in results.items() for note in result.notes]
    cpus = start["host_cpu_count"]
    busy = [x for x in (start["load_avg_1m"], load_after) if x is not None and cpus and x > cpus]
    if busy:
        notes.append(f"- host busy (load {max(busy)} on {cpus} CPUs): absolute times are noisy")
    if notes:
        lines += ["", "Notes:", *notes]
    return "\n".join(lines) + "\n"


def json_ready(x):
    """`json.dump`'s `default`: numpy scalars and arrays as Python numbers and lists."""
    if isinstance(x, np.generic | np.ndarray | jax.Array):
        return np.asarray(x).tolist()
    raise TypeError(f"not JSON-serialisable: {type(x).__name__}")
