"""ALI-CFM networks, paths and losses: endpoint exactness, jvp targets, GAN losses on hand-worked
cases, gradient isolation, the regularisers, the baselines' paths against scipy, and shapes.

Tolerances are float32's: where a test compares two routes to one number it says why the
bound is what it is; equalities that hold bit for bit (endpoints, zero corrections) are exact.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.interpolate import CubicSpline

from core.errors import ConfigError
from methods.ali_cfm import losses, nets, paths

KEY = jax.random.PRNGKey(0)
softplus = lambda a: float(np.log1p(np.exp(a)))

# Jitted once per shape: eager mode compiles every primitive separately, several times slower.
d_loss = jax.jit(losses.d_loss, static_argnames="gan")
g_loss = jax.jit(losses.g_loss, static_argnames=("gan", "reg", "num_t", "h"))
second_derivative_reg = jax.jit(losses.second_derivative_reg, static_argnames="h")


def _keys(n, seed=0):
    return jax.random.split(jax.random.PRNGKey(seed), n)


def _batch(D, B=6, seed=1):
    """x0, x1, xt in [-1, 1]^D and intermediate times in (0.1, 0.9)."""
    k = _keys(4, seed)
    x0, x1, xt = (jax.random.uniform(k[i], (B, D), minval=-1, maxval=1) for i in range(3))
    return x0, x1, xt, jax.random.uniform(k[3], (B,), minval=0.1, maxval=0.9)


def _set_last(params, bias=None):
    """f's last layer zeroed (f = 0: G is the linear interpolant), or f = `bias` everywhere."""
    last = f"dense_{len(params) - 1}"
    kernel = jnp.zeros_like(params[last]["kernel"])
    b = jnp.zeros_like(params[last]["bias"]) if bias is None else jnp.asarray(bias, jnp.float32)
    return {**params, last: {"kernel": kernel, "bias": b}}


def _linear(x0, x1, t):
    return t[:, None] * x1 + (1 - t[:, None]) * x0


# ---------------------------------------------------------------------------------------------
# The interpolant


@pytest.mark.parametrize("D", [1, 2, 11])
def test_interpolant_hits_the_endpoints_exactly(D):
    g = nets.init_interpolant(KEY, D)
    x0, x1, _, _ = _batch(D)
    x0, x1 = 3 * x0, 5 * x1  # scale so a rounding slip (x0 + t (x1 - x0)) would show
    for rng in (None, KEY):  # the t-noise enters f alone, so training G is pinned too
        np.testing.assert_array_equal(nets.interpolant(g, x0, x1, 0.0, rng), x0)
        np.testing.assert_array_equal(nets.interpolant(g, x0, x1, 1.0, rng), x1)


def test_zero_correction_is_the_linear_interpolant():
    g = _set_last(nets.init_interpolant(KEY, 2))
    x0, x1, _, t = _batch(2)
    for rng in (None, KEY):  # adding t (1 - t) * 0 is exact
        np.testing.assert_array_equal(nets.interpolant(g, x0, x1, t, rng), _linear(x0, x1, t))


def test_t_noise_only_with_rng_and_only_in_f():
    g = nets.init_interpolant(KEY, 2)
    x0, x1, _, t = _batch(2)
    clean = nets.interpolant(g, x0, x1, t)
    np.testing.assert_array_equal(clean, nets.interpolant(g, x0, x1, t))  # deterministic
    k = jax.random.PRNGKey(7)
    noisy = nets.interpolant(g, x0, x1, t, rng=k)
    assert not np.allclose(noisy, clean, rtol=0, atol=1e-7)
    np.testing.assert_array_equal(noisy, nets.interpolant(g, x0, x1, t, rng=k))
    np.testing.assert_array_equal(nets.interpolant(g, x0, x1, t, rng=k, t_smooth=0.0), clean)
    # By hand: f reads t + 0.01 N(0, 1), the interpolation weights keep the clean t.
    t_in = t + 0.01 * jax.random.normal(k, t.shape)
    f = nets.mlp(g, jnp.concatenate([x0, x1, t_in[:, None]], -1), jax.nn.elu)
    expected = _linear(x0, x1, t) + (t * (1 - t))[:, None] * f
    np.testing.assert_allclose(noisy, expected, rtol=1e-6, atol=1e-6)  # op order only


@pytest.mark.parametrize("D", [1, 2, 11])
def test_velocity_by_jvp_matches_central_difference(D):
    g = nets.init_interpolant(KEY, D)
    x0, x1, _, t = _batch(D)
    x, u = nets.interpolant_with_velocity(g, x0, x1, t)
    np.testing.assert_array_equal(x, nets.interpolant(g, x0, x1, t))
    # Central difference at h = 1e-2: truncation h^2/6 |G'''| ~ 2e-5 |G'''|, rounding
    # ~2 eps |G| / (2h) ~ 2e-5 for |G| <= 2; atol 5e-4 leaves room for |G'''| up to ~20.
    # Dropping the (1 - 2t) f or t (1 - t) df/dt term errs by ~0.1.
    h = 1e-2
    fd = (nets.interpolant(g, x0, x1, t + h) - nets.interpolant(g, x0, x1, t - h)) / (2 * h)
    np.testing.assert_allclose(u, fd, rtol=0, atol=5e-4)
    _, u_lin = nets.interpolant_with_velocity(_set_last(g), x0, x1, t)
    np.testing.assert_array_equal(u_lin, x1 - x0)  # f = 0 and df/dt = 0 exactly


# ---------------------------------------------------------------------------------------------
# GAN losses


def _identity_d():
    """A 1-D discriminator of width 1 with D(x, t) = x for x > 0 (ELU is the identity there)."""
    zero = jnp.zeros((1,))
    return {
        "dense_0": {"kernel": jnp.array([[1.0], [0.0]]), "bias": zero},  # reads x, not t
        "dense_1": {"kernel": jnp.ones((1, 1)), "bias": zero},
        "dense_2": {"kernel": jnp.ones((1, 1)), "bias": zero},
    }


def test_gan_losses_by_hand():
    d, g = _identity_d(), _set_last(nets.init_interpolant(KEY, 1))  # fake = linear interpolant
    x0, x1 = jnp.array([[1.0], [2.0]]), jnp.array([[3.0], [2.0]])
    t, xt = jnp.array([0.5, 0.25]), jnp.array([[1.5], [3.0]])  # fake = [2, 2], real = [1.5, 3]
    args = (x0, x1, xt, t, KEY)

    def both(gan):
        ld = d_loss(d, g, *args, gan=gan)
        lg, aux = g_loss(g, d, *args, gan=gan, reg="none")
        assert float(aux["reg"]) == 0 and float(lg) == float(aux["adv"])
        return float(ld), float(lg)

    ld, lg = both("rpgan")
    assert ld == pytest.approx((softplus(0.5) + softplus(-1.0)) / 2, rel=1e-6)
    assert lg == pytest.approx((softplus(-0.5) + softplus(1.0)) / 2, rel=1e-6)
    ld, lg = both("vanilla")
    assert ld == pytest.approx((softplus(-1.5) + softplus(-3)) / 2 + softplus(2), rel=1e-6)
    assert lg == pytest.approx(softplus(-2), rel=1e-6)
    # R3GAN: grad of D w.r.t. [x, t] is (1, 0), so r1 = r2 = 0.5, inside the softplus.
    ld, lg = both("r3gan")
    assert ld == pytest.approx((softplus(1.5) + softplus(0.0)) / 2, rel=1e-6)
    assert lg == pytest.approx((softplus(-0.5) + softplus(1.0)) / 2, rel=1e-6)
    with pytest.raises(ConfigError, match="gan="):
        d_loss(d, g, *args, gan="wgan")


def test_r3gan_penalty_is_per_row():
    """By hand with D(x) = elu(elu(x)), whose slope differs by row (1 for x > 0, ~0.02 at -3).
    Each row's logit gap gets its own penalty; the official [B, 1] + [B] broadcast, which pairs
    every gap with every row's penalty, would give a different mean here (0.753 vs 0.693)."""
    d, g = _identity_d(), _set_last(nets.init_interpolant(KEY, 1))
    x01, xt, t = jnp.array([[1.0], [-3.0]]), jnp.array([[2.0], [-3.0]]), jnp.array([0.5, 0.5])
    elu = lambda z: z if z > 0 else np.expm1(z)
    slope = lambda z: (1 if elu(z) > 0 else np.exp(elu(z))) * (1 if z > 0 else np.exp(z))
    rows = []
    for fake, real in ((1.0, 2.0), (-3.0, -3.0)):  # fake = x0 = x1 (f = 0)
        penalty = 0.5 * (slope(real) ** 2 + slope(fake) ** 2)  # dD/dt = 0
        rows.append(softplus(elu(elu(fake)) - elu(elu(real)) + penalty))
    got = d_loss(d, g, x01, x01, xt, t, KEY, gan="r3gan")
    assert float(got) == pytest.approx(np.mean(rows), rel=1e-6)


@pytest.mark.parametrize("gan", losses.GANS)
def test_each_loss_trains_only_its_own_network(gan):
    k = _keys(2, 4)
    d, g = nets.init_discriminator(k[0], 2, 8), nets.init_interpolant(k[1], 2, 8)
    x0, x1, xt, t = _batch(2)
    grad_d = jax.jit(jax.grad(losses.d_loss, argnums=(0, 1)), static_argnames="gan")
    grad_g = jax.jit(jax.grad(losses.g_loss, argnums=(0, 1), has_aux=True), static_argnames="gan")
    gd = grad_d(d, g, x0, x1, xt, t, KEY, gan=gan)
    gg, _ = grad_g(g, d, x0, x1, xt, t, KEY, gan=gan)  # (grads, aux)
    for trained, frozen in (gd, gg):
        # Some leaves may be 0 (the relativistic loss cancels D's last bias), not all.
        assert any(np.any(leaf != 0) for leaf in jax.tree.leaves(trained))
        assert all(np.all(leaf == 0) for leaf in jax.tree.leaves(frozen))


# ---------------------------------------------------------------------------------------------
# Regularisers and pretraining


def test_linear_reg_sums_dims_and_means_batch():
    g = nets.init_interpolant(KEY, 2)
    x0, x1, xt, t = _batch(2)
    fake = nets.interpolant(g, x0, x1, t, rng=KEY)
    expected = np.mean(np.sum(np.asarray(fake - _linear(x0, x1, t)) ** 2, axis=1))
    assert float(losses.linear_reg(fake, x0, x1, t)) == pytest.approx(expected, rel=1e-5)
    g0 = _set_last(g)
    _, aux = g_loss(g0, nets.init_discriminator(KEY, 2), x0, x1, xt, t, KEY, reg="linear")
    assert float(aux["reg"]) == 0.0


def test_piecewise_reference_hits_the_knots_and_reg_by_hand():
    x0, x1, xt, t = _batch(3)
    knots = jnp.stack([x0, xt, x1])
    times = jnp.stack([jnp.zeros_like(t), t, jnp.ones_like(t)], axis=1)  # per-row knot times
    for s, x in ((jnp.zeros_like(t), x0), (t, xt), (jnp.ones_like(t), x1)):
        np.testing.assert_array_equal(paths.piecewise_linear(knots, times, s)[0], x)
    mid, u = paths.piecewise_linear(knots, times, t / 2)
    np.testing.assert_allclose(mid, (x0 + xt) / 2, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(u, (xt - x0) / t[:, None], rtol=1e-5, atol=1e-5)
    # By hand, G = 0 (x0 = x1 = 0, f = 0), xt = c at t = 0.5: ref(s) = c min(s, 1 - s) / 0.5.
    g, zero, c = _set_last(nets.init_interpolant(KEY, 1)), jnp.zeros((3, 1)), 2.0
    s = jnp.array([0.25, 0.75, 0.5])
    got = losses.piecewise_reg(g, zero, zero, jnp.full((3, 1), c), 0.5, s)
    assert float(got) == pytest.approx((0.25 + 0.25 + 1) / 3 * c**2, rel=1e-6)


@pytest.mark.parametrize("D", [1, 11])
def test_second_derivative_reg(D):
    g, B = nets.init_interpolant(KEY, D), 64
    x0, x1, _, _ = _batch(D, B)
    s = losses.stratified_times(KEY, losses.NUM_T, B)
    assert np.all((s >= np.arange(3)[:, None] / 3) & (s < (np.arange(3)[:, None] + 1) / 3))
    lin = second_derivative_reg(_set_last(g), x0, x1, s)
    # Float32 floor of the official h = 1e-3 difference: ~4 roundings of |G| <= 1 (and of
    # s +- h) at 6e-8 each over h^2 = 1e-6 gives |error| <= ~0.24 per element, squared and
    # summed over 3 times and D dims: <= 0.2 D (0.008 D seen). Exact jvp: 0 for a line.
    assert 0 <= float(lin) < 0.2 * D
    assert float(second_derivative_reg(_set_last(g), x0, x1, s, h=None)) == 0.0
    # f = 1: G = line + t (1 - t), G'' = -2 in each dim: energy 3 times * D dims * 4 = 12 D.
    curved = _set_last(g, jnp.ones(D))
    exact = second_derivative_reg(curved, x0, x1, s, h=None)
    assert float(exact) == pytest.approx(12 * D, rel=1e-6)
    # The rounding errors average over B * 3 * D terms (0.15% seen); 2% still catches a wrong
    # sum/mean over dims or times (x D, x 3) or h for h^2.
    assert float(second_derivative_reg(curved, x0, x1, s)) == pytest.approx(12 * D, rel=0.02)


@pytest.mark.parametrize("reg", ["piecewise", "second_derivative"])
def test_g_loss_adds_the_weighted_regulariser(reg):
    """The regulariser's times come from fold_in(rng, 1) (documented); G runs without t-noise."""
    k = _keys(2, 8)
    g, d = nets.init_interpolant(k[0], 2), nets.init_discriminator(k[1], 2)
    x0, x1, xt, t = _batch(2)
    lg, aux = g_loss(g, d, x0, x1, xt, t, KEY, reg=reg, reg_weight=0.5)
    assert float(lg) == pytest.approx(float(aux["adv"] + 0.5 * aux["reg"]), rel=1e-6)
    key = jax.random.fold_in(KEY, 1)
    if reg == "piecewise":
        s = jax.random.uniform(key, t.shape)
        expected = losses.piecewise_reg(g, x0, x1, xt, t, s)
    else:
        expected = second_derivative_reg(g, x0, x1, losses.stratified_times(key, 3, len(t)))
    assert float(aux["reg"]) == pytest.approx(float(expected), rel=1e-5)
    assert float(aux["reg"]) > 0
    with pytest.raises(ConfigError, match="reg="):
        g_loss(g, d, x0, x1, xt, t, KEY, reg="length")


def test_pretrain_loss_is_the_mean_squared_regression():
    g = nets.init_interpolant(KEY, 2)
    x0, x1, xt, t = _batch(2)
    fake = nets.interpolant(g, x0, x1, t, rng=KEY)
    expected = np.mean((np.asarray(fake) - np.asarray(xt)) ** 2)
    assert float(losses.pretrain_loss(g, x0, x1, xt, t, KEY)) == pytest.approx(expected, rel=1e-6)
    on_line = _linear(x0, x1, t)
    assert float(losses.pretrain_loss(_set_last(g), x0, x1, on_line, t, KEY)) == 0.0


# ---------------------------------------------------------------------------------------------
# Flow matching: ALI-CFM's stage 2 and the baselines


def test_cfm_loss_on_the_frozen_interpolant():
    k = _keys(2, 5)
    g, v = nets.init_interpolant(k[0], 2), nets.init_velocity(k[1], 2)
    x0, x1, _, t = _batch(2)
    x, u = nets.interpolant_with_velocity(g, x0, x1, t)
    expected = np.mean((np.asarray(nets.velocity(v, x, t)) - np.asarray(u)) ** 2)
    assert float(losses.cfm_loss(v, g, x0, x1, t)) == pytest.approx(expected, rel=1e-6)
    grad_g = jax.grad(losses.cfm_loss, argnums=1)(v, g, x0, x1, t)
    assert all(np.all(leaf == 0) for leaf in jax.tree.leaves(grad_g))
    # With f = 0 the path and target are I-CFM's: x_t on the line, u_t = x1 - x0.
    lin = losses.cfm_loss(v, _set_last(g), x0, x1, t)
    assert float(lin) == pytest.approx(float(losses.icfm_loss(v, x0, x1, t)), rel=1e-6)


def test_linear_path_sigma():
    x0, x1, xt, t = _batch(2)
    x, u = paths.linear_path(x0, x1, t, sigma=0.1, eps_BD=xt)
    np.testing.assert_allclose(x, _linear(x0, x1, t) + 0.1 * xt, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(u, x1 - x0)


@pytest.mark.parametrize("K", [2, 3, 5])  # scipy special-cases 2 and 3
def test_paths_match_numpy_and_scipy(K):
    """Knot times spaced >= 0.1 apart: the spline's float32 solve then agrees with scipy's
    float64 to ~1e-5 on O(1) data (closely spaced knots blow its slopes up); t includes knots."""
    rng = np.random.default_rng(K)
    times = np.linspace(0, 1, K) + np.r_[0, rng.uniform(-0.05, 0.05, K - 2), 0]
    times = times.astype(np.float32)
    knots = rng.normal(size=(K, 5, 2)).astype(np.float32)
    t = np.r_[rng.uniform(0, 1, 3), times[1], 1.0].astype(np.float32)
    x, u = paths.piecewise_linear(jnp.asarray(knots), times, jnp.asarray(t))
    for b in range(5):
        for d in range(2):
            assert x[b, d] == pytest.approx(np.interp(t[b], times, knots[:, b, d]), abs=1e-6)
        i = min(max(np.searchsorted(times, t[b]) - 1, 0), K - 2)  # knot ends the segment before
        gap = (knots[i + 1, b] - knots[i, b]) / (times[i + 1] - times[i])
        np.testing.assert_allclose(u[b], gap, rtol=1e-5, atol=1e-5)
    x, u = paths.cubic_spline(jnp.asarray(knots), times, jnp.asarray(t))
    spline = CubicSpline(times.astype(np.float64), knots.astype(np.float64), axis=0)
    rows = np.arange(5)
    np.testing.assert_allclose(x, spline(t)[rows, rows], rtol=0, atol=1e-5)
    np.testing.assert_allclose(u, spline(t, 1)[rows, rows], rtol=0, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# Shapes


@pytest.mark.parametrize("D", [1, 2, 11])
def test_shapes(D):
    """Traced, not run (jax.eval_shape: no compiles); the values are tested above."""
    k, B = _keys(3, 6), 5
    g, d = nets.init_interpolant(k[0], D), nets.init_discriminator(k[1], D)
    v = nets.init_velocity(k[2], D)
    assert {a.shape for a in jax.tree.leaves(g["dense_2"])} == {(64, D), (D,)}
    x0, x1, xt, t = _batch(D, B)
    knots, times = jnp.stack([x0, xt, x1]), jnp.array([0.0, 0.4, 1.0])
    shape = lambda f, *args, **kw: jax.eval_shape(lambda: f(*args, **kw)).shape
    assert shape(nets.interpolant, g, x0, x1, t, rng=KEY) == (B, D)
    assert shape(nets.discriminator, d, xt, t) == (B,)
    assert shape(nets.velocity, v, xt, t) == (B, D)
    for path in (paths.piecewise_linear, paths.cubic_spline):
        assert jax.eval_shape(path, knots, times, t)[1].shape == (B, D)
    scalars = [shape(losses.d_loss, d, g, x0, x1, xt, 0.4, KEY, gan=gan) for gan in losses.GANS] + [
        shape(lambda r: losses.g_loss(g, d, x0, x1, xt, 0.4, KEY, reg=r)[0], r)
        for r in losses.REGULARISERS
    ]
    scalars += [shape(losses.pretrain_loss, g, x0, x1, xt, t, KEY)]
    scalars += [shape(losses.cfm_loss, v, g, x0, x1, t), shape(losses.icfm_loss, v, x0, x1, t)]
    scalars += [shape(f, v, knots, times, t) for f in (losses.piecewise_cfm_loss, losses.mmfm_loss)]
    assert scalars == [()] * len(scalars)
