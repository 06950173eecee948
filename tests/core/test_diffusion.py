"""core.diffusion: the flow path, the DDPM schedule, and the Euler / DDIM / DDPM samplers with
classifier-free guidance over an interval and encoder sharing, on models with known answers."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core import diffusion
from core.errors import ConfigError

# Gaussian data, one distribution per dimension: x_d ~ N(MU_d, SIGMA_d^2).
MU = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
SIGMA = np.array([0.3, 0.5, 1.0, 2.0], np.float32)


def gaussian_velocity(x_BD, t_B, y_B):
    """E[x - eps | x_t] for x ~ N(MU, SIGMA^2), eps ~ N(0, 1), x_t = t x + (1 - t) eps: x_t is
    N(t MU, t^2 SIGMA^2 + (1 - t)^2), jointly Gaussian with x and eps, so the regression is
    affine: v = MU + (t SIGMA^2 - (1 - t)) / var_t * (x_t - t MU)."""
    del y_B
    t = t_B[:, None]
    var = t**2 * SIGMA**2 + (1 - t) ** 2
    return MU + (t * SIGMA**2 - (1 - t)) / var * (x_BD - t * MU)


def test_euler_with_the_exact_gaussian_velocity_reproduces_the_data_moments():
    n, steps = 8192, 100
    noise = jax.random.normal(jax.random.key(0), (n, len(MU)))
    enc, dec = diffusion.unsplit(gaussian_velocity)
    sample = jax.jit(functools.partial(diffusion.euler, enc, dec, steps=steps))
    x = np.asarray(sample(noise, jnp.zeros(n, jnp.int32)), np.float64)
    # The exact-velocity Euler map is affine per dimension, x = a z + b. Its mean is exact (the
    # mean path t MU is linear in t, which Euler integrates exactly), so the mean is off only by
    # sampling: 4 standard errors, SIGMA / sqrt(n). Its scale a is first order in 1 / steps:
    # |a - SIGMA| / SIGMA <= 2 / steps for SIGMA in [0.3, 2] (from the scalar recursion
    # a *= 1 + dt c(t), 1.3-1.9 / steps for these SIGMA), plus 4 standard errors of a sample
    # std, 1 / sqrt(2 n) relative.
    np.testing.assert_allclose(x.mean(0), MU, atol=float(np.max(4 * SIGMA / np.sqrt(n))))
    rel_std = np.abs(x.std(0) / SIGMA - 1)
    assert np.all(rel_std < 2 / steps + 4 / np.sqrt(2 * n)), rel_std


def test_euler_reads_the_velocity_at_the_start_of_each_step():
    # v = t: Euler sums dt * t_k over the left ends t_k = k / steps, (1 - 1 / steps) / 2
    # (the right ends would give (1 + 1 / steps) / 2; the exact integral 1 / 2)
    enc, dec = diffusion.unsplit(lambda x, t, y: jnp.broadcast_to(t[:, None], x.shape))
    x = diffusion.euler(enc, dec, jnp.zeros((1, 1)), jnp.zeros(1, jnp.int32), steps=4)
    np.testing.assert_allclose(x, [[(1 - 1 / 4) / 2]], rtol=1e-6)  # float32 sums of k / 16


def test_flow_path_ends_target_and_t_sampler():
    x, eps = jnp.full((2, 3), 2.0), jnp.full((2, 3), -1.0)
    np.testing.assert_array_equal(
        diffusion.flow_path(x, eps, jnp.array([1.0, 0.0])), [x[0], eps[1]]
    )
    # The target is the path's time derivative (the path is linear in t: exact difference).
    t0, t1 = jnp.full(2, 0.25), jnp.full(2, 0.75)
    slope = (diffusion.flow_path(x, eps, t1) - diffusion.flow_path(x, eps, t0)) / 0.5
    np.testing.assert_allclose(slope, diffusion.flow_target(x, eps))
    t = diffusion.sample_t(jax.random.key(0), (20000,), "lognorm")
    logit = np.log(t / (1 - t))
    # logit(t) ~ N(0, 1): 5 standard errors on 20000 draws (1/141 for the mean, 1/200 for std)
    assert abs(logit.mean()) < 5 / np.sqrt(20000) and abs(logit.std() - 1) < 5 / np.sqrt(40000)
    example = diffusion.flow_noised(jax.random.key(1), x, t_sampler="uniform")
    np.testing.assert_allclose(example.x_t, diffusion.flow_path(x, example.eps, example.t))


def test_unknown_t_sampler_is_a_one_line_error_naming_the_field():
    with pytest.raises(ConfigError, match="t_sampler") as info:
        diffusion.sample_t(jax.random.key(0), (3,), "lognormal")
    assert "\n" not in str(info.value)


def test_ddpm_alpha_bar_is_the_marginal_of_the_one_step_transitions():
    sched = diffusion.ddpm_schedule(1000)
    np.testing.assert_allclose(sched.betas[[0, -1]], [1e-4, 0.02])
    # Composing x_t = sqrt(1 - beta_t) x_{t-1} + sqrt(beta_t) eps_t one step at a time gives
    # x_t = m_t x_0 + N(0, v_t); the closed form says m_t = sqrt(alpha_bar_t) and
    # v_t = 1 - alpha_bar_t.
    m, v, ms, vs = 1.0, 0.0, [], []
    for beta in np.linspace(1e-4, 0.02, 1000):
        m, v = math.sqrt(1 - beta) * m, (1 - beta) * v + beta
        ms.append(m)
        vs.append(v)
    # float64 both ways: only rounding over 1000 products separates them
    np.testing.assert_allclose(np.sqrt(sched.alpha_bars), ms, rtol=1e-12)
    np.testing.assert_allclose(1 - sched.alpha_bars, vs, rtol=1e-12)


SCHED = diffusion.ddpm_schedule(50)  # a short chain: every test here compiles in seconds
AB = jnp.asarray(SCHED.alpha_bars, jnp.float32)
POINT = jax.random.normal(jax.random.key(7), (1, 2, 2, 1))  # a point-mass data distribution


def point_mass_eps(x, t_B, y_B):
    """The exact noise predictor of a point mass at POINT: (x - sqrt(ab) POINT) / sqrt(1 - ab)."""
    ab = AB[t_B.astype(jnp.int32)][:, None, None, None]
    return (x - jnp.sqrt(ab) * POINT) / jnp.sqrt(1 - ab)


@functools.partial(jax.jit, static_argnames=("eps_fn", "steps", "eta"))
def ddim_run(noise, rng, *, eps_fn, steps, eta):
    enc, dec = diffusion.unsplit(eps_fn)
    y = jnp.zeros(noise.shape[0], jnp.int32)
    return diffusion.ddim(enc, dec, noise, y, SCHED, steps=steps, eta=eta, rng=rng)


def test_ddim_and_ddpm_with_the_exact_point_mass_predictor_return_the_point():
    noise = jax.random.normal(jax.random.key(0), (3, 2, 2, 1))
    for steps, eta in ((10, 0.0), (50, 1.0)):  # DDIM; DDPM (DDIM with eta 1, all steps)
        x = ddim_run(noise, jax.random.key(1), eps_fn=point_mass_eps, steps=steps, eta=eta)
        # float32: x0 = (x - sqrt(1 - ab) eps) / sqrt(ab) divides by sqrt(ab_T) ~ 0.6 here
        np.testing.assert_allclose(x, jnp.broadcast_to(POINT, x.shape), atol=1e-5)
    x = diffusion.ddpm(
        *diffusion.unsplit(point_mass_eps),
        noise,
        jnp.zeros(3, jnp.int32),
        SCHED,
        rng=jax.random.key(2),
    )
    np.testing.assert_allclose(x, jnp.broadcast_to(POINT, x.shape), atol=1e-5)


def test_two_ddim_steps_by_hand():
    # steps = 2 visits t = T - 1, then t = 0, then alpha_bar = 1; a constant eps prediction
    # makes each step x <- sqrt(ab_prev) (x - sqrt(1 - ab_t) c) / sqrt(ab_t) + sqrt(1 - ab_prev) c
    c, ab = 0.3, SCHED.alpha_bars
    noise = jax.random.normal(jax.random.key(0), (2, 2, 2, 1))
    x = np.asarray(noise, np.float64)
    for ab_t, ab_prev in ((ab[-1], ab[0]), (ab[0], 1.0)):
        x = (
            np.sqrt(ab_prev) * (x - np.sqrt(1 - ab_t) * c) / np.sqrt(ab_t)
            + np.sqrt(1 - ab_prev) * c
        )
    const = lambda x, t, y: jnp.full_like(x, c)  # noqa: E731
    out = ddim_run(noise, jax.random.key(1), eps_fn=const, steps=2, eta=0.0)
    np.testing.assert_allclose(out, x, rtol=1e-5)  # float32 vs float64, two divisions


def test_ddim_eta_zero_is_deterministic_and_eta_one_is_not():
    noise = jax.random.normal(jax.random.key(0), (3, 2, 2, 1))
    shrink = lambda x, t, y: 0.5 * x  # noqa: E731  not a point mass: the noise would show
    runs = {
        eta: [ddim_run(noise, jax.random.key(k), eps_fn=shrink, steps=10, eta=eta) for k in (1, 2)]
        for eta in (0.0, 1.0)
    }
    np.testing.assert_array_equal(*runs[0.0])
    assert np.max(np.abs(runs[1.0][0] - runs[1.0][1])) > 1e-2


def toy_decode(x, t, y, s):
    """A label-dependent prediction (the null label 9 gives the unconditional one)."""
    offset = jnp.where(y == 9, 0.0, y + 1.0)[:, None]
    return s - 0.3 * x + offset + t[:, None]


def toy_encode(x, t, y):
    return jnp.tanh(x) * (1 + t[:, None])


@functools.partial(jax.jit, static_argnames=("guidance", "share_every", "split"))
def toy_euler(noise, y, guidance=None, share_every=1, split=True):
    enc, dec = toy_encode, toy_decode
    if not split:  # the same model without the split: encode inside every step
        enc, dec = diffusion.unsplit(lambda x, t, y: toy_decode(x, t, y, toy_encode(x, t, y)))
    return diffusion.euler(enc, dec, noise, y, steps=6, guidance=guidance, share_every=share_every)


NOISE = jax.random.normal(jax.random.key(3), (4, 5))
LABELS = jnp.array([0, 1, 2, 3])


def test_cfg_scale_one_and_outside_its_interval_equal_the_conditional_model():
    cond = toy_euler(NOISE, LABELS)
    scale_one = toy_euler(NOISE, LABELS, guidance=diffusion.Guidance(1.0, 9))
    # float32: uncond + 1 * (cond - uncond) rounds once per step
    np.testing.assert_allclose(scale_one, cond, atol=1e-5)
    outside = toy_euler(NOISE, LABELS, guidance=diffusion.Guidance(3.0, 9, t_min=1.5, t_max=2.0))
    np.testing.assert_array_equal(outside, cond)


def test_cfg_applies_exactly_inside_its_interval():
    guided = toy_euler(NOISE, LABELS, guidance=diffusion.Guidance(3.0, 9, t_min=0.3, t_max=1.0))

    def by_hand(x, t, y):  # guidance written out: the grid is 0, 1/6, ..., 5/6
        cond = toy_decode(x, t, y, toy_encode(x, t, y))
        null = jnp.full_like(y, 9)
        uncond = toy_decode(x, t, null, toy_encode(x, t, null))
        return jnp.where(t[:, None] >= 0.3, uncond + 3.0 * (cond - uncond), cond)

    expected = diffusion.euler(*diffusion.unsplit(by_hand), NOISE, LABELS, steps=6)
    np.testing.assert_allclose(guided, expected, atol=1e-5)  # float32 rounding over 6 steps
    assert np.max(np.abs(guided - toy_euler(NOISE, LABELS))) > 0.1


def test_encoder_sharing_r1_equals_no_sharing_and_r_calls_the_encoder_ceil_steps_over_r():
    np.testing.assert_allclose(
        toy_euler(NOISE, LABELS, share_every=1), toy_euler(NOISE, LABELS, split=False), atol=1e-6
    )
    assert np.max(np.abs(toy_euler(NOISE, LABELS, share_every=4) - toy_euler(NOISE, LABELS))) > 1e-2
    calls = []

    def counting_encode(x, t, y):
        jax.debug.callback(lambda: calls.append(1))
        return toy_encode(x, t, y)

    for steps, r in ((6, 4), (7, 3), (5, 1)):
        calls.clear()
        run = jax.jit(
            lambda n, y, steps=steps, r=r: diffusion.euler(
                counting_encode, toy_decode, n, y, steps=steps, share_every=r
            )
        )
        run(NOISE, LABELS).block_until_ready()
        jax.effects_barrier()
        assert len(calls) == math.ceil(steps / r), (steps, r, len(calls))


def test_bad_sampler_arguments_are_one_line_errors():
    enc, dec = diffusion.unsplit(lambda x, t, y: x)
    with pytest.raises(ConfigError, match="share_every"):
        diffusion.euler(enc, dec, NOISE, LABELS, steps=3, share_every=0)
    with pytest.raises(ConfigError, match="steps"):
        diffusion.ddim(enc, dec, NOISE, LABELS, SCHED, steps=51)
