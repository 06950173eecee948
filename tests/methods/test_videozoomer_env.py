"""VideoZoomer's environment, scripts, reward and reader on hand-made turns (no model)."""

import jax.numpy as jnp
import numpy as np
import pytest

from core import multiturn
from methods.videozoomer import env, oracle, policy
from methods.videozoomer import video as v

HALF, ONE, TWO = (v.FPS0 + v.FPS.index(f) for f in ((1, 2), (1, 1), (2, 1)))


@pytest.fixture(scope="module")
def batch():
    return v.examples([np.random.default_rng([7, i]) for i in range(30)])


def turn(*tokens):
    out = np.full((1, env.POLICY_TOKENS), v.PAD, np.int32)
    out[0, : len(tokens)] = tokens
    return jnp.asarray(out), jnp.asarray(out != v.PAD)


def reply_of(batch, tokens, r=0, row=0):
    state = env.init({"frames": batch["frames"][row : row + 1]})
    out = env.step(state, *tokens, r)
    obs = np.asarray(out.obs_RO[0])[np.asarray(out.obs_mask_RO[0])]
    return out, obs


@pytest.mark.parametrize(
    "i0, i1, fps, t1",
    [
        (10, 11, TWO, 176),  # 16 s at fps 2: 32 frames, over budget
        (10, 12, HALF, 192),  # 32 s at 1/2: 16 frames
        (10, 11, ONE, 176),  # 16 s at 1: 16 frames
        (10, 13, v.FPS0, 208),  # 48 s at 1/4: 12 frames
        (10, 11, v.FPS0, 176),  # 16 s at 1/4: 4 frames
        (31, 35, v.FPS0, v.NUM_FRAMES),  # [496, 560) clipped to [496, 512): 4 frames
    ],
)
def test_a_zoom_returns_int_fps_times_length_frames_at_the_environments_indices(i0, i1, fps, t1):
    # Neighbouring frames differ (time tokens are 8 s wide): a wrong index shows.
    batch = {"frames": (np.arange(v.NUM_FRAMES) * 7 % (v.NUM_SCENES * v.EVENTS))[None]}
    t0 = i0 * v.TIME_STEP
    num, den = v.FPS[fps - v.FPS0]
    expected_n = (t1 - t0) * num // den  # int(fps * (t1 - t0)) after clipping to the video
    out, obs = reply_of(batch, turn(v.ZOOM, v.TIME0 + i0, v.TIME0 + i1, fps, v.EOT))
    if expected_n > env.MAX_ZOOM_FRAMES:
        np.testing.assert_array_equal(obs, [v.OBS, v.ERROR, v.END])
        assert not out.state.format_ok_R[0] and out.state.zooms_R[0] == 0
        return
    idx = t0 + np.arange(expected_n) * (t1 - t0) // expected_n
    want = v.frame_token(batch["frames"][0][idx], idx)
    np.testing.assert_array_equal(obs, [v.OBS, *want, v.END])
    assert out.state.frames_R[0] == v.GLANCE_FRAMES + expected_n
    assert out.state.zooms_R[0] == 1 and out.state.format_ok_R[0] and not out.done_R[0]


def test_over_budget_empty_and_malformed_turns_get_the_error_reply(batch):
    bad = [
        turn(v.ZOOM, v.TIME0 + 10, v.TIME0 + 15, ONE, v.EOT),  # 80 frames
        turn(v.ZOOM, v.TIME0 + 12, v.TIME0 + 12, ONE, v.EOT),  # empty segment
        turn(v.ZOOM, v.TIME0 + 33, v.TIME0 + 35, ONE, v.EOT),  # wholly past the end
        turn(v.ZOOM, v.TIME0 + 10, HALF, v.EOT),  # a missing time
        turn(v.A0, v.EOT),
    ]
    for tokens in bad:
        out, obs = reply_of(batch, tokens)
        np.testing.assert_array_equal(obs, [v.OBS, v.ERROR, v.END])
        assert not out.state.format_ok_R[0] and not out.done_R[0]


def test_the_last_round_forces_an_answer(batch):
    zoom = turn(v.ZOOM, v.TIME0 + 10, v.TIME0 + 11, ONE, v.EOT)
    _, obs = reply_of(batch, zoom, r=env.MAX_ROUNDS - 2)
    assert obs[-1] == v.ANSWER and obs[-2] == v.END  # the environment writes ANSWER
    out, _ = reply_of(batch, zoom, r=env.MAX_ROUNDS - 1)  # no zoom on the last round
    assert out.done_R[0] and out.state.zooms_R[0] == 0 and not out.state.format_ok_R[0]
    out, _ = reply_of(batch, turn(v.A0 + 3, v.EOS), r=env.MAX_ROUNDS - 1)
    assert out.done_R[0] and out.state.answered_R[0] and out.state.answer_R[0] == v.A0 + 3
    out, _ = reply_of(batch, turn(v.ANSWER, v.A0 + 3, v.EOS), r=1)  # an answer before that
    assert out.done_R[0] and out.state.answer_R[0] == v.A0 + 3 and out.state.format_ok_R[0]


def test_recheck_marker_is_part_of_a_well_formed_zoom(batch):
    out, obs = reply_of(batch, turn(v.RECHECK, v.ZOOM, v.TIME0 + 10, v.TIME0 + 11, ONE, v.EOT))
    assert out.state.zooms_R[0] == 1 and len(obs) == 2 + 16


@pytest.mark.parametrize("reflection", [False, True])
def test_scripts_zoom_onto_the_event_and_answer_right(batch, reflection):
    B = len(batch["answer"])
    scripts = oracle.scripts(batch, np.full(B, reflection))
    out = multiturn.scripted(env.ENV, env.init(batch), scripts, env.LAYOUT)
    correct, formed = policy.outcome(batch, out.env_state)
    assert np.all(correct) and np.all(formed)
    decoy_first = batch["starts"][:, 1] < batch["starts"][:, 0]
    zooms = np.asarray(out.env_state.zooms_R)
    np.testing.assert_array_equal(zooms, 1 + (reflection & decoy_first))
    assert 0 < decoy_first.sum() < B  # both cases occur in the fixture
    # The zoom that the answer follows shows the event: every event frame's content appears.
    for b in range(B):
        lo = batch["starts"][b, 0]
        events = batch["frames"][b][lo : lo + v.SCENE_LEN] % v.EVENTS
        is_frame, contents, _ = v.frame_parts(np.asarray(out.tokens_RN[b]))
        shown = set(contents[is_frame & np.asarray(out.mask_RN[b])] - v.CONTENT0)
        wanted = {batch["scene"][b] * v.EVENTS + e for e in set(events) - {0}}
        assert wanted <= shown, b


def test_reward_parts_and_the_bonus_only_when_correct(batch):
    R = 4
    state = env.init({"frames": batch["frames"][:R]})
    gold = jnp.asarray(batch["answer"][:R])
    wrong = v.A0 + (gold - v.A0 + 1) % v.NUM_ANSWERS
    state = state._replace(
        answered_R=jnp.asarray([True, True, True, False]),
        answer_R=jnp.asarray([gold[0], gold[1], wrong[2], v.PAD]),
        zooms_R=jnp.asarray([1, 0, 2, 1]),
        format_ok_R=jnp.asarray([True, False, True, True]),
    )
    reward, _ = policy.reward({"answer": gold}, None, None, info=state, weights=(0.9, 0.1, 0.1))
    # right + format + bonus; right, bad format, no zoom; wrong (no bonus); no answer (no format)
    np.testing.assert_allclose(reward, [1.1, 0.9, 0.1, 0.0], atol=1e-6)


def test_the_perfect_reader_is_right_on_every_frame_and_near_chance_on_few(batch):
    every = oracle.reader_accuracy(batch, v.NUM_FRAMES)
    np.testing.assert_array_equal(every, 1.0)
    glance = oracle.reader_accuracy(batch, v.GLANCE_FRAMES)
    assert glance.mean() < 0.6  # the glance misses most short events
