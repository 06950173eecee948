"""Multi-turn rollouts: a policy and a pure environment take turns, the KV cache kept across turns.

    layout = multiturn.Layout(max_rounds=5, policy_tokens=6, obs_tokens=35, stop_ids=(EOT, EOS))
    out = multiturn.rollout(policy, params, prompt_RP, prompt_mask_RP, env, env_state, layout,
                            rng=key, temperature=1.0)
    step = grpo.make_step(policy, tx, reward_fn, gcfg,
                          rollout_fn=multiturn.grpo_rollout(env_init, env, layout))

A round is the policy's turn (up to `policy_tokens` tokens, ended early by a stop id) and then
the environment's reply (up to `obs_tokens` tokens). Every round has the same fixed slots, so
the transcript is a fixed-shape buffer [R, max_rounds x (policy_tokens + obs_tokens)]: the
policy's tokens LEFT-aligned in their slots, the environment's RIGHT-aligned in theirs, padding
(mask False) between. Right-aligned replies put a real token just before the next round's first
policy token, so teacher-forced scoring (`core.grpo_objective.token_logprobs`: positions from
the mask, padding never attended to) gives the same log-probabilities as the rollout, which fed
the same real tokens at the same positions through the cache (tests/core/test_multiturn.py).

The rollout is one `lax.while_loop` over rounds (ending when every row is done), with a
`lax.fori_loop` over the round's policy slots inside: each slot samples one token per row and
feeds it to the cache (rows whose turn ended, or whose episode is done, feed padding that no
query reads); then the environment's reply for every row is fed as one chunk. Nothing is ever
re-encoded: the prompt is prefilled once and every later token is appended.

`Environment.step(state, tokens_RK, mask_RK, round) -> Turn(state, obs_RO, obs_mask_RO, done_R)`
must be pure and jittable: it reads the policy's turn (tokens with their mask, pad after the
stop id) and returns its reply right-aligned, and whether the episode ended with this turn (a
final answer, or the last round). A row's reply after its episode ended is ignored.

The loss mask: `policy_mask_RN` is True only on tokens the policy sampled; the environment's
tokens are in `mask_RN` (the model reads them) but never in `policy_mask_RN` (they get no loss:
`core.grpo` turns it into the loss weights).

`player` returns the rollout's pieces (prefill, one round, whether to go on, the transcript) as
pure functions, for a host loop over turns that jits each apart (debugging a turn, or the
benchmark's baseline: methods/videozoomer/bench.py).

`scripted` builds the same transcript from given policy turns without a model (e.g. cold-start
SFT data from an oracle's turns), with the same environment and layout.
"""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from core.errors import ConfigError
from core.nn import sampler
from core.nn.policy import Policy, as_policy


@dataclasses.dataclass(frozen=True)
class Layout:
    """Fixed turn buffers; frozen and hashable (static under jit)."""

    max_rounds: int
    policy_tokens: int  # K: slots of one policy turn
    obs_tokens: int  # O: slots of one environment reply
    stop_ids: tuple[int, ...]  # a policy turn ends at (and includes) any of these

    def __post_init__(self):
        for name in ("max_rounds", "policy_tokens", "obs_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"multiturn.Layout.{name} must be a positive int, got {value!r}")
        if not self.stop_ids:
            raise ConfigError("multiturn.Layout.stop_ids is empty: a turn could never end early")

    @property
    def round_tokens(self) -> int:
        return self.policy_tokens + self.obs_tokens

    @property
    def length(self) -> int:
        """N: the transcript's slots after the prompt."""
        return self.max_rounds * self.round_tokens


class Turn(NamedTuple):
    state: Any  # the environment's new state
    obs_RO: jax.Array  # int32 reply, right-aligned in its O slots
    obs_mask_RO: jax.Array  # bool, True on the reply's tokens
    done_R: jax.Array  # bool, the episode ended with this turn


class Environment(NamedTuple):
    step: Callable  # (state, tokens_RK, mask_RK, round) -> Turn


class Transcript(NamedTuple):
    tokens_RN: jax.Array  # int32, pad_id on empty slots
    mask_RN: jax.Array  # bool, every real token (policy's and environment's)
    policy_mask_RN: jax.Array  # bool, the policy's tokens only
    logprobs_RN: jax.Array  # float32 tempered log-prob of each sampled token (0 elsewhere)
    done_R: jax.Array  # bool, the episode ended (the environment said so)
    env_state: Any  # the environment's final state
    rounds_R: jax.Array  # int32, policy turns taken


def turn_mask(tokens_RK, live_R, stop_ids):
    """True on a turn's tokens up to and including its first stop id (rows in `live_R`)."""
    stop_RK = jnp.isin(tokens_RK, jnp.asarray(stop_ids))
    before_RK = jnp.cumsum(stop_RK, axis=1) - stop_RK  # stops strictly before each slot
    return live_R[:, None] & (before_RK == 0)


def _reply(env: Environment, state, tokens_RK, mask_RK, r, done_R):
    """The environment's turn; rows done before it, or by it, get no reply."""
    turn = env.step(state, tokens_RK, mask_RK, r)
    ended_R = done_R | turn.done_R
    return turn._replace(obs_mask_RO=turn.obs_mask_RO & ~ended_R[:, None], done_R=ended_R)


def _write(buffers, offset, values):
    """Each buffer [R, N] with `values` [R, W] written at column `offset` (traced)."""
    return tuple(
        lax.dynamic_update_slice(b, v.astype(b.dtype), (0, offset))
        for b, v in zip(buffers, values, strict=True)
    )


class Player(NamedTuple):
    """A rollout's pieces, each pure (`player`): `rollout` runs them as one `lax.while_loop`;
    a host loop over turns (debugging, the benchmark's baseline) can jit and call them apart.
      start(params, prompt_RP, prompt_mask_RP, env_state) -> carry   (the prompt prefilled)
      play_round(params, rng, carry) -> carry   (one policy turn and the environment's reply)
      running(carry) -> bool scalar             (a round is left and some episode goes on)
      finish(carry) -> Transcript
    """

    start: Callable
    play_round: Callable
    running: Callable
    finish: Callable


def player(
    policy: Policy,
    env: Environment,
    layout: Layout,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    pad_id: int = 0,
) -> Player:
    """The pieces of `rollout` (its arguments but params, prompts, state and rng)."""
    policy = as_policy(policy)
    K, num_obs, N = layout.policy_tokens, layout.obs_tokens, layout.length
    stop_ids = jnp.asarray(layout.stop_ids)

    def feed(params, tokens_RT, mask_RT, pos_R, cache):
        positions_RT = pos_R[:, None] + jnp.maximum(jnp.cumsum(mask_RT, axis=1) - 1, 0)
        logits_RTV, cache = policy.apply(
            params, tokens_RT, positions_BT=positions_RT, key_mask_BT=mask_RT, cache=cache
        )
        return logits_RTV, cache, pos_R + mask_RT.sum(axis=1, dtype=jnp.int32)

    def start(params, prompt_RP, prompt_mask_RP, env_state):
        R, P = prompt_RP.shape
        prompt_mask_RP = prompt_mask_RP.astype(bool)
        positions_RP = jnp.maximum(jnp.cumsum(prompt_mask_RP, axis=1, dtype=jnp.int32) - 1, 0)
        logits_RPV, cache = policy.apply(
            params,
            prompt_RP,
            positions_BT=positions_RP,
            key_mask_BT=prompt_mask_RP,
            cache=policy.init_cache(R, P + N),
        )
        buffers = (
            jnp.full((R, N), pad_id, jnp.int32),
            jnp.zeros((R, N), bool),
            jnp.zeros((R, N), bool),
            jnp.zeros((R, N), jnp.float32),
        )
        pos_R = prompt_mask_RP.sum(axis=1, dtype=jnp.int32)
        done_R, rounds_R = jnp.zeros((R,), bool), jnp.zeros((R,), jnp.int32)
        return (jnp.int32(0), cache, logits_RPV[:, -1], pos_R, done_R, env_state, rounds_R, buffers)

    def play_round(params, rng, carry):
        r, cache, logits_RV, pos_R, done_R, state, rounds_R, buffers = carry
        R = pos_R.shape[0]

        def policy_slot(k, inner):
            cache, logits_RV, pos_R, active_R, turn_RK, turn_mask_RK, buffers = inner
            key = jax.random.fold_in(rng, r * K + k)
            tok_R, lp_R = sampler.choose_tokens(
                logits_RV, key, temperature=temperature, top_k=top_k, top_p=top_p
            )
            tok_R = jnp.where(active_R, tok_R, pad_id)
            new_RV, cache, pos_R = feed(params, tok_R[:, None], active_R[:, None], pos_R, cache)
            logits_RV = jnp.where(active_R[:, None], new_RV[:, 0], logits_RV)
            column = (tok_R, active_R, active_R, jnp.where(active_R, lp_R, 0.0))
            offset = r * layout.round_tokens + k
            buffers = _write(buffers, offset, tuple(c[:, None] for c in column))
            turn_RK = turn_RK.at[:, k].set(tok_R)
            turn_mask_RK = turn_mask_RK.at[:, k].set(active_R)
            active_R = active_R & ~jnp.isin(tok_R, stop_ids)
            return cache, logits_RV, pos_R, active_R, turn_RK, turn_mask_RK, buffers

        turn = (jnp.full((R, K), pad_id, jnp.int32), jnp.zeros((R, K), bool))
        inner = (cache, logits_RV, pos_R, ~done_R, *turn, buffers)
        cache, logits_RV, pos_R, _, turn_RK, turn_mask_RK, buffers = lax.fori_loop(
            0, K, policy_slot, inner
        )
        rounds_R = rounds_R + ~done_R
        reply = _reply(env, state, turn_RK, turn_mask_RK, r, done_R)
        obs_RO = jnp.where(reply.obs_mask_RO, reply.obs_RO, pad_id)
        new_ROV, cache, pos_R = feed(params, obs_RO, reply.obs_mask_RO, pos_R, cache)
        got_R = reply.obs_mask_RO[:, -1]  # right-aligned: the last slot is real if any is
        logits_RV = jnp.where(got_R[:, None], new_ROV[:, -1], logits_RV)
        zeros_RO = jnp.zeros((R, num_obs), bool)
        reply_cols = (obs_RO, reply.obs_mask_RO, zeros_RO, jnp.zeros((R, num_obs), jnp.float32))
        buffers = _write(buffers, r * layout.round_tokens + K, reply_cols)
        return r + 1, cache, logits_RV, pos_R, reply.done_R, reply.state, rounds_R, buffers

    def running(carry):
        r, *_, done_R, _, _, _ = carry
        return (r < layout.max_rounds) & ~jnp.all(done_R)

    def finish(carry):
        _, _, _, _, done_R, env_state, rounds_R, (tokens, mask, policy_mask, logprobs) = carry
        return Transcript(tokens, mask, policy_mask, logprobs, done_R, env_state, rounds_R)

    return Player(start, play_round, running, finish)


def rollout(
    policy: Policy,
    params,
    prompt_RP,
    prompt_mask_RP,
    env: Environment,
    env_state,
    layout: Layout,
    *,
    rng,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    pad_id: int = 0,
) -> Transcript:
    """The policy and `env` take turns from left-padded prompts (module docstring); temperature 0
    is greedy. The policy's cache must be a `core.nn.transformer.KVCache`-like pytree the policy
    fills one call after another (every core model's is)."""
    p = player(policy, env, layout, temperature=temperature, top_k=top_k, top_p=top_p,
               pad_id=pad_id)  # fmt: skip
    carry = p.start(params, prompt_RP, prompt_mask_RP, env_state)
    return p.finish(lax.while_loop(p.running, functools.partial(p.play_round, params, rng), carry))


def scripted(env: Environment, env_state, turns_RMK, layout: Layout, *, pad_id: int = 0):
    """The transcript of given policy turns (turns_RMK [R, max_rounds, K], each cut at its first
    stop id; what follows is ignored) against `env`, without a model: the rollout's layout,
    e.g. for supervised cold-start data. logprobs_RN are zeros."""
    turns_RMK = jnp.asarray(turns_RMK)
    R, M, K = turns_RMK.shape
    if (layout.max_rounds, layout.policy_tokens) != (M, K):
        raise ConfigError(
            f"scripted: turns have shape {turns_RMK.shape[1:]}, the layout "
            f"({layout.max_rounds}, {layout.policy_tokens})"
        )

    def body(carry, r):
        state, done_R, rounds_R = carry
        turn_RK = turns_RMK[:, r]
        mask_RK = turn_mask(turn_RK, ~done_R, layout.stop_ids)
        turn_RK = jnp.where(mask_RK, turn_RK, pad_id)
        reply = _reply(env, state, turn_RK, mask_RK, r, done_R)
        obs_RO = jnp.where(reply.obs_mask_RO, reply.obs_RO, pad_id)
        tokens = jnp.concatenate([turn_RK, obs_RO], axis=1)
        mask = jnp.concatenate([mask_RK, reply.obs_mask_RO], axis=1)
        policy = jnp.concatenate([mask_RK, jnp.zeros_like(reply.obs_mask_RO)], axis=1)
        carry = (reply.state, reply.done_R, rounds_R + ~done_R)
        return carry, (tokens, mask, policy)

    init = (env_state, jnp.zeros((R,), bool), jnp.zeros((R,), jnp.int32))
    (env_state, done_R, rounds_R), (tokens, mask, policy) = lax.scan(body, init, jnp.arange(M))
    flat = lambda x_MRW: jnp.moveaxis(x_MRW, 0, 1).reshape(R, -1)  # noqa: E731
    logprobs = jnp.zeros((R, layout.length), jnp.float32)
    return Transcript(flat(tokens), flat(mask), flat(policy), logprobs, done_R, env_state, rounds_R)


def grpo_rollout(
    env_init: Callable,
    env: Environment,
    layout: Layout,
    *,
    prompt_key="prompt",
    prompt_mask_key="prompt_mask",
):
    """A `core.grpo.make_step` rollout_fn: G multi-turn episodes per prompt. env_init(batch_R)
    -> the environment's state for the repeated batch; its final state is the Rollout's info
    (reward_fn gets it as `info=`). gcfg.max_new_tokens must be layout.length."""
    from core import grpo  # here: grpo imports nothing of this module, and stays so

    def rollout_fn(policy, params, batch, *, rng, gcfg):
        if gcfg.max_new_tokens != layout.length:
            raise ConfigError(
                f"grpo.max_new_tokens={gcfg.max_new_tokens} must be the multi-turn layout's "
                f"length {layout.length} (max_rounds x (policy_tokens + obs_tokens))"
            )
        batch_R = grpo.repeat_groups(batch, gcfg.group_size)
        prompt_RP, prompt_mask_RP = batch_R[prompt_key], batch_R[prompt_mask_key]
        out = rollout(
            policy, params, prompt_RP, prompt_mask_RP, env, env_init(batch_R), layout,
            rng=rng, temperature=gcfg.temperature, top_k=gcfg.top_k, top_p=gcfg.top_p,
            pad_id=gcfg.pad_id,
        )  # fmt: skip
        return grpo.Rollout(
            prompt_RP, prompt_mask_RP, out.tokens_RN, out.mask_RN, out.policy_mask_RN,
            out.done_R, info=out.env_state,
        )  # fmt: skip

    return rollout_fn
