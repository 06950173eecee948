"""Hypothesis and label classes on X = [0, 1], their exact linear oracles, losses, data.

Every function here works on points sorted in increasing order, padded at the end (`valid_N`
False there); an oracle call is one cumulative sum, O(N).

- Thresholds h(x) = 1[x >= theta]: on sorted points a suffix (or the empty suffix, h = 0).
- Reversed thresholds 1[x < theta]: a prefix, the complement of a suffix.
- Intervals 1[a <= x <= b]: a contiguous run (or empty).

A hypothesis or label function as floats (`Label`): r(x) = flip XOR (lo <= x <= hi); a
threshold is (theta, inf, 0), a reversed one (theta, inf, 1), an interval (a, b, 0), the empty
function (inf, inf, 0). A mixture of thresholds and intervals (`Mixture`) is
h(x) = sum_k up_k 1[x >= p_k] - sum_k down_k 1[x > q_k]: an interval [a, b] puts its weight
up at a and down at b, a threshold up only.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

H_CLASSES = ("thresholds", "intervals")  # the learner's H
R_CLASSES = ("thresholds", "intervals")  # the adversary's R ("thresholds": both orientations)
DISTRIBUTIONS = ("uniform", "beta25")


class Loss(NamedTuple):
    """A loss l(a, y) for a prediction a in [0, 1] and a binary label y, with its derivative
    in a and its Lipschitz constant L in a on [0, 1]."""

    name: str
    value: callable
    grad: callable
    lipschitz: float


LOSSES = {
    "squared": Loss("squared", lambda a, y: (a - y) ** 2, lambda a, y: 2 * (a - y), 2.0),
    # |a - y| on [0, 1] with y binary is a for y = 0 and 1 - a for y = 1: linear in a already,
    # so the linearisation (OCO -> OLO) of the reduction is exact, and smooth for Frank-Wolfe.
    "absolute": Loss("absolute", lambda a, y: a + y - 2 * a * y, lambda a, y: 1 - 2 * y, 1.0),
    # The games corollary's bilinear payoff u(a, b) = (2a - 1)(2b - 1) (min player a).
    "bilinear": Loss(
        "bilinear", lambda a, y: (2 * a - 1) * (2 * y - 1), lambda a, y: 2 * (2 * y - 1), 2.0
    ),
}


class Label(NamedTuple):
    lo: jax.Array
    hi: jax.Array
    flip: jax.Array  # 0 or 1


class Mixture(NamedTuple):
    up_points: jax.Array  # [K] sorted
    up_weights: jax.Array  # [K]
    down_points: jax.Array  # [K] sorted
    down_weights: jax.Array  # [K]


def labels_at(r: Label, x):
    """r(x) in {0, 1} as x's float dtype."""
    inside = (x >= r.lo) & (x <= r.hi)
    return jnp.where(r.flip > 0, ~inside, inside).astype(x.dtype)


def mixture_at(h: Mixture, x):
    """h(x) for any shape of x: cumulative weights at each point's position, O(K + |x| log K)."""
    up = jnp.concatenate([jnp.zeros((1,), h.up_weights.dtype), jnp.cumsum(h.up_weights)])
    down = jnp.concatenate([jnp.zeros((1,), h.down_weights.dtype), jnp.cumsum(h.down_weights)])
    at_least = jnp.searchsorted(h.up_points, x, side="right")  # points p <= x
    below = jnp.searchsorted(h.down_points, x, side="left")  # points q < x
    return up[at_least] - down[below]


def single(lo, hi, dtype, size: int = 1) -> Mixture:
    """The mixture of one interval [lo, hi] (hi = inf: a threshold), weight 1."""
    one = jnp.ones((size,), dtype)
    return Mixture(
        jnp.full((size,), lo, dtype), one / size, jnp.full((size,), hi, dtype), one / size
    )


# ------------------------------------------------------------------------------ oracles


class Vertex(NamedTuple):
    """An oracle's answer on sorted points: the run [start, end] (start = end + 1 = N: empty),
    its indicator and its linear cost sum_s c_s v_s."""

    start: jax.Array
    end: jax.Array
    indicator: jax.Array  # [N] float
    cost: jax.Array


def suffix_oracle(c_N, valid_N) -> Vertex:
    """argmin over suffixes (and the empty one) of the sum of c: thresholds on sorted points."""
    N = c_N.shape[0]
    c_N = jnp.where(valid_N, c_N, 0)
    # sums[i] = sum_{s >= i} c_s for i = 0..N; sums[N] = 0 is the empty suffix (padding adds 0)
    sums = jnp.concatenate([jnp.cumsum(c_N[::-1])[::-1], jnp.zeros((1,), c_N.dtype)])
    n = jnp.sum(valid_N)
    start = jnp.argmin(jnp.where(jnp.arange(N + 1) <= n, sums, jnp.inf))
    start = jnp.where(start >= n, N, start)  # every empty suffix the same: start N
    idx = jnp.arange(N)
    indicator = ((idx >= start) & valid_N).astype(c_N.dtype)
    return Vertex(start, jnp.asarray(N - 1), indicator, sums[jnp.minimum(start, N)])


def interval_oracle(c_N, valid_N) -> Vertex:
    """argmin over contiguous runs (and the empty run) of the sum of c: intervals."""
    N = c_N.shape[0]
    c_N = jnp.where(valid_N, c_N, 0)
    prefix = jnp.concatenate([jnp.zeros((1,), c_N.dtype), jnp.cumsum(c_N)])  # [N + 1]
    best_before = jax.lax.cummax(prefix[:-1])  # max_{i <= e - 1} prefix[i], for end e = 1..N
    runs = prefix[1:] - best_before  # best run ending at e - 1
    runs = jnp.where(valid_N, runs, jnp.inf)
    end = jnp.argmin(runs)
    best = runs[end]
    start = jnp.argmax(jnp.where(jnp.arange(N + 1) <= end, prefix, -jnp.inf))
    empty = best >= 0
    start, end = jnp.where(empty, N, start), jnp.where(empty, N - 1, end)
    idx = jnp.arange(N)
    indicator = ((idx >= start) & (idx <= end)).astype(c_N.dtype)
    return Vertex(start, end, indicator, jnp.where(empty, 0, best).astype(c_N.dtype))


ORACLES = {"thresholds": suffix_oracle, "intervals": interval_oracle}


def label_best_response(c_N, x_N, valid_N, r_class: str) -> tuple[Label, jax.Array]:
    """The label function of R minimising sum_s c_s r(x_s) on sorted points, and that sum.
    R = "thresholds": thresholds and reversed thresholds (a prefix = everything minus a
    suffix, so the best prefix is the total minus the best suffix the other way round)."""
    inf = jnp.asarray(jnp.inf, x_N.dtype)
    N = x_N.shape[0]
    point = lambda i: jnp.where(i < N, x_N[jnp.minimum(i, N - 1)], inf)
    if r_class == "intervals":
        v = interval_oracle(c_N, valid_N)
        return Label(point(v.start), point(v.end), jnp.asarray(0)), v.cost
    total = jnp.sum(jnp.where(valid_N, c_N, 0))
    up, down = suffix_oracle(c_N, valid_N), suffix_oracle(-c_N, valid_N)
    reversed_cost = total + down.cost  # sum over the complement of the suffix `down`
    use_up = up.cost <= reversed_cost
    lo = jnp.where(use_up, point(up.start), point(down.start))
    return Label(lo, inf, jnp.where(use_up, 0, 1)), jnp.minimum(up.cost, reversed_cost)


def best_fixed_loss(x_T, y_T, loss: Loss, h_class: str, valid_T=None):
    """min over h in H of sum_t l(h(x_t), y_t) over the valid rounds, exactly: h(x) is 0 or 1,
    so the sum is sum_t l(0, y_t) plus a linear cost sum_t h(x_t) (l(1, y_t) - l(0, y_t)),
    which the oracle minimises on the sorted points."""
    valid_T = jnp.ones(x_T.shape, bool) if valid_T is None else valid_T
    order = jnp.argsort(jnp.where(valid_T, x_T, jnp.inf))
    y, valid = y_T[order], valid_T[order]
    zero, one = loss.value(jnp.zeros_like(y), y), loss.value(jnp.ones_like(y), y)
    vertex = ORACLES[h_class](one - zero, valid)
    return jnp.sum(jnp.where(valid, zero, 0)) + vertex.cost


# ------------------------------------------------------------------------------ data


def sample_x(key, shape, distribution: str, dtype):
    if distribution == "uniform":
        return jax.random.uniform(key, shape, dtype)
    if distribution == "beta25":
        return jax.random.beta(key, 2.0, 5.0, shape, dtype)
    raise ValueError(f"distribution={distribution!r}; expected one of {DISTRIBUTIONS}")
