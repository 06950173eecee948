"""RLCR (paper 1): the reward's properness and correctness incentive, the log-score pitfall, and
the calibration metrics (ECE end bins, calibrated vs overconfident sets, AUROC vs a pair count)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from methods.rlcr import calibration, rewards

Q_GRID = jnp.linspace(0.0, 1.0, 101)  # step 0.01; p values below are grid points
P_INDICES = np.arange(0, 101, 5)


def _expected_reward_PQ(reward_fn, p_P, **weights):
    """E over correct ~ Bernoulli(p) of reward(format ok, correct, q), analytic: [P, Q]."""
    ok_Q = jnp.ones_like(Q_GRID, dtype=bool)
    r_right_Q = reward_fn(ok_Q, jnp.ones_like(ok_Q), Q_GRID, **weights)
    r_wrong_Q = reward_fn(ok_Q, jnp.zeros_like(ok_Q), Q_GRID, **weights)
    return p_P[:, None] * r_right_Q[None, :] + (1 - p_P[:, None]) * r_wrong_Q[None, :]


def test_format_failure_zeroes_every_term():
    fail_B = jnp.zeros(3, bool)
    correct_B = jnp.array([True, False, True])
    q_B = jnp.array([1.0, 0.0, 0.5])
    np.testing.assert_array_equal(rewards.rlvr_reward(fail_B, correct_B), 0.0)
    np.testing.assert_array_equal(rewards.rlcr_reward(fail_B, correct_B, q_B), 0.0)
    np.testing.assert_array_equal(rewards.log_score_reward(fail_B, correct_B, q_B), 0.0)
    # Valid format: 0.5 + 0.5 * acc + 0.5 * (1 - (q - c)^2), the official code's form.
    ok_B = jnp.ones(3, bool)
    np.testing.assert_allclose(
        jax.jit(rewards.rlcr_reward)(ok_B, correct_B, q_B), [1.5, 1.0, 1.375], rtol=1e-6
    )


def test_rlcr_is_proper_and_rewards_correctness():
    p_P = Q_GRID[P_INDICES]
    value_PQ = _expected_reward_PQ(rewards.rlcr_reward, p_P)
    # E[R] is strictly concave in q with its peak at q = p, so the grid argmax is p exactly.
    np.testing.assert_array_equal(jnp.argmax(value_PQ, axis=1), P_INDICES)
    best_P = value_PQ.max(axis=1)
    # Value at q = p is 0.5 + 0.5 p + 0.5 (1 - p(1 - p)) = 1 + p^2 / 2 (float32 rounding: 1e-6).
    np.testing.assert_allclose(best_P, 1 + p_P**2 / 2, atol=1e-6)
    assert np.all(np.diff(best_P) > 0)


def test_brier_weight_above_correctness_weight_breaks_correctness_incentive():
    # d/dp of the value is w_c + w_s (2p - 1) < 0 for p < 1/3 when w_s = 3 w_c (the paper's code).
    p_P = Q_GRID[P_INDICES]
    best_P = _expected_reward_PQ(rewards.rlcr_reward, p_P, w_correct=0.5, w_brier=1.5).max(1)
    assert best_P[0] > best_P[P_INDICES.tolist().index(20)]  # p = 0 beats an honest p = 0.2


def test_log_score_rewards_deliberately_wrong_answers():
    # An honest attempt right with p = 0.05, at its best confidence (q = p, the score is proper):
    # 0.5 + 0.5 p + 0.5 (p log p + (1 - p) log(1 - p)) ~= 0.426.
    p_honest = jnp.array([0.05])
    honest = _expected_reward_PQ(rewards.log_score_reward, p_honest).max()
    np.testing.assert_allclose(
        honest, 0.5 + 0.025 + 0.5 * (0.05 * np.log(0.05) + 0.95 * np.log(0.95)), atol=1e-5
    )
    # A deliberately wrong answer (p = 0) stated with q = 0 scores 0.5 + 0.5 log(1 - eps) ~= 0.5.
    wrong = rewards.log_score_reward(jnp.array([True]), jnp.array([False]), jnp.array([0.0]))[0]
    assert wrong > honest + 0.07
    # The same comparison under RLCR goes the other way: 1 + p^2 / 2 > 1.
    brier_honest = _expected_reward_PQ(rewards.rlcr_reward, p_honest).max()
    brier_wrong = rewards.rlcr_reward(jnp.array([True]), jnp.array([False]), jnp.array([0.0]))[0]
    assert brier_honest > brier_wrong


def test_ece_end_bins():
    # The 21 confidence tokens 0.00, 0.05, ..., 1.00: bins are [k/10, (k+1)/10), last one closed,
    # so each edge k/10 opens bin k despite float32 rounding of q * 10.
    tokens_T = jnp.asarray(np.round(np.arange(21) * 0.05, 2), jnp.float32)
    np.testing.assert_array_equal(
        calibration.bin_index(tokens_T), np.minimum(np.arange(21) // 2, 9)
    )
    np.testing.assert_array_equal(
        calibration.bin_index(jnp.array([0.0, 0.05, 0.1, 0.95, 1.0])), [0, 0, 1, 9, 9]
    )
    q_N = jnp.array([0.0, 1.0])
    conf_K, acc_K, count_K = calibration.reliability(q_N, jnp.array([False, True]))
    np.testing.assert_array_equal(count_K, [1, 0, 0, 0, 0, 0, 0, 0, 0, 1])
    np.testing.assert_array_equal(conf_K[jnp.array([0, 9])], [0.0, 1.0])
    np.testing.assert_array_equal(acc_K[jnp.array([0, 9])], [0.0, 1.0])
    assert np.all(np.isnan(conf_K[1:9])) and np.all(np.isnan(acc_K[1:9]))
    assert calibration.ece(q_N, jnp.array([False, True])) == 0.0
    assert calibration.ece(q_N, jnp.array([True, False])) == 1.0


def test_ece_calibrated_vs_overconfident():
    rng = np.random.default_rng(0)
    n = 200_000
    q_N = rng.uniform(size=n).astype(np.float32)
    correct_N = rng.uniform(size=n) < q_N
    # Calibrated: per-bin sampling noise ~ sqrt(0.25 / 20_000) = 0.0035, so ECE ~ 0.003; 0.01.
    assert calibration.ece(jnp.asarray(q_N), jnp.asarray(correct_N)) < 0.01
    # Overconfident: q = 0.95 on answers right 60% of the time: ECE = 0.35 +- 0.001 (std); 0.01.
    q_N = np.full(n, 0.95, np.float32)
    correct_N = rng.uniform(size=n) < 0.6
    np.testing.assert_allclose(jax.jit(calibration.ece)(q_N, correct_N), 0.35, atol=0.01)
    np.testing.assert_allclose(calibration.accuracy(correct_N), 0.6, atol=0.01)
    np.testing.assert_allclose(
        calibration.brier_score(q_N, correct_N), 0.6 * 0.05**2 + 0.4 * 0.95**2, atol=0.01
    )


def _auroc_pair_count(q_N, correct_N):
    pos = q_N[correct_N]
    neg = q_N[~correct_N]
    wins = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a, b in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", range(5))
def test_auroc_equals_pair_count_with_ties(seed):
    rng = np.random.default_rng(seed)
    q_N = (rng.integers(0, 5, size=31) / 4).astype(np.float32)  # 5 levels: many ties
    correct_N = rng.uniform(size=31) < 0.5
    # Ranks and counts here are small integers and halves, exact in float32; 1e-6 for the divide.
    np.testing.assert_allclose(
        jax.jit(calibration.auroc)(q_N, correct_N), _auroc_pair_count(q_N, correct_N), atol=1e-6
    )


def test_auroc_one_class_is_nan():
    q_N = jnp.array([0.1, 0.5, 0.9])
    assert np.isnan(calibration.auroc(q_N, jnp.ones(3, bool)))
    assert np.isnan(calibration.auroc(q_N, jnp.zeros(3, bool)))
    assert calibration.auroc(q_N, jnp.array([False, False, True])) == 1.0
