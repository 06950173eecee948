"""The trained DiT under a deployment setting: quantised linear layers, a FORA feature cache,
variance compensation, all inside one `core.diffusion.ddim` scan.

Quantised layers are every `nnx.Linear` inside the transformer blocks (attention q, k, v, o;
the SwiGLU MLP's gate, up, down; the adaLN modulation): not the embeddings (patch, timestep,
label) and not the final layer, as the paper's setting. Weights are fake-quantised per output
channel from their own range; activations per tensor with ranges calibrated on a selected set of
model inputs (`calibrate.py`).
"""

import functools
import re

import jax
import jax.numpy as jnp

from core import diffusion, quant
from core.nn import dit
from methods.quant_cache import vc as vc_lib
from methods.quant_cache.settings import Setting

_PROGRAMS = {}


def program(key: tuple, build):
    """jax.jit(build()) kept under `key`, which must name everything `build` closes over (the
    parameters are arguments), so the seeds of one experiment compile each program once."""
    if key not in _PROGRAMS:
        _PROGRAMS[key] = jax.jit(build())
    return _PROGRAMS[key]


def sched_key(sched) -> tuple:
    """A hashable name of a DDPM schedule (linear betas: length and end points)."""
    return (sched.num_steps, float(sched.betas[0]), float(sched.betas[-1]))


QUANTIZED = re.compile(r"(^|/)blocks/\d+/")  # linear-layer paths that are quantised


def is_quantized(path: str) -> bool:
    return QUANTIZED.search(path) is not None


def quantizing_patch(setting: Setting, ranges: dict | None, *, int8: bool = False):
    """`dit.model`'s patch for a setting: each block linear's product fake-quantised with its
    calibrated activation range (ranges: path -> (low, high)), or with int8=True computed by
    the integer path (`core.quant.int8_dot_general`); None for a float setting."""
    if not setting.quantized:
        return None
    product = quant.int8_dot_general if int8 else quant.fake_quant_dot_general

    def choose(path):
        if not is_quantized(path):
            return None
        low, high = ranges[path]
        return product(quant.qparams(low, high, setting.a_bits), setting.w_bits)

    return functools.partial(quant.patch_linears, choose=choose)


def model_fns(cfg, params, sched, setting: Setting, ranges=None, *, int8: bool = False):
    """(encode, decode) for the sampler: the setting's patch, the cache when N > 1, and the
    model reading time as t / T."""
    enc, dec = dit.sampler_fns(
        cfg,
        params,
        feature_cache=setting.cache_every > 1,
        patch=quantizing_patch(setting, ranges, int8=int8),
    )
    T = sched.num_steps
    return (
        lambda x, t, y: enc(x, t / T, y),
        lambda x, t, y, s: dec(x, t / T, y, s),
    )


def compensation(vc_fit):
    """`correct` for the sampler from a fitted (K [S, C], mu [S, C])."""
    k_SC, mu_SC = vc_fit
    return lambda x, i: (vc_lib.compensate(x, mu_SC[i], k_SC[i]), None)


def sample(
    cfg, params, sched, setting, x_noise, y_B, rng, *, steps, eta, ranges=None, vc_fit=None,
    int8=False, correct=None,
):  # fmt: skip
    """A `diffusion.Trajectory`: the final samples and the sample entering every step. The
    post-step correction is the fitted VC (`vc_fit`), or `correct` itself when given."""
    enc, dec = model_fns(cfg, params, sched, setting, ranges, int8=int8)
    if correct is None and vc_fit is not None:
        correct = compensation(vc_fit)
    return diffusion.ddim(
        enc,
        dec,
        x_noise,
        y_B,
        sched,
        steps=steps,
        eta=eta,
        rng=rng,
        share_every=setting.cache_every,
        correct=correct,
        trajectory=True,
    )


def fit_vc(cfg, params, sched, setting, x_noise, y_B, rng, *, steps, eta, ranges, eps, form):
    """(K [S, C], mu [S, C]) fitted on paired trajectories from the same noise: the full-
    precision run gives x' after every step; the setting's run is compensated step by step with
    the gain fitted at that step (so later gains see the compensated samples they will see at
    deployment). mu is the channel mean of the uncompensated sample."""
    fp = sample(cfg, params, sched, Setting("fp"), x_noise, y_B, rng, steps=steps, eta=eta)
    ref_SB = jnp.concatenate([fp.inputs[1:], fp.x[None]])  # x' after each step

    def correct(x, i):
        mu_C = vc_lib.channel_mean(x)
        k_C = vc_lib.gain(x, ref_SB[i], mu_C, eps=eps, form=form)
        return vc_lib.compensate(x, mu_C, k_C), (k_C, mu_C)

    out = sample(
        cfg, params, sched, setting, x_noise, y_B, rng, steps=steps, eta=eta, ranges=ranges,
        correct=correct,
    )  # fmt: skip
    return out.aux


def observe(cfg, params, sched, x_BHWC, t_B, y_B):
    """{path: {"min", "max", "macs"}} of every quantisable linear layer's input over one full
    (uncached) forward on model inputs (x_t, DDPM step t, label)."""
    store = {}

    def choose(path):
        return quant.observe_dot_general(store, path) if is_quantized(path) else None

    patch = functools.partial(quant.patch_linears, choose=choose)
    dit.apply(cfg, params, x_BHWC, t_B / sched.num_steps, y_B, patch=patch)
    return store


def layer_macs(cfg, params, sched) -> dict:
    """{path: MACs per image} of every linear layer in one forward (quantised or not)."""
    store = {}
    patch = functools.partial(
        quant.patch_linears, choose=lambda path: quant.observe_dot_general(store, path)
    )
    x = jnp.zeros((1, cfg.image_size, cfg.image_size, cfg.channels))
    jax.eval_shape(
        lambda: dit.apply(cfg, params, x, jnp.zeros(1), jnp.zeros(1, jnp.int32), patch=patch)
    )
    return {path: entry["macs"] for path, entry in store.items()}
