"""Adversaries and one run of the hybrid game: T rounds as one `lax.scan`, then the regret.

Each round: the learner decides h_t; the adversary picks r_t in R without seeing x_t;
x_t ~ D; the learner suffers l(h_t(x_t), r_t(x_t)) and observes (x_t, r_t). Adversaries:
- "oblivious": r_t uniform in R (a threshold at U[0, 1] with a random orientation, or an
  interval between two U[0, 1] points), whatever the learner does;
- "adaptive": the anti-learner, r_t = argmax_{r in R} of the learner's mean loss on a fresh
  sample of `fresh` points from D (an exact oracle call on the sorted fresh sample);
- "two_function": of r_a = 1[x >= 1/2] and r_b = 1[x < 1/2], the one with the larger loss on
  the fresh sample: against FTL it alternates between them (the FTL-killer).

Regret = sum_t l(h_t(x_t), y_t) - min_{h in H} sum_t l(h(x_t), y_t), the minimum exact
(`classes.best_fixed_loss`: a sort and one oracle call).
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from methods.hybrid_online import learner as ftrl
from methods.hybrid_online import learners
from methods.hybrid_online.classes import (
    LOSSES,
    Label,
    best_fixed_loss,
    label_best_response,
    labels_at,
    mixture_at,
    sample_x,
)
from methods.hybrid_online.learners import Learner

ADVERSARIES = ("oblivious", "adaptive", "two_function")
FRESH = 200  # the adaptive adversaries' fresh sample per round


def adversary(name: str, *, distribution: str, loss: str, r_class: str, fresh: int = FRESH):
    """`choose(seen: Mixture, key) -> Label`."""
    value = LOSSES[loss].value

    def oblivious(seen, key):
        a, b, f = jax.random.uniform(key, (3,))
        if r_class == "intervals":
            return Label(jnp.minimum(a, b), jnp.maximum(a, b), jnp.asarray(0))
        return Label(a, jnp.asarray(jnp.inf, a.dtype), (f < 0.5).astype(jnp.int32))

    def fresh_predictions(seen, key):
        x = jnp.sort(sample_x(key, (fresh,), distribution, seen.up_points.dtype))
        return x, jnp.clip(mixture_at(seen, x), 0, 1)  # clip: rounding of summed weights

    def adaptive(seen, key):
        x, p = fresh_predictions(seen, key)
        # max_r sum_i l(p_i, r(x_i)) = sum_i l(p_i, 0) - min_r sum_i r(x_i) (l(p_i, 0) - l(p_i, 1))
        c = value(p, 0.0) - value(p, 1.0)
        return label_best_response(c, x, jnp.ones(x.shape, bool), r_class)[0]

    def two_function(seen, key):
        x, p = fresh_predictions(seen, key)
        half, inf = jnp.asarray(0.5, x.dtype), jnp.asarray(jnp.inf, x.dtype)
        r_a, r_b = Label(half, inf, jnp.asarray(0)), Label(half, inf, jnp.asarray(1))
        loss_a = jnp.sum(value(p, labels_at(r_a, x)))
        loss_b = jnp.sum(value(p, labels_at(r_b, x)))
        return Label(half, inf, (loss_b > loss_a).astype(jnp.int32))

    choices = {"oblivious": oblivious, "adaptive": adaptive, "two_function": two_function}
    if name not in choices:
        raise ValueError(f"adversary={name!r}; expected one of {ADVERSARIES}")
    return choices[name]


class Run(NamedTuple):
    loss_T: jax.Array  # per round
    label_T: jax.Array  # y_t = r_t(x_t)
    x_T: jax.Array
    r_T: Label  # the adversary's label functions (arrays [T])
    gap_T: jax.Array
    calls_T: jax.Array
    regret: jax.Array
    best_fixed: jax.Array
    state: object  # the learner's final state


class Rounds(NamedTuple):
    """What `play_rounds` records per round (arrays [T])."""

    loss_T: jax.Array
    label_T: jax.Array  # y_t = r_t(x_t)
    r_T: Label
    gap_T: jax.Array
    calls_T: jax.Array


def play_rounds(learner: Learner, choose, state, x_T, keys_T, *, loss: str):
    """Rounds of `learner` (from `state`) against `choose`, x_t = x_T[t] and round t's key
    keys_T[t] (split into the learner's and the adversary's), as one `lax.scan`: the one round
    body of the experiment (`rounds`) and of the core.train Method (`make`'s step, a few rounds
    per step). Returns (the learner's state after them, Rounds)."""
    value = LOSSES[loss].value

    def one_round(state, inputs):
        x_t, k = inputs
        k_learner, k_adversary = jax.random.split(k)
        decision = learner.decide(state, k_learner)
        r_t = choose(decision.seen, k_adversary)  # before x_t is drawn, in the game's order
        y_t = labels_at(r_t, x_t)
        prediction = jnp.clip(mixture_at(decision.play, x_t), 0, 1)  # rounding of weights
        state = learner.update(state, decision.aux, x_t, r_t)
        return state, Rounds(value(prediction, y_t), y_t, r_t, decision.gap, decision.calls)

    return jax.lax.scan(one_round, state, (x_T, keys_T))


def rounds(learner: Learner, choose, keys_T, x_T, *, loss: str, h_class: str) -> Run:
    """The rounds t = 1..T of `learner` against `choose` from its initial state,
    x_t = x_T[t - 1] (drawn by the caller, i.i.d. from D), round t's key keys_T[t - 1]."""
    T = x_T.shape[0]
    state, played = play_rounds(learner, choose, learner.init(T, x_T.dtype), x_T, keys_T, loss=loss)
    best = best_fixed_loss(x_T, played.label_T, LOSSES[loss], h_class)
    return Run(
        played.loss_T,
        played.label_T,
        x_T,
        played.r_T,
        played.gap_T,
        played.calls_T,
        jnp.sum(played.loss_T) - best,
        best,
        state,
    )


class Spec(NamedTuple):
    """One run, hashable (a static argument of the compiled program)."""

    learner: str
    settings: ftrl.Settings
    scale: float  # the learner's rate or perturbation scale (learners.make)
    adversary: str
    distribution: str = "uniform"
    r_class: str = "thresholds"
    dtype: str = "float64"  # float64 needs jax.enable_x64 around the call


@functools.partial(jax.jit, static_argnums=0)
def simulate(spec: Spec, key) -> Run:
    """`rounds` for a spec, compiled once per spec (the seed is the key: an input)."""
    s = spec.settings
    learner = learners.make(spec.learner, s, spec.scale)
    choose = adversary(
        spec.adversary, distribution=spec.distribution, loss=s.loss, r_class=spec.r_class
    )
    k_x, k_rounds = jax.random.split(key)
    x_T = sample_x(k_x, (s.T,), spec.distribution, jnp.dtype(spec.dtype))
    keys_T = jax.random.split(k_rounds, s.T)
    return rounds(learner, choose, keys_T, x_T, loss=s.loss, h_class=s.h_class)
