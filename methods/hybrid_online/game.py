"""The games corollary: an approximate equilibrium of min_{h in H} max_{r in R} E_x u(h(x), r(x))
from the online learner, oracle-efficiently.

Here u(a, b) = (2a - 1)(2b - 1) (bilinear, so convex-concave and 2-Lipschitz in a), H =
thresholds, R = thresholds and reversed thresholds, x ~ D. With m samples x_1..x_m drawn once,
FTRL-FW plays m rounds on them in order while the adversary answers each h_t with its best
response on the whole sample (one oracle call): an empirical best response. The averaged
strategies h_bar = mean_t h_t (a mixture of thresholds) and r_bar = mean_t r_t (a mixture of
label functions) should form an eps(m)-equilibrium of the game under D, eps(m) =
rad_m + O(L sqrt(log m / m)): their exploitability

    max_r E u(h_bar, r) - min_h E u(h, r_bar)  (>= 0, = 0 at an equilibrium)

is computed here exactly on a quadrature of D (points F^-1((i + 1/2) / n)), by the same oracles.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats

from methods.hybrid_online import learner as ftrl
from methods.hybrid_online import learners
from methods.hybrid_online.classes import (
    LOSSES,
    ORACLES,
    Mixture,
    label_best_response,
    labels_at,
    mixture_at,
    sample_x,
)
from methods.hybrid_online.simulate import rounds

PAYOFF = LOSSES["bilinear"]
QUADRATURE = 4096  # points: the exploitability's quadrature error is O(1/QUADRATURE)


def quadrature(distribution: str, n: int = QUADRATURE) -> np.ndarray:
    """n points with equal mass 1/n under D: its quantiles at (i + 1/2) / n."""
    u = (np.arange(n) + 0.5) / n
    return u if distribution == "uniform" else scipy.stats.beta(2, 5).ppf(u)


def exploitability(h_bar: Mixture, r_bar_Q, q_Q):
    """max_r E u(h_bar, r) - min_h E u(h, r_bar) on the quadrature points q_Q (sorted)."""
    all_points = jnp.ones(q_Q.shape, bool)
    a_Q = jnp.clip(mixture_at(h_bar, q_Q), 0, 1)  # rounding of summed weights
    # max_r sum u(a, r) = sum u(a, 0) - min_r sum r (u(a, 0) - u(a, 1))
    c_r = PAYOFF.value(a_Q, 0.0) - PAYOFF.value(a_Q, 1.0)
    _, cost_r = label_best_response(c_r, q_Q, all_points, "thresholds")
    best_r = jnp.sum(PAYOFF.value(a_Q, 0.0)) - cost_r
    # u is linear in b, so E_r u(h, r) = u(h, r_bar); min over proper h: one oracle call.
    zero, one = PAYOFF.value(0.0, r_bar_Q), PAYOFF.value(1.0, r_bar_Q)
    best_h = jnp.sum(zero) + ORACLES["thresholds"](one - zero, all_points).cost
    return (best_r - best_h) / q_Q.shape[0]


@functools.partial(jax.jit, static_argnames=("m", "distribution"))
def play(key, q_Q, *, m: int, distribution: str):
    """(exploitability of the averaged strategies, oracle calls) for one seed's m samples."""
    s = ftrl.settings(m, loss="bilinear")
    k_x, k_rounds = jax.random.split(key)
    x_M = sample_x(k_x, (m,), distribution, q_Q.dtype)
    x_sorted = jnp.sort(x_M)
    every = jnp.ones((m,), bool)

    def best_response(seen: Mixture, key):
        a = jnp.clip(mixture_at(seen, x_sorted), 0, 1)
        c = PAYOFF.value(a, 0.0) - PAYOFF.value(a, 1.0)
        return label_best_response(c, x_sorted, every, "thresholds")[0]

    keys_M = jax.random.split(k_rounds, m)
    run = rounds(
        learners.ftrl_fw(s), best_response, keys_M, x_M, loss="bilinear", h_class="thresholds"
    )
    final = run.state
    h_bar = Mixture(final.buffer.x, final.up_sum / m, final.buffer.x, final.down_sum / m)
    r_bar_Q = jnp.mean(jax.vmap(lambda r: labels_at(r, q_Q))(run.r_T), axis=0)
    return exploitability(h_bar, r_bar_Q, q_Q), jnp.sum(run.calls_T)
