"""Calibration metrics of confidences `q_N` in [0, 1] against correctness `correct_N` (bool).

Pure and jittable. Format failures are the caller's to handle (the official eval scores a
parse failure as q = 0 before these metrics).
"""

import jax.numpy as jnp

NUM_BINS = 10


def accuracy(correct_N):
    return jnp.mean(correct_N.astype(jnp.float32))


def brier_score(q_N, correct_N):
    return jnp.mean((q_N - correct_N.astype(q_N.dtype)) ** 2)


def bin_index(q_N, num_bins=NUM_BINS):
    """Equal-width bins [k/n, (k+1)/n); q = 0 lands in the first bin and q = 1 in the last."""
    # Clipping is what puts q = 1 (floor gives num_bins) into the last bin, and any q slightly
    # outside [0, 1] into an end bin, as the official edges forced to +-inf do.
    return jnp.clip(jnp.floor(q_N * num_bins).astype(jnp.int32), 0, num_bins - 1)


def _bin_sums(q_N, correct_N, num_bins):
    one_hot_NK = bin_index(q_N, num_bins)[:, None] == jnp.arange(num_bins)[None, :]
    one_hot_NK = one_hot_NK.astype(jnp.float32)
    count_K = one_hot_NK.sum(0)
    conf_sum_K = q_N.astype(jnp.float32) @ one_hot_NK
    correct_sum_K = correct_N.astype(jnp.float32) @ one_hot_NK
    return count_K, conf_sum_K, correct_sum_K


def reliability(q_N, correct_N, num_bins=NUM_BINS):
    """Reliability-diagram data: per-bin mean confidence, accuracy and count.

    Empty bins give NaN mean confidence and accuracy (count 0), so plots skip them.
    """
    count_K, conf_sum_K, correct_sum_K = _bin_sums(q_N, correct_N, num_bins)
    safe_K = jnp.maximum(count_K, 1.0)
    empty_K = count_K == 0
    mean_conf_K = jnp.where(empty_K, jnp.nan, conf_sum_K / safe_K)
    acc_K = jnp.where(empty_K, jnp.nan, correct_sum_K / safe_K)
    return mean_conf_K, acc_K, count_K


def ece(q_N, correct_N, num_bins=NUM_BINS):
    """Expected calibration error: sum over bins of (n_b / N) |acc_b - conf_b|."""
    # (n_b / N) |acc_b - conf_b| = |sum correct - sum q|_b / N: no division by empty bins.
    _, conf_sum_K, correct_sum_K = _bin_sums(q_N, correct_N, num_bins)
    return jnp.sum(jnp.abs(correct_sum_K - conf_sum_K)) / q_N.shape[0]


def auroc(q_N, correct_N):
    """AUROC of confidence as a score for correctness (Mann-Whitney, ties counted as 1/2).

    NaN when all answers are correct or all wrong: the AUROC is undefined there, and 0.5 would
    be indistinguishable from a genuinely uninformative confidence (use nanmean to aggregate).
    """
    pos_N = correct_N.astype(jnp.float32)
    n_pos = pos_N.sum()
    n_neg = q_N.shape[0] - n_pos
    sorted_N = jnp.sort(q_N)
    # 1-based ranks averaged over ties: the tied block occupies positions below+1 .. at_or_below.
    below_N = jnp.searchsorted(sorted_N, q_N, side="left")
    at_or_below_N = jnp.searchsorted(sorted_N, q_N, side="right")
    rank_N = (below_N + at_or_below_N + 1) / 2.0
    u = jnp.sum(rank_N * pos_N) - n_pos * (n_pos + 1) / 2.0
    one_class = (n_pos == 0) | (n_neg == 0)
    return jnp.where(one_class, jnp.nan, u / jnp.maximum(n_pos * n_neg, 1.0))
