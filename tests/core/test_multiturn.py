"""core.multiturn: fixed-shape turn buffers, the KV cache kept across turns, the loss mask.

A toy environment replies to each policy turn with a variable-length echo (its last token and a
round marker, right-aligned), so replies of every length occur, and ends the episode when the
policy says EOS. A random tiny transformer plays it at temperature 1.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core import grpo, multiturn
from core.errors import ConfigError
from core.nn import transformer

V, PAD, EOS, EOT = 24, 0, 2, 3
MARK = 10  # replies carry MARK + round
LAYOUT = multiturn.Layout(max_rounds=4, policy_tokens=3, obs_tokens=5, stop_ids=(EOT, EOS))


def toy_step(state, tokens_RK, mask_RK, r):
    """Reply [MARK + r, last token, ..] of length 1 + (last token % 4), right-aligned; EOS ends."""
    length_R = mask_RK.sum(axis=1)
    last_R = jnp.take_along_axis(tokens_RK, jnp.maximum(length_R - 1, 0)[:, None], 1)[:, 0]
    n_R = 1 + last_R % 4
    cols = jnp.arange(LAYOUT.obs_tokens)
    start_R = LAYOUT.obs_tokens - n_R
    obs_RO = jnp.where(cols == start_R[:, None], MARK + r, last_R[:, None])
    obs_mask_RO = cols >= start_R[:, None]
    done_R = jnp.any((tokens_RK == EOS) & mask_RK, axis=1) | (r == LAYOUT.max_rounds - 1)
    return multiturn.Turn(state + length_R, obs_RO, obs_mask_RO, done_R)


ENV = multiturn.Environment(step=toy_step)
CFG = transformer.TransformerConfig(
    vocab_size=V, num_layers=2, d_model=32, num_heads=2, d_ff=64, max_len=64
)


@pytest.fixture(scope="module")
def played():
    params = transformer.init_params(CFG, jax.random.key(0))
    # A biased head makes EOT / EOS common, so turns and episodes end at every length.
    bias = jnp.zeros(V).at[EOT].set(1.5).at[EOS].set(0.7)
    params["lm_head"]["kernel"] = params["lm_head"]["kernel"] * 3.0
    policy = transformer.policy(CFG)
    biased = policy._replace(
        apply=lambda p, *a, **k: (lambda o: (o[0] + bias, o[1]))(policy.apply(p, *a, **k))
    )
    R, P = 16, 6
    rng = np.random.default_rng(0)
    prompt_RP = rng.integers(4, MARK, (R, P)).astype(np.int32)
    lengths = rng.integers(2, P + 1, R)
    prompt_mask_RP = np.arange(P)[None] >= (P - lengths)[:, None]
    prompt_RP = np.where(prompt_mask_RP, prompt_RP, PAD)
    rollout = jax.jit(
        functools.partial(multiturn.rollout, biased, env=ENV, layout=LAYOUT, temperature=1.0)
    )
    out = rollout(params, prompt_RP, prompt_mask_RP, env_state=jnp.zeros(R, jnp.int32),
                  rng=jax.random.key(1))  # fmt: skip
    return biased, params, prompt_RP, prompt_mask_RP, out


def test_layout_is_fixed_and_turns_vary(played):
    *_, out = played
    assert out.tokens_RN.shape == (16, LAYOUT.length)
    rounds = np.asarray(out.rounds_R)
    # The planted bias gives short and long episodes: the test covers both.
    assert rounds.min() < LAYOUT.max_rounds and rounds.max() > 1
    assert np.all(np.asarray(out.done_R))
    # No token outside a real slot; policy tokens are a subset of the real ones.
    mask, policy_mask = np.asarray(out.mask_RN), np.asarray(out.policy_mask_RN)
    assert np.all(np.asarray(out.tokens_RN)[~mask] == PAD)
    assert np.all(mask[policy_mask])
    # The environment's state saw exactly the policy's tokens.
    np.testing.assert_array_equal(np.asarray(out.env_state), policy_mask.sum(1))


def test_replies_are_right_aligned_before_each_next_turn(played):
    *_, out = played
    mask = np.asarray(out.mask_RN).reshape(16, LAYOUT.max_rounds, LAYOUT.round_tokens)
    policy_mask = np.asarray(out.policy_mask_RN).reshape(mask.shape)
    obs = mask[:, :, LAYOUT.policy_tokens :] & ~policy_mask[:, :, LAYOUT.policy_tokens :]
    rounds = np.asarray(out.rounds_R)
    for r in range(16):
        for t in range(rounds[r] - 1):  # every round but the last had a reply
            assert obs[r, t, -1], (r, t)  # the slot just before the next turn is real
            assert policy_mask[r, t + 1, 0]


def test_rollout_logprobs_equal_one_forward_over_the_transcript(played):
    """The cache kept across turns (policy tokens appended, replies appended as chunks) gives
    the same log-probs as a single teacher-forced forward over the final transcript."""
    policy, params, prompt_RP, prompt_mask_RP, out = played
    scored_RN = grpo.token_logprobs(
        policy, params, prompt_RP, prompt_mask_RP, out.tokens_RN, out.mask_RN, temperature=1.0
    )
    pm = np.asarray(out.policy_mask_RN)
    # float32, 2 layers, logits ~ O(10): the two paths sum attention in other orders.
    np.testing.assert_allclose(
        np.asarray(scored_RN)[pm], np.asarray(out.logprobs_RN)[pm], atol=2e-5
    )


def test_scripted_reproduces_the_rollout_from_its_own_turns(played):
    *_, out = played
    R = out.tokens_RN.shape[0]
    by_round = np.asarray(out.tokens_RN).reshape(R, LAYOUT.max_rounds, LAYOUT.round_tokens)
    turns = by_round[:, :, : LAYOUT.policy_tokens]
    again = multiturn.scripted(ENV, jnp.zeros(R, jnp.int32), turns, LAYOUT)
    for name in ("tokens_RN", "mask_RN", "policy_mask_RN", "done_R", "rounds_R", "env_state"):
        np.testing.assert_array_equal(getattr(again, name), getattr(out, name), err_msg=name)


def test_environment_tokens_get_no_gradient(played):
    """The GRPO loss's gradient w.r.t. each token's log-prob is zero on environment tokens."""
    *_, out = played
    R = out.tokens_RN.shape[0]
    gcfg = grpo.GRPOConfig(group_size=4, max_new_tokens=LAYOUT.length, drop_zero_variance=False)
    adv_R = jnp.linspace(-1.0, 1.0, R)
    weight_RN = grpo.policy_weights(out.policy_mask_RN, out.done_R, jnp.ones(R, bool), gcfg)

    def loss(logp_RN):
        return grpo.policy_loss(logp_RN, jax.lax.stop_gradient(logp_RN), adv_R, weight_RN, gcfg)[0]

    grad_RN = np.asarray(jax.grad(loss)(out.logprobs_RN))
    env_RN = np.asarray(out.mask_RN & ~out.policy_mask_RN)
    assert env_RN.sum() > 0 and np.all(grad_RN[env_RN] == 0)
    assert np.all(grad_RN[np.asarray(out.policy_mask_RN)] != 0)  # the policy's are trained


def test_turn_mask_cuts_at_the_first_stop():
    tokens = jnp.asarray([[5, EOT, 6], [EOS, 7, EOT], [5, 6, 7]])
    got = multiturn.turn_mask(tokens, jnp.asarray([True, True, False]), (EOT, EOS))
    np.testing.assert_array_equal(got, [[1, 1, 0], [1, 0, 0], [0, 0, 0]])


def test_bad_layouts_and_scripts_are_refused():
    with pytest.raises(ConfigError, match="policy_tokens"):
        multiturn.Layout(2, 0, 3, (EOS,))
    with pytest.raises(ConfigError, match="stop_ids"):
        multiturn.Layout(2, 2, 3, ())
    with pytest.raises(ConfigError, match="turns have shape"):
        multiturn.scripted(ENV, jnp.zeros(2), np.zeros((2, 3, 3), np.int32), LAYOUT)
