"""PTP decoding: rounds of (student proposes L tokens in one call, teacher verifies them in one
call), until every row has `num_tokens` new tokens.

    propose = functools.partial(student_proposal, cfg, params)
    out = generate(propose, teacher_probs_fn, prompt_BC, prompt_mask_BC, rng,
                   num_tokens=64, completion_len=L)
    out.tokens_BN, out.accepted / out.calls          # accepted tokens per teacher call

Each round draws fresh u_1..u_{L+1} ~ U(0, 1) (float32), so the output is an exact sample of
the teacher's sampling distribution whatever the student proposes (`bins.verify`); a good
student only makes the rounds longer. The context of a round is the last C tokens (prompt and
accepted output), left-padded: exact for a teacher whose next-token distribution depends on at
most the last C tokens (the toy teacher depends on the last one), and what the student sees.
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from methods.flow_mtp import bins, model


def student_proposal(cfg: model.StudentConfig, params, context_BC, context_mask_BC, u_BL):
    """The student's L tokens from one call: the argmax of each slot."""
    logits_BLV = model.student_logits(cfg, params, context_BC, context_mask_BC, u_BL)
    return jnp.argmax(logits_BLV, axis=-1).astype(jnp.int32)


def markov_teacher_probs(teacher, transform) -> Callable:
    """teacher_probs_fn(tokens_BT) -> the sampling distributions after each position [B,T,V]."""

    def probs(tokens_BT):
        return bins.sampling_probs(teacher.logits(tokens_BT), transform)

    return probs


class Generated(NamedTuple):
    tokens_BN: jax.Array  # the first num_tokens accepted tokens of each row
    accepted: jax.Array  # tokens accepted over all (row, round) teacher calls
    calls: jax.Array  # (row, round) pairs: teacher calls, one per row per round it was active
    rounds: jax.Array  # rounds run (the slowest row's)
    # Per row: the sums above are their totals. accepted / calls is a mean over calls, so a row
    # in hard text (short rounds, many calls) weighs more than in a mean over positions.
    accepted_B: jax.Array
    calls_B: jax.Array


def generate(
    propose: Callable,
    teacher_probs_fn: Callable,
    prompt_BC: jax.Array,
    prompt_mask_BC: jax.Array,
    rng: jax.Array,
    *,
    num_tokens: int,
    completion_len: int,
) -> Generated:
    """PTP decoding with lossless verification (jit-able: one `lax.while_loop` over rounds).

    propose(context_BC, context_mask_BC, u_BL) -> proposal_BL; teacher_probs_fn(tokens_BT) ->
    [B, T, V] sampling distributions after each position (one teacher call scores the context
    and the whole proposal). prompt_BC: left-padded, prompt_mask_BC True on real tokens."""
    B, C = prompt_BC.shape
    L = completion_len
    width = C + num_tokens + L + 1  # room for the last round's overshoot
    buf_BW = jnp.zeros((B, width), jnp.int32).at[:, :C].set(prompt_BC.astype(jnp.int32))
    mask_BW = jnp.zeros((B, width), bool).at[:, :C].set(prompt_mask_BC.astype(bool))
    end = C + num_tokens

    def cond(carry):
        return jnp.any(carry[2] < end)

    def body(carry):
        buf_BW, mask_BW, length_B, rng, calls_B, rounds = carry
        rng, key = jax.random.split(rng)
        u_BK = jax.random.uniform(key, (B, L + 1), jnp.float32)
        window_BC = length_B[:, None] - C + jnp.arange(C)[None, :]
        context_BC = jnp.take_along_axis(buf_BW, window_BC, axis=1)
        context_mask_BC = jnp.take_along_axis(mask_BW, window_BC, axis=1)
        proposal_BL = propose(context_BC, context_mask_BC, u_BK[:, :L])
        tokens_BT = jnp.concatenate([context_BC, proposal_BL], axis=1)
        probs_BKV = teacher_probs_fn(tokens_BT)[:, C - 1 :]  # after the context and x_<=L
        verified = bins.verify(probs_BKV, proposal_BL, u_BK)
        active_B = length_B < end
        num_B = jnp.where(active_B, verified.num_accepted_B, 0)
        slots_BK = length_B[:, None] + jnp.arange(L + 1)[None, :]
        write_BK = jnp.arange(L + 1)[None, :] < num_B[:, None]
        rows_BK = jnp.broadcast_to(jnp.arange(B)[:, None], slots_BK.shape)
        # Slots not written keep their value: the scatter writes the old value back there.
        old_BK = jnp.take_along_axis(buf_BW, slots_BK, axis=1)
        buf_BW = buf_BW.at[rows_BK, slots_BK].set(jnp.where(write_BK, verified.tokens_BK, old_BK))
        old_mask_BK = jnp.take_along_axis(mask_BW, slots_BK, axis=1)
        mask_BW = mask_BW.at[rows_BK, slots_BK].set(write_BK | old_mask_BK)
        return (
            buf_BW,
            mask_BW,
            length_B + num_B,
            rng,
            calls_B + active_B,
            rounds + 1,
        )

    zero_B = jnp.zeros((B,), jnp.int32)
    init = (buf_BW, mask_BW, jnp.full((B,), C, jnp.int32), rng, zero_B, jnp.int32(0))
    buf_BW, _, length_B, _, calls_B, rounds = jax.lax.while_loop(cond, body, init)
    accepted_B = length_B - C  # every accepted token, the last round's overshoot included
    return Generated(buf_BW[:, C:end], accepted_B.sum(), calls_B.sum(), rounds, accepted_B, calls_B)
