"""How fast is the LM train step, measured against what this machine's matmuls can do?

    python -m launch.bench --methods=lm     # configs/lm.py:size=small, one device

(Then, 5., text generation with SmolLM2-135M-Instruct against llama.cpp and transformers:
`methods/lm/bench_generate.py`.)

One process measures, on the same devices:

1. the peak: a jitted N x N matmul (2 N^3 FLOPs) in float32, and also in the step's compute
   dtype when that is not float32 (bfloat16 on accelerators); best over a few N, each the median
   of several repeats after a warm-up (`core.benchmark.matmul_peak`);
2. the train step of `core.train.init(config, methods.lm.make(config))`: compile time, then K
   steps dispatched back to back with a single `block_until_ready` at the end (the way
   `core.train.run` drives the device), on batches made beforehand so host-side data generation
   is not timed.

3. the whole train step against the gradient it is built on: `session.step` (state donated and
   fed back) and the jitted `value_and_grad` of the LM loss alone, on one batch, timed in
   alternation (step, gradient, step, ...) so that a shared host's load moves both alike; also
   the process's CPU seconds per call (all threads: on the CPU backend, the work done whatever
   the load) and XLA's FLOP count of each, whose ratio exposes any second pass over the model
   (a forward pass is a third of the gradient's FLOPs, the optimiser a few per parameter).

4. the gradient of one SwiGLU MLP at the step's sizes with its dense layers computed two ways:
   x[B, T, D] @ W as a 3-D `lax.dot_general` (Flax's default) and with B, T merged first
   (`core.nn.layers.flat_dot_general`, what the transformer's layers use). The weight
   gradient of the 3-D form contracts two dims, which XLA:CPU wraps in layout transposes.

Achieved FLOP/s counts model FLOPs with the standard 6N + 12 L T d estimate
(`transformer.flops_per_token`), so achieved / peak is a utilisation against a *measured*
matmul peak in the step's own compute dtype, not a datasheet number. XLA's own FLOP count of
the compiled step (which also counts the optimizer, norms and softmax) gives a second ratio when
the backend provides one. Another config or more devices: `measure(config=..., devices=8)`.
"""

import functools
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from configs import lm as lm_config
from core import precision, train
from core.benchmark import Ratio, Result, matmul_peak, median_seconds
from core.nn import layers, transformer
from core.precision import compute_dtype
from methods import lm
from methods.lm import bench_generate

WARMUP_STEPS = 2  # after compile: the first executions can still pay one-off allocation costs


def _xla_flops(compiled) -> float | None:
    """XLA's FLOP count of one device's partition of a compiled program (None: not counted)."""
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) and cost else cost
    return cost["flops"] if cost and cost.get("flops", -1) > 0 else None


def _train_step_speed(config, devices, steps: int) -> dict:
    """Compile time and steady-state speed of the config's jitted train step on `devices`."""
    session = train.init(config, lm.make(config), devices=devices)
    state = session.state
    batches = [session.next_batch() for _ in range(WARMUP_STEPS + 1 + steps)]
    batch_size, seq_len = batches[0]["inputs"].shape
    cfg = lm.model_config(config)

    # Ahead-of-time compile of the very jit `core.train` builds: the compile time alone, and the
    # executable that then runs every step (so no step can hide a recompile).
    start = time.perf_counter()
    compiled = session.step.lower(state, batches[0]).compile()
    compile_s = time.perf_counter() - start
    # Of one device's partition of the SPMD program: summed over devices for the whole step.
    partition_flops = _xla_flops(compiled)
    xla_flops = len(devices) * partition_flops if partition_flops else None

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


def _step_over_gradient(config, devices, rounds: int, repeats: int) -> dict:
    """Seconds per call of the core's train step and of the LM loss's gradient alone (same
    batch, same devices, same matmul precision), alternated over `rounds` rounds of `repeats`
    calls each; medians over rounds, and process CPU seconds per call."""
    session = train.init(config, lm.make(config), devices=devices)
    batch = session.next_batch()
    params = jax.tree.map(jnp.copy, session.state.params)  # the step donates the session's
    loss = functools.partial(session.method.loss, rng=None, extra={})  # the LM reads neither
    gradient = jax.jit(precision.traced_with(config, jax.value_and_grad(loss, has_aux=True)))
    flops = {
        "train_step": _xla_flops(session.step.lower(session.state, batch).compile()),
        "gradient": _xla_flops(gradient.lower(params, batch).compile()),
    }
    state = session.state

    def run_step():
        nonlocal state
        state, metrics = session.step(state, batch)
        jax.block_until_ready((state, metrics))

    def run_gradient():
        jax.block_until_ready(gradient(params, batch))

    calls = {"train_step": run_step, "gradient": run_gradient}
    for call in calls.values():  # compile, then the first executions' one-off costs
        for _ in range(WARMUP_STEPS):
            call()
    wall = {name: [] for name in calls}
    cpu = {name: [] for name in calls}
    load_before = os.getloadavg()
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.process_time()
            wall[name].append(median_seconds(call, repeats, warmup=0))
            cpu[name].append((time.process_time() - start) / repeats)
    median = {name: statistics.median(times) for name, times in wall.items()}
    median_cpu = {name: statistics.median(times) for name, times in cpu.items()}
    return {
        "rounds": rounds,
        "repeats": repeats,
        "seconds": median,
        "cpu_seconds": median_cpu,
        "seconds_by_round": wall,
        "cpu_seconds_by_round": cpu,
        "xla_flops": flops,
        "xla_flops_ratio": (
            flops["train_step"] / flops["gradient"] if all(flops.values()) else None
        ),
        "platform": devices[0].platform,
        "load_before": list(load_before),
        "load_after": list(os.getloadavg()),
    }


def _dense_gradient_forms(B: int, T: int, D: int, F: int, repeats: int) -> dict:
    """Seconds for the gradient of a SwiGLU MLP on x[B, T, D], 3-D dot vs flattened dot."""
    rng = np.random.default_rng(0)
    x_BTD = jnp.asarray(rng.standard_normal((B, T, D)), jnp.float32)
    shapes = {"gate": (D, F), "up": (D, F), "down": (F, D)}
    params = {
        k: jnp.asarray(rng.standard_normal(s) / np.sqrt(s[0]), jnp.float32)
        for k, s in shapes.items()
    }

    def mlp_loss(dot):
        def dense(x, w):
            return dot(x, w, (((x.ndim - 1,), (0,)), ((), ())))

        def loss(p, x):
            h = jax.nn.silu(dense(x, p["gate"])) * dense(x, p["up"])
            return jnp.sum(dense(h, p["down"]) ** 2)

        return jax.jit(jax.grad(loss))

    out = {}
    for name, dot in (("3-D dot", lax.dot_general), ("flattened dot", layers.flat_dot_general)):
        grad = mlp_loss(dot)
        out[name] = median_seconds(lambda g=grad: jax.block_until_ready(g(params, x_BTD)), repeats)
    return out


def measure(*, smoke: bool = False, config=None, devices: int = 1, generation=True) -> Result:
    """The train step's FLOP/s against the matmul peak of the first `devices` devices.
    `config`: an LM config (default `configs/lm.py:size=small`; smoke: a 2-layer copy task).
    generation: also the pretrained LM's generation speed against llama.cpp and transformers
    (`methods/lm/bench_generate.py`; smoke: a tiny random model, no comparators)."""
    if config is None:
        config = lm_config.get_config("size=smoke,task=copy" if smoke else "size=small")
        if smoke:
            config.task.length = 8
    if config.method != "lm":
        raise ValueError(f"the LM bench measures method 'lm', got {config.method!r}")
    steps, sizes, repeats = (3, (64, 128), 2) if smoke else (50, (1024, 1536, 2048), 10)
    devs = jax.devices()[:devices]
    step_dtype = compute_dtype(config.dtype)
    peaks = {"float32": matmul_peak(devs, sizes, repeats, "float32")}
    if step_dtype != "float32":
        peaks[step_dtype] = matmul_peak(devs, sizes, repeats, step_dtype)
    step = _train_step_speed(config, devs, steps)
    peak = peaks[step_dtype]
    m = config.model
    setting = (
        f"{m.num_layers}-layer, d_model {m.d_model}, batch {config.train.batch_size} x "
        f"{step['tokens_per_step'] // config.train.batch_size} tokens, {step_dtype}, "
        f"{len(devs)} device(s)"
    )
    what = f"LM train step ({setting}) vs the {step_dtype} matmul peak"
    peak_label = f"matmul peak (N={peak['best_size']})"
    ratios = [
        Ratio(
            what + ": model FLOP/s (6N + 12LTd)",
            "train step",
            step["achieved_flops_per_s"],
            peak_label,
            peak["peak_flops_per_s"],
            "FLOP/s",
        )
    ]
    if step["xla_flops_per_s"]:
        ratios.append(
            Ratio(
                what + ": XLA's FLOP count",
                "train step",
                step["xla_flops_per_s"],
                peak_label,
                peak["peak_flops_per_s"],
                "FLOP/s",
            )
        )
    rounds, step_repeats = (2, 2) if smoke else (7, 5)
    overhead = _step_over_gradient(config, devs, rounds, step_repeats)
    over_gradient = f"LM train step over its gradient ({setting})"
    # The process's CPU time is the work done only on the CPU backend (elsewhere, the host's).
    measures = [("seconds", "seconds per call", "s")]
    if overhead["platform"] == "cpu":
        measures.append(("cpu_seconds", "process CPU seconds per call (the work, any load)", "s"))
    if overhead["xla_flops_ratio"]:
        measures.append(("xla_flops", "XLA's FLOP count", "FLOP"))
    for key, label, unit in measures:
        ratios.append(
            Ratio(
                f"{over_gradient}: {label}",
                "train step (core.train)",
                overhead[key]["train_step"],
                "value_and_grad of the loss",
                overhead[key]["gradient"],
                unit,
            )
        )
    B, T = config.train.batch_size, step["tokens_per_step"] // config.train.batch_size
    forms = _dense_gradient_forms(B, T, m.d_model, m.d_ff, repeats)
    ratios.append(
        Ratio(
            f"SwiGLU MLP gradient, x {B} x {T} x {m.d_model}, d_ff {m.d_ff}: seconds",
            "3-D dot",
            forms["3-D dot"],
            "flattened dot",
            forms["flattened dot"],
            "s",
        )
    )
    details = {
        "dense_gradient_seconds": forms,
        "step_over_gradient": overhead,
        "config": {
            "task": dict(config.task),
            "model": {k: m[k] for k in ("num_layers", "d_model", "num_heads", "d_ff")},
            "batch_size": config.train.batch_size,
            "dtype": config.dtype,
            "optimizer": config.optim.name,
        },
        "num_devices": len(devs),
        "matmul": peaks,
        "train_step": step,
        "peak_dtype": step_dtype,
        "peak_flops_per_s": peak["peak_flops_per_s"],
        "mfu": step["achieved_flops_per_s"] / peak["peak_flops_per_s"],
    }
    notes = []
    if generation:
        gen_ratios, details["generation"], notes = bench_generate.measure_generation(smoke=smoke)
        ratios += gen_ratios
    return Result(ratios, details, notes)
