"""Examples of the retrieval task (`tasks`) drawn from a digits split: training pairs with teacher
traces, the reasoner's SFT sequences, and the fixed evaluation queries with their galleries.

    fmt = QueryFormat(style="full", rho=0.0)
    ex = pair(rng, tasks.split("train"), fmt)     # q_image q_tokens t_image t_tokens label family
    ex = reasoner_example(rng, tasks.split("train"))   # image tokens targets mask
    q = eval_queries(tasks.split("test"), "plus_k", n=200, seed=0)
    g = gallery(tasks.split("test"))               # every (image, shift): 9 per image

Training traces come from the teacher oracle, which sees the true labels (training data only).
`label` is the target's identity for removing in-batch false negatives (`core.contrastive`):
the class for class-level image targets, 10 + the image's row for `simple` (instance retrieval),
-1 - text id for text targets. A class-level row whose sampled target image happens to be a
`simple` row's instance keeps that one as a negative (a rare, harmless miss: about 1 / N).
"""

from typing import NamedTuple

import numpy as np

from core.errors import ConfigError
from methods.tte import tasks
from methods.tte.tasks import FAMILIES, IMAGE_FAMILIES, SHIFTS

FAMILY_SETS = {"image": FAMILIES, "text": tasks.TEXT_FAMILIES}


class QueryFormat(NamedTuple):
    """What a query holds besides its image and instruction."""

    style: str = "none"  # tasks.STYLES: no trace, the full ECR, the final answer only
    rho: float = 0.0  # the noisy teacher's corruption rate (training and evaluation traces)
    trace_only: bool = False  # the trace alone: no image, no instruction (text-only retrieval)
    families: str = "image"  # FAMILY_SETS: the six image-task families, or the plain-text ones

    def check(self) -> "QueryFormat":
        if self.families not in FAMILY_SETS:
            raise ConfigError(f"tte: families={self.families!r}; one of {', '.join(FAMILY_SETS)}")
        if self.families == "text" and self.trace_only:
            raise ConfigError("tte: trace_only is an image-family arm; families=text has none")
        if self.style not in tasks.STYLES:
            raise ConfigError(f"tte: trace style {self.style!r}; one of {', '.join(tasks.STYLES)}")
        if not 0.0 <= self.rho <= 1.0:
            raise ConfigError(f"tte: rho={self.rho}; a corruption rate in [0, 1]")
        if self.trace_only and self.style == "none":
            raise ConfigError("tte: trace_only needs a trace (style full or final)")
        return self


def _draw_k(family: str, rng) -> int:
    if family == "plus_k":
        return int(rng.integers(1, 10))
    if family == "vqa" and rng.random() < 0.5:
        return int(rng.integers(1, 9))  # "is it greater than k ?"
    return -1


def _spec(rng, s: tasks.Split, family: str):
    """(rows, shift ids, digits, k) of one query: rows[1] = -1 unless two digits are shown."""
    n = len(s.labels_N)
    rows = (int(rng.integers(n)), int(rng.integers(n)) if family == "larger" else -1)
    shifts = tuple(int(v) for v in rng.integers(len(SHIFTS), size=2))
    d = tuple(int(s.labels_N[r]) if r >= 0 else -1 for r in rows)
    return rows, shifts, d, _draw_k(family, rng)


def _slot(s: tasks.Split, row: int, shift: int):
    return None if row < 0 else tasks.shifted(s.images_N88[row], SHIFTS[shift])


def query_image(s: tasks.Split, rows, shifts) -> np.ndarray:
    return tasks.canvas(_slot(s, rows[0], shifts[0]), _slot(s, rows[1], shifts[1]))


def _other_shift(rng, shift: int) -> int:
    return int((shift + rng.integers(1, len(SHIFTS))) % len(SHIFTS))


def pair(rng: np.random.Generator, s: tasks.Split, fmt: QueryFormat) -> dict:
    """One training (query, target) pair of a uniformly drawn family, with a teacher trace."""
    family = FAMILIES[int(rng.integers(len(FAMILIES)))]
    rows, shifts, d, k = _spec(rng, s, family)
    a = tasks.answer(family, d, k)
    trace = tasks.trace_words(family, tasks.corrupt(d, fmt.rho, rng), k, fmt.style)
    if family == "simple":  # the same image at another shift
        t_image = query_image(s, (rows[0], -1), (_other_shift(rng, shifts[0]), 0))
        label = 10 + rows[0]
    elif family in IMAGE_FAMILIES:  # any image of the answer class
        row = int(rng.choice(s.by_class[a]))
        t_image, label = query_image(s, (row, -1), (int(rng.integers(len(SHIFTS))), 0)), a
    else:
        t_image, label = tasks.BLANK, -1 - a
    return {
        "q_image": tasks.BLANK if fmt.trace_only else query_image(s, rows, shifts),
        "q_tokens": tasks.query_text(family, k, trace, trace_only=fmt.trace_only),
        "t_image": t_image,
        "t_tokens": tasks.target_text(family, a),
        "label": np.int32(label),
        "family": np.int32(FAMILIES.index(family)),
    }


def reasoner_example(rng: np.random.Generator, s: tasks.Split) -> dict:
    """One SFT example: [instruction; full teacher trace; eos] after the image, the loss on the
    trace and eos (targets = the next token; mask 1 where the next token is trace or eos)."""
    family = FAMILIES[int(rng.integers(len(FAMILIES)))]
    rows, shifts, d, k = _spec(rng, s, family)
    prompt = tasks.encode(tasks.instruction(family, k))
    seq = prompt + tasks.encode(tasks.trace_words(family, d, k, "full")) + [tasks.EOS]
    tokens = tasks.pad_to(seq, tasks.QUERY_LEN, "a reasoner sequence")
    mask = np.zeros(tasks.QUERY_LEN, np.float32)
    mask[len(prompt) - 1 : len(seq) - 1] = 1.0  # positions whose next token is trace or eos
    return {
        "image": query_image(s, rows, shifts),
        "tokens": tokens,
        "targets": np.roll(tokens, -1),
        "mask": mask,
    }


class Queries(NamedTuple):
    """One family's fixed evaluation queries (numpy, n rows)."""

    family: str
    image: np.ndarray  # [n, 8, 16, 1]
    slots: np.ndarray  # [n, 2, 8, 8]: the shown digits as placed (background where absent)
    shown: np.ndarray  # [n, 2] true digits, -1 where absent: targets only, never a trace
    k: np.ndarray  # [n]
    answer: np.ndarray  # [n]: class (image families) or tasks.ANSWER_TEXTS id
    positive: np.ndarray  # [n] gallery index (image families) or text id
    negatives: np.ndarray | None  # [n, GALLERY_SIZE - 1] gallery indices; None for text


class Gallery(NamedTuple):
    """Every (image, shift) of a split as an image target: index = row * 9 + shift id."""

    image: np.ndarray  # [9N, 8, 16, 1]
    row: np.ndarray  # [9N]
    label: np.ndarray  # [9N]


def gallery(s: tasks.Split) -> Gallery:
    rows = np.repeat(np.arange(len(s.labels_N)), len(SHIFTS))
    shift_ids = np.tile(np.arange(len(SHIFTS)), len(s.labels_N))
    images = np.stack(
        [query_image(s, (r, -1), (h, 0)) for r, h in zip(rows, shift_ids, strict=True)]
    )
    return Gallery(images, rows, s.labels_N[rows])


def negatives(rng, g_label, g_row, family, a, row) -> np.ndarray:
    """GALLERY_SIZE - 1 distinct gallery indices that are wrong answers."""
    wrong = g_row != row if family == "simple" else g_label != a
    pool = np.flatnonzero(wrong)
    if len(pool) < tasks.GALLERY_SIZE - 1:
        raise ConfigError(f"tte: the split has {len(pool)} negatives for {family}; need 999")
    return rng.choice(pool, tasks.GALLERY_SIZE - 1, replace=False)


def eval_queries(s: tasks.Split, family: str, n: int, seed: int) -> Queries:
    """n queries of one family, fixed by (seed, family); positives and negatives for P@1."""
    if family not in FAMILIES:
        raise ConfigError(f"tte: family {family!r} is unknown; one of {', '.join(FAMILIES)}")
    rng = np.random.default_rng([seed, FAMILIES.index(family)])
    rows_g = np.repeat(np.arange(len(s.labels_N)), len(SHIFTS))
    label_g = s.labels_N[rows_g]
    out = {f: [] for f in ("image", "slots", "shown", "k", "answer", "positive", "negatives")}
    for _ in range(n):
        rows, shifts, d, k = _spec(rng, s, family)
        a = tasks.answer(family, d, k)
        image = query_image(s, rows, shifts)
        out["image"].append(image)
        out["slots"].append(np.stack([image[:, :8, 0], image[:, 8:, 0]]))
        out["shown"].append(d)
        out["k"].append(k)
        out["answer"].append(a)
        if family not in IMAGE_FAMILIES:
            out["positive"].append(a)
            continue
        if family == "simple":
            positive = rows[0] * len(SHIFTS) + _other_shift(rng, shifts[0])
        else:
            positive = int(rng.choice(s.by_class[a])) * len(SHIFTS) + int(rng.integers(9))
        out["positive"].append(positive)
        out["negatives"].append(negatives(rng, label_g, rows_g, family, a, rows[0]))
    arrays = {f: np.asarray(v) for f, v in out.items() if v}
    return Queries(family=family, negatives=arrays.pop("negatives", None), **arrays)


def text_gallery(family: str) -> np.ndarray:
    """The text ids a text family's answers range over (its label set)."""
    return np.array([tasks.YES, tasks.NO] if family == "vqa" else range(10))


def precision_at_1(q: Queries, scores_NG: np.ndarray) -> float:
    """P@1: the positive scores above every negative (image families: scores over the whole
    gallery [n, 9N]; text families: over `text_gallery` [n, labels])."""
    if q.negatives is None:
        labels = text_gallery(q.family)
        return float(np.mean(labels[np.argmax(scores_NG, axis=1)] == q.positive))
    pos = np.take_along_axis(scores_NG, q.positive[:, None], axis=1)[:, 0]
    neg = np.take_along_axis(scores_NG, q.negatives, axis=1).max(axis=1)
    return float(np.mean(pos > neg))
