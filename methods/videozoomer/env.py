"""The zoom environment as pure functions (`core.multiturn.Environment`), jittable end to end.

A policy turn is one of
  [RECHECK] ZOOM TIME_i TIME_j FPS_f EOT    a zoom on [8 i, 8 j) seconds at fps f (RECHECK: an
                                            optional marker, as in the reflection trajectories)
  ANSWER A_a EOS                            the final answer (on the last round the environment
                                            has written ANSWER already: the turn is A_a EOS)
Anything else is malformed. The segment is clipped to the video, [0, NUM_FRAMES], and the zoom
returns n = int(fps * (t1 - t0)) frames (the official code's integer truncation) at indices
t0 + floor(j (t1 - t0) / n), j < n, each one frame token (content and time):
  OBS FRAME x n END
A zoom with n outside [1, MAX_ZOOM_FRAMES] (over the frame budget, or an empty segment), a zoom
on the last round, or a malformed turn gets the error reply OBS ERROR END and breaks the format;
an EOS ends the episode. The reply before the last round ends with ANSWER: the answer is forced
there (at most MAX_ZOOMS = max_rounds - 1 zooms). Replies are right-aligned in their slots.

The state records what the reward and the evaluation read: zooms made, frames seen (the glance
included), whether every turn was well formed, the answer given.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from core import multiturn
from methods.videozoomer import video as v

MAX_ZOOM_FRAMES = 16
MAX_ROUNDS = 5  # at most 4 zooms, then a forced answer
POLICY_TOKENS = 6  # RECHECK ZOOM TIME TIME FPS EOT
OBS_TOKENS = MAX_ZOOM_FRAMES + 3  # OBS FRAME x 16 END ANSWER
LAYOUT = multiturn.Layout(MAX_ROUNDS, POLICY_TOKENS, OBS_TOKENS, stop_ids=(v.EOT, v.EOS))
_FPS_NUM = jnp.asarray([n for n, _ in v.FPS])
_FPS_DEN = jnp.asarray([d for _, d in v.FPS])


class State(NamedTuple):
    frames_RF: jax.Array  # int32 content indices of each row's video
    zooms_R: jax.Array  # int32 zooms that returned frames
    frames_R: jax.Array  # int32 frames seen: the glance and every zoom's
    format_ok_R: jax.Array  # bool, every turn so far well formed
    answered_R: jax.Array  # bool, a well-formed answer was given
    answer_R: jax.Array  # int32 the answer token (PAD if none)


def init(batch_R) -> State:
    R = batch_R["frames"].shape[0]
    zeros = jnp.zeros((R,), jnp.int32)
    return State(
        batch_R["frames"].astype(jnp.int32), zeros, zeros + v.GLANCE_FRAMES,
        jnp.ones((R,), bool), jnp.zeros((R,), bool), zeros + v.PAD,
    )  # fmt: skip


def _in(tok, first, count):
    return (tok >= first) & (tok < first + count)


def parse_zoom(tokens_RK, length_R):
    """(well formed, t0, t1 clipped to the video, n frames) of a zoom turn."""
    s_R = (tokens_RK[:, 0] == v.RECHECK).astype(jnp.int32)  # the optional marker
    at = lambda i: jnp.take_along_axis(tokens_RK, (s_R + i)[:, None], axis=1)[:, 0]  # noqa: E731
    ok_R = (at(0) == v.ZOOM) & _in(at(1), v.TIME0, v.NUM_TIMES) & _in(at(2), v.TIME0, v.NUM_TIMES)
    ok_R &= _in(at(3), v.FPS0, len(v.FPS)) & (at(4) == v.EOT) & (length_R == s_R + 5)
    t0_R = jnp.clip((at(1) - v.TIME0) * v.TIME_STEP, 0, v.NUM_FRAMES)
    t1_R = jnp.clip((at(2) - v.TIME0) * v.TIME_STEP, 0, v.NUM_FRAMES)
    f_R = jnp.clip(at(3) - v.FPS0, 0, len(v.FPS) - 1)
    n_R = jnp.maximum(t1_R - t0_R, 0) * _FPS_NUM[f_R] // _FPS_DEN[f_R]
    return ok_R, t0_R, t1_R, n_R


def parse_answer(tokens_RK, length_R, final):
    """(well formed, answer token) of an answer turn (on the last round ANSWER is written)."""
    ans_R = jnp.where(final, tokens_RK[:, 0], tokens_RK[:, 1])
    ok_full_R = (tokens_RK[:, 0] == v.ANSWER) & (tokens_RK[:, 2] == v.EOS) & (length_R == 3)
    ok_forced_R = (tokens_RK[:, 1] == v.EOS) & (length_R == 2)
    ok_R = jnp.where(final, ok_forced_R, ok_full_R) & _in(ans_R, v.A0, v.NUM_ANSWERS)
    return ok_R, ans_R


def zoom_indices(t0_R, t1_R, n_R):
    """[R, MAX_ZOOM_FRAMES] frame indices t0 + floor(j (t1 - t0) / n) (slots j >= n unused)."""
    j = jnp.arange(MAX_ZOOM_FRAMES)
    return t0_R[:, None] + j * (t1_R - t0_R)[:, None] // jnp.maximum(n_R, 1)[:, None]


def right_align(tokens_RO, length_R):
    """Each row's first length_R tokens moved to the end of its slots (pad before them)."""
    O = tokens_RO.shape[1]  # noqa: E741
    src_RO = jnp.arange(O) - (O - length_R)[:, None]
    keep_RO = src_RO >= 0
    moved = jnp.take_along_axis(tokens_RO, jnp.clip(src_RO, 0, O - 1), axis=1)
    return jnp.where(keep_RO, moved, v.PAD), keep_RO


def step(state: State, tokens_RK, mask_RK, r) -> multiturn.Turn:
    """One environment turn (module docstring)."""
    final = r == MAX_ROUNDS - 1
    length_R = mask_RK.sum(axis=1)
    zoom_ok_R, t0_R, t1_R, n_R = parse_zoom(tokens_RK, length_R)
    zoom_ok_R &= (n_R >= 1) & (n_R <= MAX_ZOOM_FRAMES) & ~final
    answer_ok_R, ans_R = parse_answer(tokens_RK, length_R, final)
    said_eos_R = jnp.any((tokens_RK == v.EOS) & mask_RK, axis=1)
    done_R = final | said_eos_R | answer_ok_R
    # The reply, left-aligned first: OBS, the frames (or ERROR), END, then ANSWER if forced next.
    idx_RJ = jnp.clip(zoom_indices(t0_R, t1_R, n_R), 0, v.NUM_FRAMES - 1)
    content_RJ = jnp.take_along_axis(state.frames_RF, idx_RJ, axis=1)
    R = tokens_RK.shape[0]
    body_R = jnp.where(zoom_ok_R[:, None], v.frame_token(content_RJ, idx_RJ), v.PAD)
    body_R = body_R.at[:, 0].set(jnp.where(zoom_ok_R, body_R[:, 0], v.ERROR))
    n_tokens_R = jnp.where(zoom_ok_R, n_R, 1)
    reply_RO = jnp.concatenate([jnp.full((R, 1), v.OBS), body_R, jnp.zeros((R, 2), int)], 1)
    cols = jnp.arange(OBS_TOKENS)
    reply_RO = jnp.where(cols == (n_tokens_R + 1)[:, None], v.END, reply_RO)
    forced = r == MAX_ROUNDS - 2
    reply_RO = jnp.where((cols == (n_tokens_R + 2)[:, None]) & forced, v.ANSWER, reply_RO)
    obs_RO, obs_mask_RO = right_align(reply_RO.astype(jnp.int32), n_tokens_R + 2 + forced)
    new = State(
        state.frames_RF,
        state.zooms_R + zoom_ok_R,
        state.frames_R + jnp.where(zoom_ok_R, n_R, 0),
        state.format_ok_R & (zoom_ok_R | answer_ok_R | (length_R == 0)),  # no turn: no verdict
        state.answered_R | answer_ok_R,
        jnp.where(answer_ok_R, ans_R, state.answer_R),
    )
    return multiturn.Turn(new, obs_RO, obs_mask_RO & ~done_R[:, None], done_R)


ENV = multiturn.Environment(step=step)
