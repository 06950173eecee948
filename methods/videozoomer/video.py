"""SyntheticZoom: long symbolic "videos" with short events, their questions, the glance, tokens.

A video is NUM_FRAMES = 512 frames at 1 frame per second. Each frame is one content token: a
scene (one of 4 backgrounds) and an event in it (none, a jump, or a flash of one of 6 colours).
The background is a run of scene segments. Every question is about one recurring place, scene
TARGET_SCENE = 0 (the question shows a plain frame of it): with the scene drawn per question, the
3-layer policy did not learn to match the question's scene to the glance's frames within the
cold-start budget (the zoom went to the marginal positions; README), and perception is not what
this experiment is about: the pretrained VLM of the paper sees what a frame shows. The question's
scene occurs exactly twice, each time
for SCENE_LEN = 32 frames (so the glance, every 16th frame, lands in each occurrence twice, at h
and h + 16): one occurrence holds the event, the other (the decoy) holds nothing, and nothing in
the glance tells them apart unless its frame happens to land on the event. The events lie in
[h, h + 16), between the occurrence's two glance frames:
- needle: "what colour flashed in scene s?": one flash of 3-6 frames;
- count:  "how many times did something jump in scene s?": k in 1..4 jumps of 2 frames each,
  at least 2 frames apart;
- order:  "which colour flashed right after colour c in scene s?": a flash of c (2-3 frames),
  then, at least 2 frames later, one of another colour (2-3 frames).
Answers are one of 6 answer tokens (a colour, or a count 1..4).

A frame is ONE token, FRAME(content, time): the policy embeds it as the sum of its content
token's and its time token's embeddings (`policy.policy_of`, our plan's "frame embedding plus a
time embedding"), so a frame's timestamp is read where the frame is, and a zoom's time arguments
are the same time tokens. The question names its scene by showing it: the content token of a
plain frame of that scene (a reference picture). The prompt is [BOS, question kind, scene,
(colour, order only), GLANCE, the glance: 32 frames at indices floor(j * 512 / 32) = 16 j, END],
left-padded to PROMPT_LEN. Time tokens count TIME_STEP = 16 s each (a glance frame's time is
exact); TIME0..TIME35 reach past the video's end (560 s) so that a zoom can ask for too much and
be clipped.

Shape suffixes: F frames of a video, P prompt tokens.
"""

import numpy as np

NUM_FRAMES = 512
TIME_STEP = 16  # seconds per time token: the glance's stride
NUM_TIMES = 36  # TIME0 .. TIME35: 0 .. 560 s
GLANCE_FRAMES = 32
SCENE_LEN = 32
EVENT_LEN = 16  # [h, h + 16) from the occurrence's first glance frame h
NUM_SCENES, NUM_COLOURS = 4, 6
TARGET_SCENE = 0
EVENTS = 2 + NUM_COLOURS  # 0 none, 1 jump, 2 + c a flash of colour c
NUM_ANSWERS = 6
MAX_JUMPS = 4
FPS = ((1, 4), (1, 2), (1, 1), (2, 1))  # the fps tokens' values as (numerator, denominator)
KINDS = ("needle", "count", "order")

_NAMES = [
    "PAD", "BOS", "EOS", "GLANCE", "OBS", "END", "ERROR", "ZOOM", "EOT", "RECHECK", "ANSWER",
    *(f"Q_{k.upper()}" for k in KINDS),
    *(f"COLOUR{c}" for c in range(NUM_COLOURS)),
    *(f"A{a}" for a in range(NUM_ANSWERS)),
    *(f"FPS{i}" for i in range(len(FPS))),
    *(f"TIME{t}" for t in range(NUM_TIMES)),
    *(f"C{s}_{e}" for s in range(NUM_SCENES) for e in range(EVENTS)),
    *(f"F{s}_{e}@{t}" for s in range(NUM_SCENES) for e in range(EVENTS) for t in range(NUM_TIMES)),
]  # fmt: skip
TOKENS = {name: i for i, name in enumerate(_NAMES)}
VOCAB_SIZE = len(_NAMES)
PAD, BOS, EOS, GLANCE, OBS, END, ERROR, ZOOM, EOT, RECHECK, ANSWER = range(11)
Q0, COLOUR0 = TOKENS["Q_NEEDLE"], TOKENS["COLOUR0"]
A0, FPS0, TIME0, CONTENT0 = TOKENS["A0"], TOKENS["FPS0"], TOKENS["TIME0"], TOKENS["C0_0"]
FRAME0 = TOKENS["F0_0@0"]
NUM_CONTENTS = NUM_SCENES * EVENTS
PROMPT_LEN = 5 + GLANCE_FRAMES + 1


def content(scene, event):
    """The content index (0 .. NUM_SCENES * EVENTS - 1) of a frame; its token is CONTENT0 + it."""
    return scene * EVENTS + event


def frame_token(content_idx, frame_idx):
    """The token of a frame: its content index and its time (frame index // TIME_STEP)."""
    return FRAME0 + content_idx * NUM_TIMES + frame_idx // TIME_STEP


def frame_parts(tokens):
    """(is a frame, content token, time token) of token ids (NumPy or JAX arrays)."""
    is_frame = tokens >= FRAME0
    offset = (tokens - FRAME0) * is_frame
    return is_frame, CONTENT0 + offset // NUM_TIMES, TIME0 + offset % NUM_TIMES


def glance_indices(count: int, num_frames: int = NUM_FRAMES) -> np.ndarray:
    """Uniform frame indices floor(j * num_frames / count), j < count (the glance: count = 32)."""
    return np.arange(count) * num_frames // count


def first_glance_hit(start: int) -> int:
    """The first glance frame (a multiple of 16) inside the occurrence starting at `start`."""
    stride = NUM_FRAMES // GLANCE_FRAMES
    return -(-start // stride) * stride


def _background(rng, target: int, starts) -> np.ndarray:
    """Scenes per frame: runs of 24-64 frames of the other scenes, the target's two occurrences."""
    others = [s for s in range(NUM_SCENES) if s != target]
    scene_F = np.empty(NUM_FRAMES, np.int64)
    t, last = 0, -1
    while t < NUM_FRAMES:
        choice = rng.choice([s for s in others if s != last])
        length = rng.integers(24, 65)
        scene_F[t : t + length] = choice
        t, last = t + length, choice
    for a in starts:
        scene_F[a : a + SCENE_LEN] = target
    return scene_F


def _spaced(rng, count: int, length: int, gap: int, room: int) -> np.ndarray:
    """`count` sorted starts of runs `length` long, at least `gap` apart, inside [0, room)."""
    slack = room - count * length - (count - 1) * gap
    cuts = np.sort(rng.integers(0, slack + 1, size=count))
    return cuts + np.arange(count) * (length + gap)


def sample_video(rng: np.random.Generator, kind: str | None = None) -> dict:
    """One video and question: frames (content indices [F]), kind, scene, the two occurrence
    starts (event first), the question's colour (order), the answer index (0 .. 5)."""
    kind = KINDS[rng.integers(len(KINDS))] if kind is None else kind
    scene = TARGET_SCENE
    while True:  # two occurrences, apart by at least one occurrence's length
        starts = rng.integers(0, NUM_FRAMES - SCENE_LEN + 1, size=2)
        if abs(int(starts[0]) - int(starts[1])) >= 2 * SCENE_LEN:
            break
    event_F = np.zeros(NUM_FRAMES, np.int64)
    lo, room = first_glance_hit(int(starts[0])), EVENT_LEN
    colour = -1
    if kind == "needle":
        length = int(rng.integers(3, 7))
        at = lo + int(rng.integers(0, room - length + 1))
        answer = int(rng.integers(NUM_COLOURS))
        event_F[at : at + length] = 2 + answer
    elif kind == "count":
        answer = int(rng.integers(1, MAX_JUMPS + 1))
        for at in _spaced(rng, answer, 2, 2, room):
            event_F[lo + at : lo + at + 2] = 1
    else:
        colour, answer = (int(c) for c in rng.choice(NUM_COLOURS, size=2, replace=False))
        lengths = rng.integers(2, 4, size=2)
        first, second = _spaced(rng, 2, int(lengths.max()), 2, room)
        event_F[lo + first : lo + first + lengths[0]] = 2 + colour
        event_F[lo + second : lo + second + lengths[1]] = 2 + answer
    frames_F = content(_background(rng, scene, starts), event_F)
    return dict(frames=frames_F, kind=KINDS.index(kind), scene=scene, starts=starts,
                colour=colour, answer=answer)  # fmt: skip


def prompt(video: dict) -> np.ndarray:
    """The prompt tokens (unpadded): question, then the glance with its timestamps."""
    question = [BOS, Q0 + video["kind"], CONTENT0 + content(video["scene"], 0)]
    if KINDS[video["kind"]] == "order":
        question.append(COLOUR0 + video["colour"])
    idx = glance_indices(GLANCE_FRAMES)
    glance = frame_token(video["frames"][idx], idx)
    return np.concatenate([question, [GLANCE], glance, [END]]).astype(np.int32)


def left_pad(tokens: np.ndarray, length: int = PROMPT_LEN) -> tuple[np.ndarray, np.ndarray]:
    if len(tokens) > length:
        raise ValueError(f"a prompt of {len(tokens)} tokens does not fit {length}")
    out = np.full(length, PAD, np.int32)
    out[length - len(tokens) :] = tokens
    return out, np.arange(length) >= length - len(tokens)


def examples(rngs, kind: str | None = None) -> dict[str, np.ndarray]:
    """One video per generator, stacked: prompt [B, P], prompt_mask, frames [B, F], answer
    (token id), kind, scene, starts [B, 2] (event occurrence first)."""
    videos = [sample_video(rng, kind) for rng in rngs]
    padded = [left_pad(prompt(v)) for v in videos]
    stack = lambda key: np.stack([v[key] for v in videos])  # noqa: E731
    return {
        "prompt": np.stack([p for p, _ in padded]),
        "prompt_mask": np.stack([m for _, m in padded]),
        "frames": stack("frames").astype(np.int32),
        "answer": (A0 + stack("answer")).astype(np.int32),
        "kind": stack("kind").astype(np.int32),
        "scene": stack("scene").astype(np.int32),
        "colour": stack("colour").astype(np.int32),
        "starts": stack("starts").astype(np.int32),
    }
