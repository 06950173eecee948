"""The DiT's FORA-style feature cache (`dit.apply_with_branches`, `sampler_fns(feature_cache=)`)
inside `core.diffusion`'s samplers, and the samplers' `correct` / `trajectory` options."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core import diffusion
from core.nn import dit

SCHED = diffusion.ddpm_schedule(50)


def _model(decoder_blocks=0):
    cfg = dit.DiTConfig(
        image_size=8, channels=1, patch_size=2, d_model=32, num_heads=2, d_ff=64,
        encoder_blocks=2, decoder_blocks=decoder_blocks, num_classes=10,
    )  # fmt: skip
    params = dit.init_params(cfg, jax.random.key(0))
    # adaLN-Zero starts every gate at 0 (branches would not matter): move all weights off it.
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    noisy = [a + 0.05 * jax.random.normal(k, a.shape) for a, k in zip(leaves, keys, strict=True)]
    return cfg, jax.tree.unflatten(treedef, noisy)


NOISE = jax.random.normal(jax.random.key(2), (3, 8, 8, 1))
LABELS = jnp.array([0, 4, 9])


def _ddim(fns, steps, **kw):
    return diffusion.ddim(*fns, NOISE, LABELS, SCHED, steps=steps, **kw)


@pytest.mark.parametrize("decoder_blocks", [0, 1])
def test_cache_every_step_is_the_uncached_sampler_exactly(decoder_blocks):
    cfg, params = _model(decoder_blocks)
    # Eagerly (no jit, so no fusion can reorder a sum) replaying the branches of the same step
    # is the same arithmetic as the plain forward: bit for bit.
    with jax.disable_jit():
        plain = _ddim(dit.sampler_fns(cfg, params), steps=3)
        cached = _ddim(dit.sampler_fns(cfg, params, feature_cache=True), steps=3)
    np.testing.assert_array_equal(np.asarray(plain), np.asarray(cached))
    # Jitted, XLA may fuse the two programs differently: a few float32 ulps on values ~1.
    plain = jax.jit(lambda: _ddim(dit.sampler_fns(cfg, params), steps=6))()
    cached = jax.jit(lambda: _ddim(dit.sampler_fns(cfg, params, feature_cache=True), steps=6))()
    np.testing.assert_allclose(np.asarray(plain), np.asarray(cached), rtol=0, atol=1e-5)


def _ddim_step(x, eps, t, t_prev):
    """One deterministic DDIM update from step t to t_prev, by hand."""
    ab_t, ab_prev = SCHED.alpha_bars[t], SCHED.alpha_bars[t_prev]
    x0 = (x - np.sqrt(1 - ab_t) * eps) / np.sqrt(ab_t)
    return np.sqrt(ab_prev) * x0 + np.sqrt(1 - ab_prev) * eps


def test_cached_steps_replay_the_last_refresh():
    cfg, params = _model()
    T = SCHED.num_steps
    t0, t1, t2 = (int(t) for t in diffusion.ddim_timesteps(SCHED, 3))
    # By hand: step 0 computes every branch at the noise; step 1 replays them at its own x, t.
    out0, branches, _ = dit.apply_with_branches(cfg, params, NOISE, jnp.full(3, t0 / T), LABELS)
    x1 = _ddim_step(np.asarray(NOISE), np.asarray(out0), t0, t1)
    t1_B = jnp.full(3, t1 / T)
    replayed, _, _ = dit.apply_with_branches(cfg, params, x1, t1_B, LABELS, cached=branches)
    recomputed, _ = dit.apply(cfg, params, x1, t1_B, LABELS)
    expect_replay = _ddim_step(x1, np.asarray(replayed), t1, t2)
    expect_recompute = _ddim_step(x1, np.asarray(recomputed), t1, t2)
    enc, dec = dit.sampler_fns(cfg, params, feature_cache=True)
    timed = (lambda x, t, y: enc(x, t / T, y)), (lambda x, t, y, s: dec(x, t / T, y, s))
    got = jax.jit(lambda: _ddim(timed, steps=3, share_every=2, trajectory=True))().inputs[2]
    # float32 through two jitted steps vs the same arithmetic by hand: ~1e-6 on values ~1.
    np.testing.assert_allclose(np.asarray(got), expect_replay, atol=2e-5)
    # ... and recomputing the branches at step 1 gives a clearly different sample.
    assert np.abs(expect_recompute - expect_replay).max() > 50 * 2e-5


def test_correct_and_trajectory():
    cfg, params = _model()
    fns = dit.sampler_fns(cfg, params)
    plain = jax.jit(lambda: _ddim(fns, steps=4, trajectory=True))()
    assert plain.inputs.shape == (4, *NOISE.shape) and plain.aux is None
    np.testing.assert_array_equal(np.asarray(plain.inputs[0]), np.asarray(NOISE))
    halve = lambda x, i: (x * 0.5, i)  # noqa: E731  a correction that returns its step index
    out = jax.jit(lambda: _ddim(fns, steps=4, correct=halve, trajectory=True))()
    np.testing.assert_array_equal(np.asarray(out.aux), np.arange(4))
    # The corrected sample is what the next step sees.
    assert not np.allclose(np.asarray(out.inputs[1]), np.asarray(plain.inputs[1]))
    np.testing.assert_allclose(
        np.asarray(out.inputs[1]), 0.5 * np.asarray(plain.inputs[1]), rtol=1e-6
    )
