"""FTRL with the truncated-entropy regulariser, solved each round by Frank-Wolfe over an oracle.

Round t (1-based) of the hybrid game: the learner holds the samples x_1..x_{t-1} and the label
functions r_2..r_{t-1} it has seen. Round j's empirical loss uses the samples before it only,
l~_j(h) = 1/(j-1) sum_{s<j} l(h(x_s), r_j(x_s)), and h_t is an approximate minimiser over
conv(H) of

    F_t(h) = sum_{j<t} l~_j(h) + (1/eta) sum_{s<t} h(x_s) log(h(x_s) + 1),

eta = sqrt(T / (L^2 log T)). Labels are binary, so sum_j l~_j(h) = sum_s W0_s l(h(x_s), 0) +
W1_s l(h(x_s), 1) with two running weights per stored sample (`Buffer`): round t adds 1/(t-1)
to one of them for every s < t, O(t) per round instead of re-summing O(t^2) pairs.

Frank-Wolfe minimises G = eta F_t over K = conv{(h(x_s))_s : h in H} with gamma_k = 2/(k+1),
from the empty hypothesis, and stops at the first duality gap <= eta * epsilon (or after
`max_iters` oracle calls: counted as a violation). Each iterate is a mixture of the oracle's
answers; its weights are kept per sorted sample position (`Mixture`), so the prediction at a
new point is the mixture's value (improper: never a sampled threshold).

All buffers have a fixed size T_max (padding: x = +inf, weights 0), so one compiled program
serves every round; the samples are kept sorted (an insertion per round), so an oracle call is
one cumulative sum.
"""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from methods.hybrid_online.classes import LOSSES, ORACLES, Label, Mixture, labels_at, mixture_at


class Buffer(NamedTuple):
    """The samples seen so far, sorted, with their two label weights."""

    x: jax.Array  # [T_max] sorted; +inf past n
    w0: jax.Array  # [T_max] sum over past rounds j > s of [r_j(x_s) = 0] / (j - 1)
    w1: jax.Array  # [T_max] the same for label 1
    n: jax.Array  # int: samples stored (t - 1 during round t)


class Settings(NamedTuple):
    """Static: the horizon and everything derived from it."""

    T: int
    eta: float
    epsilon: float  # duality-gap tolerance on F_t (G = eta F_t stops at eta * epsilon)
    max_iters: int
    h_class: str = "thresholds"
    loss: str = "squared"


def theory_eta(T: int, lipschitz: float) -> float:
    """eta = sqrt(T / (L^2 log T))."""
    return math.sqrt(T / (lipschitz**2 * math.log(T)))


def settings(
    T: int,
    *,
    h_class: str = "thresholds",
    loss: str = "squared",
    eta_scale: float = 1.0,
    gap_scale: float = 1.0,
    max_iters: int = 100_000,
) -> Settings:
    """The paper's step sizes at horizon T. The gap tolerance is epsilon = gap_scale / eta on
    F_t (1/(eta T) on the objective normalised by T; README, "Choices")."""
    eta = eta_scale * theory_eta(T, LOSSES[loss].lipschitz)
    return Settings(T, eta, gap_scale / eta, max_iters, h_class, loss)


def empty_buffer(T_max: int, dtype) -> Buffer:
    zeros = jnp.zeros((T_max,), dtype)
    return Buffer(jnp.full((T_max,), jnp.inf, dtype), zeros, zeros, jnp.zeros((), jnp.int32))


def valid(buffer: Buffer) -> jax.Array:
    return jnp.arange(buffer.x.shape[0]) < buffer.n


def insert_at(a_N, pos, value):
    """`a_N` with `value` at `pos` and the entries from `pos` on shifted right by one (the last
    falls off: it is padding while n < T_max)."""
    idx = jnp.arange(a_N.shape[0])
    return jnp.where(idx < pos, a_N, jnp.where(idx == pos, value, jnp.roll(a_N, 1)))


def add_round(buffer: Buffer, x_t, r_t: Label) -> tuple[Buffer, jax.Array]:
    """End of round t: l~_t (labels of r_t on the stored samples s < t, weight 1/(t-1)) joins
    the weights, then x_t is stored with weights 0 (it enters l~_j for j > t only). Returns
    the buffer and x_t's sorted position (for callers keeping per-position arrays)."""
    mask = valid(buffer)
    y = labels_at(r_t, buffer.x)
    weight = jnp.where(buffer.n > 0, 1.0 / jnp.maximum(buffer.n, 1), 0.0).astype(buffer.x.dtype)
    w0 = buffer.w0 + jnp.where(mask, (1 - y) * weight, 0)
    w1 = buffer.w1 + jnp.where(mask, y * weight, 0)
    pos = jnp.searchsorted(buffer.x, x_t, side="right")
    zero = jnp.zeros((), buffer.x.dtype)
    stored = Buffer(
        insert_at(buffer.x, pos, x_t),
        insert_at(w0, pos, zero),
        insert_at(w1, pos, zero),
        buffer.n + 1,
    )
    return stored, pos


# ------------------------------------------------------------------------------ FTRL-FW


def objective(buffer: Buffer, z_N, s: Settings):
    """G(z) = eta * F_t at the values z_s = h(x_s) (two weights per sample, O(t))."""
    loss = LOSSES[s.loss]
    per_sample = s.eta * (buffer.w0 * loss.value(z_N, 0.0) + buffer.w1 * loss.value(z_N, 1.0))
    per_sample = per_sample + z_N * jnp.log1p(z_N)
    return jnp.sum(jnp.where(valid(buffer), per_sample, 0))


def gradient(buffer: Buffer, z_N, s: Settings):
    """dG/dz_s = eta (W0_s dl(z_s, 0) + W1_s dl(z_s, 1)) + log(z_s + 1) + z_s / (z_s + 1)."""
    loss = LOSSES[s.loss]
    c = s.eta * (buffer.w0 * loss.grad(z_N, 0.0) + buffer.w1 * loss.grad(z_N, 1.0))
    c = c + jnp.log1p(z_N) + z_N / (z_N + 1)
    return jnp.where(valid(buffer), c, 0)


class Solution(NamedTuple):
    z: jax.Array  # [T_max] h_t at the stored samples
    up: jax.Array  # [T_max] mixture weight of "x >= x_(i)" (a threshold or interval start)
    down: jax.Array  # [T_max] mixture weight of "x > x_(i)" (an interval end)
    gap: jax.Array  # the last duality gap of G
    calls: jax.Array  # oracle calls made


def frank_wolfe(buffer: Buffer, s: Settings) -> Solution:
    """min G over conv(H) on the stored samples: gamma_k = 2/(k+1) from the empty hypothesis,
    stopping at the first gap <= eta * epsilon (the gap bounds G(z) - min G from above)."""
    oracle = ORACLES[s.h_class]
    mask = valid(buffer)
    N = buffer.x.shape[0]
    idx = jnp.arange(N)
    tolerance = s.eta * s.epsilon

    def look(z):
        c = gradient(buffer, z, s)
        vertex = oracle(c, mask)
        return vertex, jnp.sum(c * z) - vertex.cost

    def cond(carry):
        k, _, _, _, _, gap = carry
        return (gap > tolerance) & (k < s.max_iters)

    def body(carry):
        k, z, up, down, vertex, _ = carry
        gamma = (2.0 / (k + 1)).astype(z.dtype)
        z = (1 - gamma) * z + gamma * vertex.indicator
        nonempty = vertex.start < buffer.n
        up = (1 - gamma) * up + gamma * ((idx == vertex.start) & nonempty)
        if s.h_class == "intervals":  # thresholds never leave through an end point
            down = (1 - gamma) * down + gamma * ((idx == vertex.end) & nonempty)
        vertex, gap = look(z)
        return k + 1, z, up, down, vertex, gap

    z = jnp.zeros((N,), buffer.x.dtype)
    vertex, gap = look(z)
    k, z, up, down, _, gap = jax.lax.while_loop(
        cond, body, (jnp.ones((), jnp.int32), z, z, z, vertex, gap)
    )
    return Solution(z, up, down, gap, k)


def mixture(buffer: Buffer, solution: Solution) -> Mixture:
    return Mixture(buffer.x, solution.up, buffer.x, solution.down)


class FTRLState(NamedTuple):
    buffer: Buffer
    up_sum: jax.Array  # [T_max] sum over rounds of h_t's up weights (the averaged strategy)
    down_sum: jax.Array


def init(T_max: int, dtype=jnp.float32) -> FTRLState:
    zeros = jnp.zeros((T_max,), dtype)
    return FTRLState(empty_buffer(T_max, dtype), zeros, zeros)


def decide(state: FTRLState, s: Settings) -> tuple[Mixture, Solution]:
    """h_t from the stored samples (x_t is not among them)."""
    solution = frank_wolfe(state.buffer, s)
    return mixture(state.buffer, solution), solution


def update(state: FTRLState, solution: Solution, x_t, r_t: Label) -> FTRLState:
    """Record h_t in the running average, then round t's loss and sample."""
    up_sum, down_sum = state.up_sum + solution.up, state.down_sum + solution.down
    buffer, pos = add_round(state.buffer, x_t, r_t)
    zero = jnp.zeros((), up_sum.dtype)
    return FTRLState(buffer, insert_at(up_sum, pos, zero), insert_at(down_sum, pos, zero))


def step(state: FTRLState, x_t, r_t: Label, s: Settings):
    """One round against a label function fixed before x_t: (state, (prediction, loss,
    solution)). Adaptive adversaries use `decide` and `update` around their own choice."""
    h_t, solution = decide(state, s)
    # A mixture's value is in [0, 1] up to the rounding of its summed weights.
    prediction = jnp.clip(mixture_at(h_t, x_t), 0, 1)
    loss = LOSSES[s.loss].value(prediction, labels_at(r_t, x_t))
    return update(state, solution, x_t, r_t), (prediction, loss, solution)
