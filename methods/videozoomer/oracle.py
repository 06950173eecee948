"""The cold-start trajectories' scripts and the uniform-sampling baselines' perfect reader.

Scripts (policy turns [B, MAX_ROUNDS, POLICY_TOKENS], pad after each turn's stop token):
- oracle: zoom straight to the occurrence that holds the event (privileged: the glance rarely
  shows which one it is), then answer;
- reflection: search in time order: zoom the earlier occurrence; when that was the decoy (the
  reply shows nothing), RECHECK and zoom the later one; then answer. A wrong first zoom, a
  recheck, the right zoom: the recovery the paper's reflection data teaches.
Every zoom covers [h, h + 16) at fps 1 (16 frames, every frame), h the occurrence's first glance
frame: the event region. Its arguments are the time tokens of the occurrence's two glance frames
(h and h + 16), both in the glance: the policy copies them, no arithmetic on times.

The perfect reader (`reader_accuracy`): what a reader that perceives every frame it is shown
without error gets from `count` uniform frames (the glance rule, floor(j F / count)). It answers
from what it saw, and guesses uniformly when it saw nothing: needle, right if it saw the flash,
else 1/6; order, right if it saw a frame of the second colour, else 1/5 (the Bayes answers: no
reader does better on those frames); count, the number of jumps it saw (right if it saw every
one), a guess among 1..4 if it saw none (a reader that knew the prior of how jumps are missed
could do slightly better; no learned reader in this repository does).
"""

import numpy as np

from methods.videozoomer import env
from methods.videozoomer import video as v

FULL_FPS = v.FPS0 + v.FPS.index((1, 1))


def zoom_turn(start: int, recheck: bool = False) -> list[int]:
    i = v.first_glance_hit(int(start)) // v.TIME_STEP
    turn = [v.ZOOM, v.TIME0 + i, v.TIME0 + i + 1, FULL_FPS, v.EOT]
    return [v.RECHECK, *turn] if recheck else turn


def scripts(batch: dict, reflection_B: np.ndarray) -> np.ndarray:
    """[B, MAX_ROUNDS, POLICY_TOKENS] turns: reflection where reflection_B, else oracle."""
    B = len(batch["answer"])
    out = np.full((B, env.MAX_ROUNDS, env.POLICY_TOKENS), v.PAD, np.int32)
    for b in range(B):
        event, decoy = batch["starts"][b]
        turns = [zoom_turn(event)]
        if reflection_B[b] and decoy < event:
            turns = [zoom_turn(decoy), zoom_turn(event, recheck=True)]
        turns.append([v.ANSWER, int(batch["answer"][b]), v.EOS])
        for r, turn in enumerate(turns):
            out[b, r, : len(turn)] = turn
    return out


def _jump_runs(event_F: np.ndarray) -> list[tuple[int, int]]:
    """(first, last + 1) of each run of jump frames."""
    jump = np.concatenate([[0], (event_F == 1).astype(np.int8), [0]])
    edges = np.flatnonzero(np.diff(jump))
    return list(zip(edges[::2], edges[1::2], strict=True))


def reader_accuracy(batch: dict, count: int) -> np.ndarray:
    """[B] the perfect reader's expected accuracy on `count` uniform frames (module docstring)."""
    idx = v.glance_indices(count)
    out = np.empty(len(batch["answer"]))
    for b, frames_F in enumerate(batch["frames"]):
        scene_F, event_F = frames_F // v.EVENTS, frames_F % v.EVENTS
        in_scene = scene_F == batch["scene"][b]
        seen = np.zeros(v.NUM_FRAMES, bool)
        seen[idx] = True
        answer = int(batch["answer"][b]) - v.A0
        kind = v.KINDS[batch["kind"][b]]
        if kind == "needle":
            out[b] = 1.0 if np.any(seen & in_scene & (event_F == 2 + answer)) else 1 / v.NUM_COLOURS
        elif kind == "order":
            saw = np.any(seen & in_scene & (event_F == 2 + answer))
            out[b] = 1.0 if saw else 1 / (v.NUM_COLOURS - 1)
        else:
            runs = _jump_runs(np.where(in_scene, event_F, 0))
            saw = sum(bool(seen[a:z].any()) for a, z in runs)
            out[b] = 1 / v.MAX_JUMPS if saw == 0 else float(saw == len(runs))
    return out
