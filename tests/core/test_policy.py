"""The policy interface with a model that is not a transformer (a bigram table): the sampler and
GRPO run it; GRPO's entropy bonus, microbatches and multi-turn environment-token masking."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from core import grpo
from core.errors import ConfigError
from core.nn import sampler
from core.nn.policy import Policy
from core.state import TrainState

V = 8
ENV = 7  # the environment's reply token in the multi-turn test


def bigram_apply(params, tokens_BT, *, positions_BT=None, key_mask_BT=None, cache=None):
    """Next-token logits = the table's row of the current token; the cache counts tokens."""
    del positions_BT, key_mask_BT  # a bigram reads neither
    logits_BTV = params["table"][tokens_BT]
    return logits_BTV, None if cache is None else cache + tokens_BT.shape[1]


def bigram_init_cache(batch_size, max_len):
    del batch_size, max_len  # nothing to remember beyond the last token, which is fed again
    return jnp.zeros((), jnp.int32)


BIGRAM = Policy(apply=bigram_apply, init_cache=bigram_init_cache)


def random_table(seed, scale=1.0):
    return {"table": scale * jax.random.normal(jax.random.key(seed), (V, V))}


def test_sampler_runs_a_bigram_policy():
    # Greedy: row i's largest entry is (i + 1) % V, so the chain counts up from the prompt.
    table = {"table": 5.0 * jnp.eye(V)[(jnp.arange(V) + 1) % V]}
    prompt_BP = jnp.array([[0, 2, 3], [0, 0, 6]], jnp.int32)
    mask_BP = prompt_BP > 0
    out = sampler.sample(
        BIGRAM,
        table,
        prompt_BP,
        rng=jax.random.key(0),
        max_new_tokens=4,
        prompt_mask_BP=mask_BP,
        temperature=0.0,
    )
    np.testing.assert_array_equal(out.tokens_BN, [[4, 5, 6, 7], [7, 0, 1, 2]])
    # Sampled: each log-prob is the bigram row's log-softmax at the drawn token.
    params = random_table(1)
    out = sampler.sample_jit(
        BIGRAM, params, prompt_BP, rng=jax.random.key(2), max_new_tokens=5, prompt_mask_BP=mask_BP
    )
    prev_BN = jnp.concatenate([prompt_BP[:, -1:], out.tokens_BN[:, :-1]], axis=1)
    logp_BNV = jax.nn.log_softmax(params["table"][prev_BN])
    expected = jnp.take_along_axis(logp_BNV, out.tokens_BN[..., None], -1)[..., 0]
    # float32 log-softmax of the same row, computed in and outside the sampler's loop.
    np.testing.assert_allclose(out.logprobs_BN, expected, atol=1e-6)


def bandit_reward(batch_R, tokens_RN, mask_RN):
    return (tokens_RN[:, 0] == 5).astype(jnp.float32), {}


def test_grpo_learns_a_bandit_with_a_bigram_policy():
    gcfg = grpo.GRPOConfig(group_size=8, max_new_tokens=1)
    tx = optax.adam(0.1)
    params = random_table(3, scale=0.1)
    state = TrainState(jnp.int32(0), jax.random.PRNGKey(0), params, tx.init(params), {})
    step = jax.jit(grpo.make_step(BIGRAM, tx, bandit_reward, gcfg))
    batch = {"prompt": jnp.full((4, 2), 2, jnp.int32), "prompt_mask": jnp.ones((4, 2), bool)}
    for i in range(40):
        state, metrics = step(state, batch, rng=jax.random.key(i))
    assert jax.nn.softmax(state.params["table"][2])[5] > 0.9
    assert float(metrics["reward"]) > 0.8


def tiny_scored(adv=(0.5, -0.5)):
    """Two rows after prompt token 2: [3, 4] and [5, 6], every token trained."""
    tokens_RN = jnp.array([[3, 4], [5, 6]], jnp.int32)
    ones = jnp.ones((2, 2), bool)
    return grpo.Scored(
        jnp.full((2, 1), 2, jnp.int32),
        jnp.ones((2, 1), bool),
        tokens_RN,
        ones,
        jnp.array(adv, jnp.float32),
        ones.astype(jnp.float32),
    )


def test_entropy_bonus_moves_the_gradient_by_the_hand_computed_amount():
    params, coef = random_table(4), 0.3
    tx = optax.sgd(1.0)  # the update is minus the gradient
    base = grpo.GRPOConfig(group_size=2, max_new_tokens=2, drop_zero_variance=False)
    with_bonus = dataclasses.replace(base, entropy_coef=coef)
    new0, _, m0 = grpo.update(BIGRAM, tx, base, params, tx.init(params), tiny_scored())
    new1, _, m1 = grpo.update(BIGRAM, tx, with_bonus, params, tx.init(params), tiny_scored())
    # Hand: loss_c = loss_0 - coef * mean over the 4 tokens of H(softmax(row)), the rows
    # being those of the previous tokens 2, 3, 2, 5; dH/dz_j = -p_j (log p_j + H).
    table = np.asarray(params["table"], np.float64)
    grad_mean_entropy = np.zeros((V, V))
    for row in (2, 3, 2, 5):
        z = table[row] - table[row].max()
        logp = z - np.log(np.exp(z).sum())
        p = np.exp(logp)
        H = -(p * logp).sum()
        grad_mean_entropy[row] += -p * (logp + H) / 4
    # update(c) - update(0) = -(grad(c) - grad(0)) = coef * grad(mean entropy); float32
    # log-softmax and sums of values ~1: rounding ~1e-7.
    np.testing.assert_allclose(new1["table"] - new0["table"], coef * grad_mean_entropy, atol=1e-6)
    assert np.abs(coef * grad_mean_entropy).max() > 1e-2  # the check is not vacuous
    assert "entropy" in m1 and "entropy" not in m0
    np.testing.assert_allclose(
        float(m1["loss"]), float(m0["loss"]) - coef * float(m1["entropy"]), rtol=1e-6
    )


def ragged_scored(R=8, N=4, seed=5):
    """R rows of N tokens with varied lengths, one group with zero weight (dropped)."""
    rng = np.random.default_rng(seed)
    tokens_RN = jnp.asarray(rng.integers(0, V, (R, N)), jnp.int32)
    lengths_R = np.array([4, 1, 3, 2, 4, 4, 2, 3])
    mask_RN = jnp.asarray(np.arange(N)[None] < lengths_R[:, None])
    weight_RN = mask_RN.astype(jnp.float32).at[2:4].set(0.0)
    adv_R = jnp.asarray(rng.normal(size=R), jnp.float32)
    prompt_RP = jnp.asarray(rng.integers(0, V, (R, 2)), jnp.int32)
    return grpo.Scored(prompt_RP, jnp.ones((R, 2), bool), tokens_RN, mask_RN, adv_R, weight_RN)


@pytest.mark.parametrize("aggregation", ["token", "sequence", "fixed"])
def test_microbatched_update_equals_the_full_batch_update(aggregation):
    params, reference = random_table(6), random_table(7)
    tx = optax.sgd(0.5)
    gcfg = grpo.GRPOConfig(
        group_size=2,
        max_new_tokens=4,
        aggregation=aggregation,
        kl_beta=0.1,
        entropy_coef=0.05,
        ppo_epochs=2,
    )
    full = grpo.update(BIGRAM, tx, gcfg, params, tx.init(params), ragged_scored(), reference)
    micro = grpo.update(
        BIGRAM,
        tx,
        dataclasses.replace(gcfg, microbatches=4),
        params,
        tx.init(params),
        ragged_scored(),
        reference,
    )
    # Same per-token terms, summed in 4 parts then added: float32 reordering of sums of ~10
    # values of magnitude ~1 (measured below 1e-7).
    np.testing.assert_allclose(micro[0]["table"], full[0]["table"], atol=1e-6)
    assert full[2].keys() == micro[2].keys()
    for name in full[2]:
        np.testing.assert_allclose(micro[2][name], full[2][name], atol=1e-6, err_msg=name)
    # Two PPO epochs: the second sees ratio != 1, so the clip and old log-probs take part.
    assert float(full[2]["clip_fraction"]) >= 0.0 and float(full[2]["kl"]) > 0.0
    with pytest.raises(ConfigError, match="microbatches=3"):
        grpo.update(
            BIGRAM,
            tx,
            dataclasses.replace(gcfg, microbatches=3),
            params,
            tx.init(params),
            ragged_scored(),
            reference,
        )


def two_turn_rollout(policy, params, batch, *, rng, gcfg, mask_env=True):
    """Policy token, the environment's reply ENV, policy token: a multi-turn completion."""
    first_rng, second_rng = jax.random.split(rng)
    one = dataclasses.replace(gcfg, max_new_tokens=1)
    prompt_RP, prompt_mask_RP, first = grpo.rollout(
        policy, params, batch["prompt"], batch["prompt_mask"], rng=first_rng, gcfg=one
    )
    R = prompt_RP.shape[0]
    env_R1 = jnp.full((R, 1), ENV, jnp.int32)
    context_RT = jnp.concatenate([prompt_RP, first.tokens_BN, env_R1], axis=1)
    context_mask_RT = jnp.concatenate([prompt_mask_RP, jnp.ones((R, 2), bool)], axis=1)
    second = sampler.sample(
        policy, params, context_RT, rng=second_rng, max_new_tokens=1, prompt_mask_BP=context_mask_RT
    )
    tokens_RN = jnp.concatenate([first.tokens_BN, env_R1, second.tokens_BN], axis=1)
    mask_RN = jnp.ones((R, 3), bool)
    policy_mask_RN = mask_RN.at[:, 1].set(False) if mask_env else mask_RN
    return grpo.Rollout(
        prompt_RP, prompt_mask_RP, tokens_RN, mask_RN, policy_mask_RN, jnp.ones((R,), bool)
    )


def two_turn_reward(batch_R, tokens_RN, mask_RN):
    return (tokens_RN[:, 0] == 3) + (tokens_RN[:, 2] == 5).astype(jnp.float32), {}


@pytest.mark.parametrize("mask_env", [True, False])
def test_environment_tokens_get_no_loss(mask_env):
    # After prompt token 2 the policy says 3 or 4; rows 3 and 4 of the table are then read
    # only to score the environment's ENV token, so only its loss can move them.
    table = random_table(8)["table"].at[2].set(jnp.full((V,), -20.0).at[3].set(0.0).at[4].set(0.0))
    params = {"table": table}
    gcfg = grpo.GRPOConfig(group_size=8, max_new_tokens=3)
    tx = optax.sgd(1.0)
    rollout_fn = lambda *a, **k: two_turn_rollout(*a, **k, mask_env=mask_env)  # noqa: E731
    step = grpo.make_step(BIGRAM, tx, two_turn_reward, gcfg, rollout_fn=rollout_fn)
    batch = {"prompt": jnp.full((2, 1), 2, jnp.int32), "prompt_mask": jnp.ones((2, 1), bool)}
    state = TrainState(jnp.int32(0), jax.random.PRNGKey(0), params, tx.init(params), {})
    new, metrics = jax.jit(step)(state, batch, rng=jax.random.key(0))
    delta_VV = np.abs(np.asarray(new.params["table"] - table))
    assert float(metrics["informative_groups"]) == 1.0  # both groups carry a signal
    assert delta_VV[2].max() > 1e-3 and delta_VV[ENV].max() > 1e-3  # the policy's tokens
    assert float(metrics["num_tokens"]) == 16 * (2 if mask_env else 3)
    if mask_env:
        np.testing.assert_array_equal(delta_VV[3:5], 0.0)  # exactly: no gradient reaches them
    else:
        assert delta_VV[3:5].max() > 1e-3
