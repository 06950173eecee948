"""The hybrid-optimiser baselines as single optax transformations: SWATS, Padam, AdaBound.

SWATS (Keskar & Socher 2017): Adam, then one switch to SGD with momentum. With p_k the Adam
step and g_k the gradient, when p_k.g_k != 0: gamma_k = p_k.p_k / (-p_k.g_k), an EMA
lam_k = b2 lam_{k-1} + (1 - b2) gamma_k, and the switch happens after step k (k > 1) when
|lam_k / (1 - b2^k) - gamma_k| < eps; SGD then runs with the learning rate
Lambda = lam_k / (1 - b2^k): v = b1 v + g, w -= (1 - b1) Lambda v (the paper's Algorithm 1,
one global criterion rather than per layer).

Padam (Chen et al. 2020): AMSGrad with a partial exponent, w -= lr m_hat / (v_max_hat^p + eps),
p in (0, 1/2] (p = 1/2 is AMSGrad; the paper's default p = 1/8).

AdaBound (Luo et al. 2019): Adam whose per-coordinate step size is clipped into a band that
closes on a final SGD learning rate: with step t, eta = lr sqrt(1 - b2^t) / (1 - b1^t) /
(sqrt(v) + eps), w -= clip(eta, lower_t, upper_t) m, lower_t = final_lr (1 - 1 / (gamma t + 1)),
upper_t = final_lr (1 + 1 / (gamma t)) (the authors' implementation: eps outside the square
root of the uncorrected v, the bias corrections folded into the step size).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax


class SwatsState(NamedTuple):
    adam: optax.ScaleByAdamState
    count: jax.Array  # steps taken
    lam: jax.Array  # the EMA of gamma
    switched: jax.Array  # bool: SGD phase
    sgd_lr: jax.Array
    velocity: optax.Updates


def swats(lr: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, switch_eps=1e-9):
    adam = optax.scale_by_adam(b1=b1, b2=b2, eps=eps)

    def init(params):
        zero = jnp.zeros((), jnp.float32)
        return SwatsState(
            adam.init(params),
            jnp.zeros((), jnp.int32),
            zero,
            jnp.zeros((), bool),
            zero,
            jax.tree.map(jnp.zeros_like, params),
        )

    def update(grads, state, params=None):
        del params
        count = state.count + 1
        scaled, adam_state = adam.update(grads, state.adam)
        p = jax.tree.map(lambda u: -lr * u, scaled)  # the Adam step
        pp = optax.tree.vdot(p, p)
        pg = optax.tree.vdot(p, grads)
        gamma = jnp.where(pg != 0, pp / jnp.where(pg != 0, -pg, 1.0), 0.0)
        lam = jnp.where(pg != 0, b2 * state.lam + (1 - b2) * gamma, state.lam)
        corrected = lam / (1 - b2 ** count.astype(jnp.float32))
        trigger = (count > 1) & (pg != 0) & (jnp.abs(corrected - gamma) < switch_eps)
        velocity = jax.tree.map(lambda v, g: b1 * v + g, state.velocity, grads)
        sgd = jax.tree.map(lambda v: -(1 - b1) * state.sgd_lr * v, velocity)
        updates = jax.tree.map(lambda a, b: jnp.where(state.switched, a, b), sgd, p)
        new = SwatsState(
            adam_state,
            count,
            lam,
            state.switched | trigger,
            jnp.where(state.switched, state.sgd_lr, jnp.where(trigger, corrected, 0.0)),
            jax.tree.map(
                lambda v, z: jnp.where(state.switched, v, z),
                velocity,
                jax.tree.map(jnp.zeros_like, velocity),
            ),
        )
        return updates, new

    return optax.GradientTransformation(init, update)


class PadamState(NamedTuple):
    count: jax.Array
    mu: optax.Updates
    nu: optax.Updates
    nu_max: optax.Updates


def padam(lr: float, partial: float = 0.125, b1=0.9, b2=0.999, eps=1e-8):
    def init(params):
        zeros = lambda: jax.tree.map(jnp.zeros_like, params)
        return PadamState(jnp.zeros((), jnp.int32), zeros(), zeros(), zeros())

    def update(grads, state, params=None):
        del params
        count = state.count + 1
        t = count.astype(jnp.float32)
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, grads)
        nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state.nu, grads)
        nu_max = jax.tree.map(jnp.maximum, state.nu_max, nu)
        updates = jax.tree.map(
            lambda m, v: -lr * (m / (1 - b1**t)) / ((v / (1 - b2**t)) ** partial + eps),
            mu,
            nu_max,
        )
        return updates, PadamState(count, mu, nu, nu_max)

    return optax.GradientTransformation(init, update)


class AdaBoundState(NamedTuple):
    count: jax.Array
    mu: optax.Updates
    nu: optax.Updates


def adabound(lr: float, final_lr: float = 0.1, gamma=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    def init(params):
        zeros = lambda: jax.tree.map(jnp.zeros_like, params)
        return AdaBoundState(jnp.zeros((), jnp.int32), zeros(), zeros())

    def update(grads, state, params=None):
        del params
        count = state.count + 1
        t = count.astype(jnp.float32)
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, grads)
        nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state.nu, grads)
        step_size = lr * jnp.sqrt(1 - b2**t) / (1 - b1**t)
        lower = final_lr * (1 - 1 / (gamma * t + 1))
        upper = final_lr * (1 + 1 / (gamma * t))
        updates = jax.tree.map(
            lambda m, v: -jnp.clip(step_size / (jnp.sqrt(v) + eps), lower, upper) * m, mu, nu
        )
        return updates, AdaBoundState(count, mu, nu)

    return optax.GradientTransformation(init, update)
