"""Calibration: a pool of model inputs from the deployment sampler, a subset chosen by a rule
(uniform, k-means or TAP, all at one size), and per-layer activation ranges on that subset.

The pool is every step's input (x_t, t, y) of `pool_trajectories` full-precision runs of the
sampler the quantised model will be deployed in: with the setting's cache when it has one
(calibration inputs must come from the deployment sampler). Labels cycle over the ten classes.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from methods.quant_cache import sampling, tap
from methods.quant_cache.settings import Setting


class Pool(NamedTuple):
    x_PHWC: np.ndarray  # every step's input, steps major: row = step * trajectories + j
    t_P: np.ndarray  # DDPM step index of each row (float)
    step_P: np.ndarray  # the sampler step (0 = first, pure noise) of each row
    y_P: np.ndarray
    inputs_SBHWC: np.ndarray  # the same, [steps, trajectories, ...]


def labels(n: int) -> np.ndarray:
    """n labels cycling over the classes (balanced to within one)."""
    return (np.arange(n) % 10).astype(np.int32)


def collect(cfg, params, sched, cache_every: int, *, trajectories, steps, eta, rng) -> Pool:
    """The calibration pool of a full-precision sampler with FORA cache interval cache_every."""
    k_noise, k_sample = jax.random.split(rng)
    x_noise = jax.random.normal(k_noise, (trajectories, cfg.image_size, cfg.image_size, 1))
    y_B = jnp.asarray(labels(trajectories))
    setting = Setting("pool", cache_every=cache_every)
    run = sampling.program(
        ("pool", cfg, sampling.sched_key(sched), cache_every, steps, eta),
        lambda: (
            lambda p, x, y, k: (
                sampling.sample(cfg, p, sched, setting, x, y, k, steps=steps, eta=eta).inputs
            )
        ),
    )
    inputs = np.asarray(run(params, x_noise, y_B, k_sample))
    S, B = inputs.shape[:2]
    t_S = np.asarray(_timesteps(sched, steps), np.float32)
    return Pool(
        x_PHWC=inputs.reshape(S * B, *inputs.shape[2:]),
        t_P=np.repeat(t_S, B),
        step_P=np.repeat(np.arange(S), B),
        y_P=np.tile(np.asarray(y_B), S),
        inputs_SBHWC=inputs,
    )


def _timesteps(sched, steps):
    from core import diffusion

    return diffusion.ddim_timesteps(sched, steps)


def mean_pairwise_cosine(inputs_SBHWC: np.ndarray) -> np.ndarray:
    """[S]: the mean cosine similarity over pairs of distinct samples at each step."""
    S, B = inputs_SBHWC.shape[:2]
    u = inputs_SBHWC.reshape(S, B, -1).astype(np.float64)
    u = u / np.maximum(np.linalg.norm(u, axis=-1, keepdims=True), 1e-12)
    total = np.sum(np.sum(u, axis=1) ** 2, axis=-1)  # |sum u|^2 = sum_ij cos_ij
    return (total - B) / (B * (B - 1))


def select(pool: Pool, rule: str, size: int, *, clusters, alpha, subsamples, fraction, rng):
    """Row indices of the pool chosen by `rule` (uniform | kmeans | tap)."""
    x_PD = pool.x_PHWC.reshape(len(pool.x_PHWC), -1)
    if rule == "uniform":
        return tap.uniform_select(len(x_PD), size, rng=rng)
    if rule == "kmeans":
        return tap.kmeans_select(x_PD, size, k=clusters, rng=rng)
    # TAP's time in sampler steps: adjacent steps have affinity exp(-1), 5 apart < 0.01.
    return tap.tap_select(
        x_PD,
        pool.step_P.astype(np.float64),
        size,
        k=clusters,
        rng=rng,
        subsamples=subsamples,
        fraction=fraction,
        alpha=alpha,
    )


def ranges(cfg, params, sched, pool: Pool, rows: np.ndarray) -> dict:
    """{layer path: (low, high)}: each quantised layer's input range over the chosen rows."""
    x = jnp.asarray(pool.x_PHWC[rows])
    t = jnp.asarray(pool.t_P[rows])
    y = jnp.asarray(pool.y_P[rows])
    observe = sampling.program(
        ("observe", cfg, sampling.sched_key(sched)),
        lambda: lambda p, x, t, y: sampling.observe(cfg, p, sched, x, t, y),
    )
    seen = observe(params, x, t, y)
    return {path: (float(e["min"]), float(e["max"])) for path, e in seen.items()}
