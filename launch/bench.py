"""How fast is the LM train step, measured against what this machine's matmuls can do?

    python -m launch.bench                                   # size=small, one device
    python -m launch.bench --config=configs/lm.py:size=base --steps=20 --devices=all

One process measures, on the same devices:

1. the peak: a jitted N x N matmul (2 N^3 FLOPs) in float32, and also in the step's compute
   dtype when that is not float32 (bfloat16 on accelerators); best over a few N, each the median
   of several repeats after a warm-up;
2. the train step of `core.train.init(config, methods.make(config))`: compile time, then K steps
   dispatched back to back with a single `block_until_ready` at the end (the way `core.train.run`
   drives the device), on batches made beforehand so host-side data generation is not timed.

Achieved FLOP/s counts model FLOPs with the standard 6N + 12 L T d estimate
(`transformer.flops_per_token`), so `mfu` = achieved / peak is a utilisation against a
*measured* matmul peak in the step's own compute dtype, not a datasheet number. XLA's own FLOP
count of the compiled step (which also counts the optimizer, norms and softmax) is reported
beside it when the backend provides one. On a shared host other processes steal cores: the load
average before and after is recorded, and a busy host is flagged.
"""

import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from ml_collections import config_flags

import methods
from core import train
from core.nn import transformer
from core.precision import compute_dtype
from launch.timing import median_seconds, write_json
from methods.lm import model_config

WARMUP_STEPS = 2  # after compile: the first executions can still pay one-off allocation costs


def matmul_peak(devices, sizes=(1024, 1536, 2048), repeats: int = 10, dtype="float32") -> dict:
    """Best matmul FLOP/s over `sizes`, summed over `devices`: each device multiplies its own
    N x N pair, which is how data parallelism uses them (and on fake CPU devices sharing cores,
    the sum is what the cores can really do, not n times one device)."""
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


def train_step_speed(config, devices, steps: int) -> dict:
    """Compile time and steady-state speed of the config's jitted train step on `devices`."""
    if config.method != "lm":
        raise ValueError(f"launch.bench measures the LM (method 'lm'), got {config.method!r}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    session = train.init(config, methods.make(config), devices=devices)
    state = session.state
    batches = [session.next_batch() for _ in range(WARMUP_STEPS + 1 + steps)]
    batch_size, seq_len = batches[0]["inputs"].shape
    cfg = model_config(config)

    # Ahead-of-time compile of the very jit `core.train` builds: the compile time alone, and the
    # executable that then runs every step (so no step can hide a recompile).
    start = time.perf_counter()
    compiled = session.step.lower(state, batches[0]).compile()
    compile_s = time.perf_counter() - start
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) and cost else cost
    # Of one device's partition of the SPMD program: summed over devices for the whole step.
    xla_flops = len(devices) * cost["flops"] if cost and cost.get("flops", -1) > 0 else None

    for batch in batches[: WARMUP_STEPS + 1]:
        state, metrics = compiled(state, batch)
    jax.block_until_ready((state, metrics))
    start = time.perf_counter()
    for batch in batches[WARMUP_STEPS + 1 :]:
        state, metrics = compiled(state, batch)  # no host sync inside the loop
    jax.block_until_ready((state, metrics))
    seconds = time.perf_counter() - start

    tokens_per_step = batch_size * seq_len
    flops_per_token = transformer.flops_per_token(cfg, seq_len)
    steps_per_s = steps / seconds
    return {
        "compute_dtype": compute_dtype(config.dtype),
        "param_dtype": cfg.param_dtype,
        "num_params": transformer.num_params(state.params),
        "compile_s": compile_s,
        # A persistent compilation cache (if set) turns compile_s into a cache load.
        "compile_cache_dir": jax.config.jax_compilation_cache_dir or None,
        "steps": steps,
        "seconds": seconds,
        "steps_per_s": steps_per_s,
        "tokens_per_step": tokens_per_step,
        "tokens_per_s": steps_per_s * tokens_per_step,
        "flops_per_token": flops_per_token,
        "flops_per_token_formula": "6 * N_matmul + 12 * num_layers * seq_len * d_model",
        "achieved_flops_per_s": flops_per_token * tokens_per_step * steps_per_s,
        # XLA counts the whole step, all devices: model fwd+bwd, optimizer, elementwise work.
        "xla_flops_per_step": xla_flops,
        "xla_flops_per_s": xla_flops * steps_per_s if xla_flops else None,
        "final_loss": float(metrics["loss"]),
        "data_generation_timed": False,
    }


def _load() -> float | None:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def measure(config, *, steps: int, devices=None, matmul_sizes=(1024, 1536, 2048), repeats=10):
    """The whole report: environment, matmul peak(s), train-step speed and their ratio (MFU)."""
    devices = list(devices or jax.devices()[:1])
    load_before = _load()
    step_dtype = compute_dtype(config.dtype)
    peaks = {"float32": matmul_peak(devices, matmul_sizes, repeats, "float32")}
    if step_dtype != "float32":
        peaks[step_dtype] = matmul_peak(devices, matmul_sizes, repeats, step_dtype)
    step = train_step_speed(config, devices, steps)
    peak = peaks[step_dtype]["peak_flops_per_s"]
    m = config.model
    return {
        "jax_version": jax.__version__,
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "num_devices": len(devices),
        "host_cpu_count": os.cpu_count(),
        "load_avg_1m": {"before": load_before, "after": _load()},
        "config": {
            "method": config.method,
            "task": dict(config.task),
            "model": {k: m[k] for k in ("num_layers", "d_model", "num_heads", "d_ff")},
            "batch_size": config.train.batch_size,
            "seq_len": step["tokens_per_step"] // config.train.batch_size,
            "dtype": config.dtype,
            "optimizer": config.optim.name,
        },
        "matmul": peaks,
        "train_step": step,
        "peak_dtype": step_dtype,
        "peak_flops_per_s": peak,
        "mfu": step["achieved_flops_per_s"] / peak,
    }


def _gflops(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x / 1e9:.2f} GFLOP/s"


def report_lines(r: dict) -> list[str]:
    """The console report: environment, per-size matmul numbers, then step vs peak."""
    step = r["train_step"]
    lines = [
        f"jax {r['jax_version']} | {r['backend']} | {r['device_kind']} x{r['num_devices']} | "
        f"{r['host_cpu_count']} host CPUs"
    ]
    for dtype, peak in r["matmul"].items():
        sizes = ", ".join(f"N={n} {_gflops(v['flops_per_s'])}" for n, v in peak["by_size"].items())
        lines.append(f"matmul {dtype}: {sizes}")
    lines += [
        f"train step {step['compute_dtype']}: compile {step['compile_s']:.2f} s | "
        f"{step['steps_per_s']:.3g} steps/s | {step['tokens_per_s']:.4g} tok/s | "
        f"{step['num_params']:,} params | {step['flops_per_token']:.4g} FLOP/token",
        f"{'':<22}{'matmul peak':>18}{'train step':>18}",
        f"{'FLOP/s (6N estimate)':<22}{_gflops(r['peak_flops_per_s']):>18}"
        f"{_gflops(step['achieved_flops_per_s']):>18}",
        f"{'FLOP/s (XLA count)':<22}{'':>18}{_gflops(step['xla_flops_per_s']):>18}",
    ]
    load, cpus = r["load_avg_1m"]["after"], r["host_cpu_count"]
    if load is not None and cpus and load > cpus:
        lines.append(f"note: host busy (load {load:.1f} on {cpus} CPUs): numbers are noisy")
    lines.append(
        f"summary: {step['steps_per_s']:.3g} steps/s, {step['tokens_per_s']:.4g} tok/s, "
        f"{_gflops(step['achieved_flops_per_s'])} vs {r['peak_dtype']} matmul peak "
        f"{_gflops(r['peak_flops_per_s'])} -> MFU {r['mfu']:.1%} "
        f"(compile {step['compile_s']:.1f} s)"
    )
    return lines


DEFAULT_CONFIG = "configs/lm.py:size=small"


def define_flags() -> None:
    """Called only when run as a script: launch.train defines --config too and absl refuses a
    flag defined twice, so importing this module (as the tests do) must define none."""
    config_flags.DEFINE_config_file("config", DEFAULT_CONFIG, "LM config (configs/lm.py[:arg]).")
    flags.DEFINE_string("out", "results/bench_lm.json", "Where the JSON report goes.")
    flags.DEFINE_integer("steps", 50, "Timed train steps (after compile and warm-up).")
    flags.DEFINE_string("devices", "1", "How many devices: a count, or 'all'.")
    flags.DEFINE_list("matmul_sizes", ["1024", "1536", "2048"], "Matmul sizes N to try.")
    flags.DEFINE_integer("matmul_repeats", 10, "Timed repeats per matmul size.")


def main(argv):
    del argv
    FLAGS = flags.FLAGS
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    all_devices = jax.devices()
    count = len(all_devices) if FLAGS.devices == "all" else int(FLAGS.devices)
    result = measure(
        FLAGS.config,
        steps=FLAGS.steps,
        devices=all_devices[:count],
        matmul_sizes=[int(n) for n in FLAGS.matmul_sizes],
        repeats=FLAGS.matmul_repeats,
    )
    write_json(result, FLAGS.out)
    print("\n".join(report_lines(result)))
    print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
    from launch.config_cli import check_before_defining, parse_flags

    check_before_defining(sys.argv, DEFAULT_CONFIG)
    define_flags()
    app.run(main, flags_parser=parse_flags)
