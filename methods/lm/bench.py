"""How fast is the LM train step, measured against what this machine's matmuls can do?

    python -m launch.bench --methods=lm     # configs/lm.py:size=small, one device

One process measures, on the same devices:

1. the peak: a jitted N x N matmul (2 N^3 FLOPs) in float32, and also in the step's compute
   dtype when that is not float32 (bfloat16 on accelerators); best over a few N, each the median
   of several repeats after a warm-up (`core.benchmark.matmul_peak`);
2. the train step of `core.train.init(config, methods.lm.make(config))`: compile time, then K
   steps dispatched back to back with a single `block_until_ready` at the end (the way
   `core.train.run` drives the device), on batches made beforehand so host-side data generation
   is not timed.

3. the gradient of one SwiGLU MLP at the step's sizes with its dense layers computed two ways:
   x[B, T, D] @ W as a 3-D `lax.dot_general` (Flax's default) and with B, T merged first
   (`core.nn.layers.flat_dot_general`, what the transformer's layers use). The weight
   gradient of the 3-D form contracts two dims, which XLA:CPU wraps in layout transposes.

Achieved FLOP/s counts model FLOPs with the standard 6N + 12 L T d estimate
(`transformer.flops_per_token`), so achieved / peak is a utilisation against a *measured*
matmul peak in the step's own compute dtype, not a datasheet number. XLA's own FLOP count of
the compiled step (which also counts the optimizer, norms and softmax) gives a second ratio when
the backend provides one. Another config or more devices: `measure(config=..., devices=8)`.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from configs import lm as lm_config
from core import train
from core.benchmark import Ratio, Result, matmul_peak, median_seconds
from core.nn import layers, transformer
from core.precision import compute_dtype
from methods import lm

WARMUP_STEPS = 2  # after compile: the first executions can still pay one-off allocation costs


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


def measure(*, smoke: bool = False, config=None, devices: int = 1) -> Result:
    """The train step's FLOP/s against the matmul peak of the first `devices` devices.
    `config`: an LM config (default `configs/lm.py:size=small`; smoke: a 2-layer copy task)."""
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
    what = (
        f"LM train step ({m.num_layers}-layer, d_model {m.d_model}, batch "
        f"{config.train.batch_size} x {step['tokens_per_step'] // config.train.batch_size} "
        f"tokens, {step_dtype}, {len(devs)} device(s)) vs the {step_dtype} matmul peak"
    )
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
    return Result(ratios, details)
