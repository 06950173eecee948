"""The learner in plain NumPy (float64), written from our reading of the paper, not from learner.py:
the tests compare the two, and the benchmark times them on the same rounds.

Samples live in arrival order; each round sorts them (`np.argsort`), so nothing is shared with
the JAX buffers. Also the O(t^2) objective of the definition (every past round's empirical loss
re-summed), which the two-weight bookkeeping must equal.
"""

import math

import numpy as np

LOSS_VALUE = {
    "squared": lambda a, y: (a - y) ** 2,
    "absolute": lambda a, y: np.abs(a - y),
    "bilinear": lambda a, y: (2 * a - 1) * (2 * y - 1),
}
LOSS_GRAD = {
    "squared": lambda a, y: 2 * (a - y),
    "absolute": lambda a, y: 1 - 2 * y + 0 * a,  # d|a - y|/da on [0, 1] for binary y
    "bilinear": lambda a, y: 2 * (2 * y - 1) + 0 * a,
}


def label(r, x):
    """r = (lo, hi, flip): flip XOR (lo <= x <= hi)."""
    lo, hi, flip = r
    inside = (x >= lo) & (x <= hi)
    return (~inside if flip else inside).astype(np.float64)


def naive_objective(z_by_sample, xs, rs, eta, loss="squared"):
    """eta * F_t(h) from the definition, at h(x_s) = z_by_sample[s] for s < t = len(xs) + 1:
    sum over rounds j = 2..t-1 of 1/(j-1) sum_{s<j} l(h(x_s), r_j(x_s)), plus the regulariser;
    rs[j - 1] is round j's label function (rs[0], round 1's, enters no loss)."""
    value = LOSS_VALUE[loss]
    z = np.asarray(z_by_sample, np.float64)
    total = 0.0
    for j in range(2, len(xs) + 1):
        past = slice(0, j - 1)  # samples s < j
        y = label(rs[j - 1], np.asarray(xs[past]))
        total += np.sum(value(z[past], y)) / (j - 1)
    return eta * total + float(np.sum(z * np.log1p(z)))


def suffix_oracle(c):
    """(start, cost): the suffix of the sorted points with the least sum (start = len: empty)."""
    sums = np.append(np.cumsum(c[::-1])[::-1], 0.0)
    start = int(np.argmin(sums))
    return start, sums[start]


class Reference:
    """FTRL-FW on thresholds, as in learner.py: FW from the empty hypothesis, gamma 2/(k+1),
    stop at gap <= eta * epsilon or after max_iters oracle calls."""

    def __init__(self, T, *, loss="squared", eta_scale=1.0, gap_scale=1.0, max_iters=100_000):
        L = {"squared": 2.0, "absolute": 1.0, "bilinear": 2.0}[loss]
        self.eta = eta_scale * math.sqrt(T / (L**2 * math.log(T)))
        self.tolerance = gap_scale  # eta * epsilon with epsilon = gap_scale / eta
        self.loss, self.max_iters = loss, max_iters
        self.x, self.w0, self.w1 = [], [], []

    def decide(self):
        """(sorted x, mixture weight per sorted position, z, gap, calls)."""
        x = np.asarray(self.x, np.float64)
        order = np.argsort(x, kind="stable")
        xs, w0, w1 = x[order], np.asarray(self.w0)[order], np.asarray(self.w1)[order]
        n, grad = len(xs), LOSS_GRAD[self.loss]
        z, up = np.zeros(n), np.zeros(n)
        k = 1
        while True:
            c = self.eta * (w0 * grad(z, 0.0) + w1 * grad(z, 1.0)) + np.log1p(z) + z / (z + 1)
            start, cost = suffix_oracle(c)
            gap = float(c @ z - cost)
            if gap <= self.tolerance or k >= self.max_iters:
                return xs, up, z, gap, k
            gamma = 2.0 / (k + 1)
            v = (np.arange(n) >= start).astype(np.float64)
            z = (1 - gamma) * z + gamma * v
            up *= 1 - gamma
            if start < n:
                up[start] += gamma
            k += 1

    def predict(self, xs, up, x_t):
        return float(np.clip(up[xs <= x_t].sum(), 0, 1))

    def update(self, x_t, r_t):
        n = len(self.x)
        if n:
            y = label(r_t, np.asarray(self.x))
            self.w0 = list(np.asarray(self.w0) + (1 - y) / n)
            self.w1 = list(np.asarray(self.w1) + y / n)
        self.x.append(float(x_t))
        self.w0.append(0.0)
        self.w1.append(0.0)

    def round(self, x_t, r_t):
        """One round: (prediction, loss, gap, calls)."""
        xs, up, _, gap, calls = self.decide()
        p = self.predict(xs, up, x_t)
        loss = float(LOSS_VALUE[self.loss](p, label(r_t, np.float64(x_t))))
        self.update(x_t, r_t)
        return p, loss, gap, calls
