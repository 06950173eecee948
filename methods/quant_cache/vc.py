"""Variance compensation (VC): one gain per sampler step and image channel that pulls the
quantised + cached sample's spread back to the full-precision run's.

    x_tilde = mu + K * (x_hat - mu)              (per channel, after each denoising step)

x_hat is the Q+C sample, x' the full-precision sample from the same noise, mu the per-channel
mean of x_hat. K minimises J(K) = sum ((x_tilde - x') / x')^2 + sum (x_tilde - x')^2 (the
relative error "rQNSR" plus the MSE, sums over samples and positions of one channel). With
a = x_hat - mu and b = x' - mu, x_tilde - x' = K a - b, so

    J(K) = sum (K a - b)^2 w,   w = 1 + 1 / x'^2,   dJ/dK = 0  ->  K = sum a b w / sum a^2 w

("derived", the default). The paper prints another closed form (via a secondary source):

    K = [sum b a + sum a / x'] / [sum a^2 + sum a^2 / x'^2]                       ("printed")

which does not follow from J (with x_hat = mu + c (x' - mu) it does not return 1 / c); it is
kept as an option. 1 / x' blows up near 0, so |x'| is clamped to at least `eps` (the weight w is
then at most 1 + 1 / eps^2; our default eps = 0.1 caps it at 101).
"""

import jax.numpy as jnp

FORMS = ("derived", "printed")


def _clamped(x_ref, eps):
    """x' with |x'| >= eps, keeping its sign (0 goes to +eps)."""
    return jnp.where(x_ref < 0, -1.0, 1.0) * jnp.maximum(jnp.abs(x_ref), eps)


def gain(x_hat, x_ref, mu_C, *, eps: float = 0.1, form: str = "derived"):
    """K [C]: the per-channel gain from a batch of Q+C samples x_hat [..., C], their paired
    full-precision samples x_ref [..., C] and the channel means mu_C (module docstring)."""
    if form not in FORMS:
        raise ValueError(f"vc form={form!r}; expected one of: {', '.join(FORMS)}")
    if eps <= 0:
        raise ValueError(f"vc eps={eps} must be > 0 (it clamps |x'| away from 0)")
    axes = tuple(range(x_hat.ndim - 1))
    a, b = x_hat - mu_C, x_ref - mu_C
    xr = _clamped(x_ref, eps)
    if form == "derived":
        w = 1.0 + 1.0 / xr**2
        return jnp.sum(a * b * w, axes) / jnp.sum(a * a * w, axes)
    numerator = jnp.sum(b * a, axes) + jnp.sum(a / xr, axes)
    return numerator / (jnp.sum(a * a, axes) + jnp.sum(a * a / xr**2, axes))


def objective(k_C, x_hat, x_ref, mu_C, *, eps: float = 0.1):
    """J(K) per channel [C]: the relative squared error plus the squared error of x_tilde."""
    axes = tuple(range(x_hat.ndim - 1))
    err = compensate(x_hat, mu_C, k_C) - x_ref
    return jnp.sum((err / _clamped(x_ref, eps)) ** 2, axes) + jnp.sum(err**2, axes)


def compensate(x_hat, mu_C, k_C):
    """mu + K (x_hat - mu), per channel (the last axis)."""
    return mu_C + k_C * (x_hat - mu_C)


def channel_mean(x):
    """The per-channel mean [C] over every other axis."""
    return jnp.mean(x, axis=tuple(range(x.ndim - 1)))
