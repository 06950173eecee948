"""The online learners behind one interface, for the simulation: FTRL-FW and the baselines.

A `Learner` is four pure functions:
- ``init(T_max, dtype) -> state``;
- ``decide(state, key) -> Decision``: what it plays in a round (`play`, a Mixture), what an
  adaptive adversary sees of it (`seen`: the same, except for FTPL, whose draw is private and
  whose distribution the adversary estimates from other draws), the data `update` needs
  (`aux`) and the round's `gap` and oracle `calls`;
- ``update(state, aux, x_t, r_t) -> state``.

Baselines (H = thresholds or intervals, as the learner's):
- FTL/ERM: the proper minimiser of the same past-sample losses sum_{j<t} l~_j (FTRL with no
  regulariser; one oracle call: l(h, y) is linear in a 0/1 prediction h);
- Hedge over a grid of thresholds i/N (i = 0..N) and the empty one (thresholds only): the
  mixture's value, rate eta_H = scale sqrt(8 log(N + 2) / T);
- FTPL in the style of Wu et al. 2024: the same ERM call with each stored sample's cost
  perturbed by sigma * N(0, 1), sigma = scale * sqrt(T / (t - 1)) (a perturbation of order
  sqrt(T) on a suffix of the t - 1 samples), a fresh draw per round; it plays that proper
  hypothesis.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from methods.hybrid_online import learner as ftrl
from methods.hybrid_online.classes import LOSSES, ORACLES, Label, Mixture, labels_at

LEARNERS = ("ftrl_fw", "ftl", "hedge", "ftpl")
FTPL_DRAWS_SEEN = 8  # draws an adaptive adversary averages to estimate FTPL's distribution


class Decision(NamedTuple):
    play: Mixture
    seen: Mixture
    aux: object
    gap: jax.Array
    calls: jax.Array


class Learner(NamedTuple):
    init: callable
    decide: callable
    update: callable


def _proper_cost(buffer: ftrl.Buffer, loss_name: str):
    """Per-sample cost of predicting 1 instead of 0 under sum_{j<t} l~_j (linear in h)."""
    loss = LOSSES[loss_name]
    one, zero = jnp.ones((), buffer.x.dtype), jnp.zeros((), buffer.x.dtype)
    return buffer.w0 * (loss.value(one, 0.0) - loss.value(zero, 0.0)) + buffer.w1 * (
        loss.value(one, 1.0) - loss.value(zero, 1.0)
    )


def _proper_mixture(buffer: ftrl.Buffer, c_N, h_class: str) -> Mixture:
    """The oracle's proper hypothesis as a one-component mixture on the buffer's points."""
    vertex = ORACLES[h_class](c_N, ftrl.valid(buffer))
    idx = jnp.arange(c_N.shape[0])
    on = (vertex.start < buffer.n).astype(c_N.dtype)
    up = (idx == vertex.start) * on
    down = (idx == vertex.end) * on if h_class == "intervals" else jnp.zeros_like(up)
    return Mixture(buffer.x, up, buffer.x, down)


def _buffer_update(state, aux, x_t, r_t):
    return ftrl.add_round(state, x_t, r_t)[0]


# ------------------------------------------------------------------------------ FTRL-FW


def ftrl_fw(s: ftrl.Settings) -> Learner:
    def decide(state, key):
        h_t, solution = ftrl.decide(state, s)
        return Decision(h_t, h_t, solution, solution.gap, solution.calls)

    def update(state, solution, x_t, r_t):
        return ftrl.update(state, solution, x_t, r_t)

    return Learner(ftrl.init, decide, update)


# ------------------------------------------------------------------------------ FTL


def ftl(s: ftrl.Settings) -> Learner:
    def decide(buffer, key):
        h = _proper_mixture(buffer, _proper_cost(buffer, s.loss), s.h_class)
        return Decision(h, h, None, jnp.zeros((), buffer.x.dtype), jnp.ones((), jnp.int32))

    return Learner(ftrl.empty_buffer, decide, _buffer_update)


# ------------------------------------------------------------------------------ FTPL


def ftpl(s: ftrl.Settings, scale: float) -> Learner:
    def draw(buffer, key):
        sigma = scale * jnp.sqrt(s.T / jnp.maximum(buffer.n, 1).astype(buffer.x.dtype))
        noise = sigma * jax.random.normal(key, buffer.x.shape, buffer.x.dtype)
        return _proper_mixture(buffer, _proper_cost(buffer, s.loss) + noise, s.h_class)

    def decide(buffer, key):
        own, others = jax.random.split(key)
        play = draw(buffer, own)
        draws = jax.vmap(functools.partial(draw, buffer))(jax.random.split(others, FTPL_DRAWS_SEEN))
        # The adversary's estimate of FTPL's distribution: the average of independent draws
        # (their points are the buffer's, so weights average position by position).
        seen = Mixture(buffer.x, draws.up_weights.mean(0), buffer.x, draws.down_weights.mean(0))
        calls = jnp.asarray(1 + FTPL_DRAWS_SEEN, jnp.int32)
        return Decision(play, seen, None, jnp.zeros((), buffer.x.dtype), calls)

    return Learner(ftrl.empty_buffer, decide, _buffer_update)


# ------------------------------------------------------------------------------ Hedge


class HedgeState(NamedTuple):
    log_weights: jax.Array  # [N + 2]
    grid: jax.Array  # [N + 2] thresholds i/N and +inf (the empty hypothesis), sorted


def hedge(s: ftrl.Settings, scale: float, grid_size: int | None = None) -> Learner:
    if s.h_class != "thresholds":
        raise ValueError("Hedge runs over a grid of thresholds only")
    N = grid_size or s.T  # a grid of 1/epsilon thresholds, epsilon = 1/T
    rate = scale * (8 * jnp.log(N + 2.0) / s.T) ** 0.5
    loss = LOSSES[s.loss]

    def init(T_max, dtype=jnp.float32):
        grid = jnp.concatenate(
            [jnp.linspace(0, 1, N + 1, dtype=dtype), jnp.full((1,), jnp.inf, dtype)]
        )
        return HedgeState(jnp.zeros((N + 2,), dtype), grid)

    def decide(state, key):
        w = jax.nn.softmax(state.log_weights)
        h = Mixture(state.grid, w, state.grid, jnp.zeros_like(w))
        zero = jnp.zeros((), w.dtype)
        return Decision(h, h, None, zero, jnp.zeros((), jnp.int32))

    def update(state, aux, x_t, r_t: Label):
        y = labels_at(r_t, x_t)
        expert_losses = loss.value((x_t >= state.grid).astype(x_t.dtype), y)
        return state._replace(log_weights=state.log_weights - rate * expert_losses)

    return Learner(init, decide, update)


def make(name: str, s: ftrl.Settings, scale: float = 1.0) -> Learner:
    """A learner by name; `scale` multiplies its rate (Hedge), perturbation (FTPL) or eta
    (FTRL-FW, already in `s`; FTL has none)."""
    if name == "ftrl_fw":
        return ftrl_fw(s)
    if name == "ftl":
        return ftl(s)
    if name == "hedge":
        return hedge(s, scale)
    if name == "ftpl":
        return ftpl(s, scale)
    raise ValueError(f"learner={name!r}; expected one of {LEARNERS}")
