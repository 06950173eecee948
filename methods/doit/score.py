"""DOIT's cycle score: how much a cycle of tau steps reduced the loss, squashed into [-1, 1].

With l_0 the loss before the cycle and l_1..l_n after it (core.cycles records each micro-step's
loss before its update, so l_0 = losses[0] and n = tau - 1: the last update of a cycle shows
in the next cycle's l_0 instead):
    d_m     = (l_{m-1} - l_m) / max(l_m, l_{m-1})            relative one-step progress
    upper   = (l_0 - max l) / (max(l_0, max l) * n)          the worst point of the cycle
    lower   = (l_0 - min l) / (max(l_0, min l) * n)          the best point of the cycle
    s       = tanh((mean d + upper + lower) / 3 + alpha * std d)
Losses must be >= 0 (each ratio then lies in [-1, 1]); a denominator of 0 (two zero losses)
counts as no progress.
"""

import numpy as np


def _ratio(num, den):
    den = np.asarray(den, np.float64)
    return np.where(den > 0, np.asarray(num, np.float64) / np.where(den > 0, den, 1.0), 0.0)


def cycle_score(losses: np.ndarray, alpha: float = 0.0) -> float:
    """The score of one cycle from its losses `[l_0, l_1, ..., l_n]` (n >= 1)."""
    seq = np.asarray(losses, np.float64)
    if seq.ndim != 1 or seq.size < 2:
        raise ValueError(f"cycle_score needs >= 2 losses (tau >= 2), got shape {seq.shape}")
    if not np.all(np.isfinite(seq)):
        return -1.0  # a diverged cycle is the worst possible
    if np.any(seq < 0):
        raise ValueError("cycle_score needs losses >= 0 (its ratios assume it)")
    l0, after = seq[0], seq[1:]
    n = after.size
    deltas = _ratio(seq[:-1] - seq[1:], np.maximum(seq[:-1], seq[1:]))
    upper = _ratio(l0 - after.max(), max(l0, after.max()) * n)
    lower = _ratio(l0 - after.min(), max(l0, after.min()) * n)
    return float(np.tanh((deltas.mean() + upper + lower) / 3 + alpha * deltas.std()))
