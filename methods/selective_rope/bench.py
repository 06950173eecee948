"""What selective rotary costs in a whole train step, against RoPE at matched parameter counts.

    python -m launch.bench --methods=selective_rope --kernels=selective_rotary

Seconds per jitted train step (loss + gradient) of each of the paper's two small models
(1-layer GLA and 1-layer softmax transformer, `methods.selective_rope.model`) with selective
rotary and with RoPE, `matched` parameter counts, B=64, T=128, the median of 10 calls after a
warm-up. The op alone against RoPE: `core/kernels/selective_rotary/bench.py`.
"""

import jax
import jax.numpy as jnp
import numpy as np

from core.benchmark import Ratio, Result, median_seconds
from methods.selective_rope import loss_fn
from methods.selective_rope.model import ModelConfig, init_params, matched


def measure(*, smoke: bool = False) -> Result:
    B, T, repeats = (2, 8, 1) if smoke else (64, 128, 10)
    rng = np.random.default_rng(0)
    batch = {
        "inputs": jnp.asarray(rng.integers(1, 3, (B, T)), jnp.int32),
        "targets": jnp.asarray(rng.integers(1, 3, (B, T)), jnp.int32),
        "mask": jnp.ones((B, T), jnp.float32),
    }
    seconds_per_step, ratios = {}, []
    for arch in ("gla", "transformer"):
        seconds = {}
        for position in ("rope", "selective"):
            cfg = matched(ModelConfig(vocab_size=3, num_classes=3, model=arch, position=position))
            params = init_params(cfg, jax.random.PRNGKey(0))
            grad = jax.jit(jax.grad(lambda p, cfg=cfg: loss_fn(cfg, p, batch)[0]))
            seconds[position] = median_seconds(
                lambda grad=grad, params=params: jax.block_until_ready(grad(params)), repeats
            )
        seconds_per_step[arch] = seconds
        ratios.append(
            Ratio(
                f"1-layer {arch} train step (loss + grad), B={B} T={T}, matched params",
                "selective",
                seconds["selective"],
                "RoPE",
                seconds["rope"],
                "s",
            )
        )
    details = {"sizes": {"B": B, "T": T}, "repeats": repeats, "seconds_per_step": seconds_per_step}
    return Result(ratios, details)
