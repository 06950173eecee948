"""Plain-text families: the compositional instructions over digits written as numerals, no image,
where a pretrained LM (SmolLM2, `lm_traces`) can be the reasoner.

    text_plus    "find 4 plus 3"        -> an image of 7          (x + y <= 9)
    text_minus   "find 7 minus 3"       -> an image of 4          (x >= y)
    text_larger  "find larger of 3 7"   -> an image of 7          (x != y)

The query image is blank; the target is any image of the answer class (1,000-candidate galleries,
as the image families). With every (x, y) seen in training a no-trace embedder learns the whole
table and a trace has nothing to add, so each family's pairs (unordered for text_larger) are split
once by a seeded permutation: a fifth only in validation queries, a fifth only in test queries,
the rest in training (`group`). Validation and test then ask for sums the embedder never saw;
what a trace brings there is the reasoner's arithmetic.

Traces in the ECR format of `tasks`, written from an answer:

    text_plus, 4 + 3:   <think> 4 + 3 = 7 </think> seven
    text_larger, 3 7:   <think> max 3 7 = 7 </think> seven

The teacher writes the true answer (the digits are the query's own text, so it reads inputs
only); the LM's trace is the same format around the LM's parsed answer (`lm_traces`), and a query
whose LM answer is missing or not a digit gets no trace.
"""

import functools

import numpy as np

from core.errors import ConfigError
from methods.tte import examples, tasks
from methods.tte.tasks import NAMES, TEXT_FAMILIES

GROUPS = ("train", "validation", "test")
HELD_SHARE = 0.2  # of a family's pairs, only in validation (and as many only in test)
SPLIT_SEED = 2026


def _check(family: str) -> None:
    if family not in TEXT_FAMILIES:
        raise ConfigError(f"tte: text family {family!r} is unknown; one of {TEXT_FAMILIES}")


def pairs(family: str) -> list[tuple[int, int]]:
    """Every (x, y) the family asks about."""
    _check(family)
    r = range(10)
    if family == "text_plus":
        return [(x, y) for x in r for y in range(1, 10) if x + y <= 9]
    if family == "text_minus":
        return [(x, y) for x in r for y in r if y <= x]
    return [(x, y) for x in r for y in r if x != y]


def _canonical(family: str, d: tuple[int, int]) -> tuple[int, int]:
    return tuple(sorted(d)) if family == "text_larger" else d  # both orders in one group


@functools.cache
def _groups(family: str) -> dict:
    keys = sorted({_canonical(family, d) for d in pairs(family)})
    order = np.random.default_rng([SPLIT_SEED, TEXT_FAMILIES.index(family)]).permutation(len(keys))
    held = max(1, round(HELD_SHARE * len(keys)))
    names = ["validation"] * held + ["test"] * held + ["train"] * (len(keys) - 2 * held)
    return {keys[i]: name for i, name in zip(order, names, strict=True)}


def group(family: str, d: tuple[int, int]) -> str:
    """ "train" | "validation" | "test": the only queries that ask about pair d."""
    return _groups(family)[_canonical(family, d)]


def pairs_in(family: str, name: str) -> list[tuple[int, int]]:
    if name not in GROUPS:
        raise ConfigError(f"tte: pair group {name!r} is unknown; one of {GROUPS}")
    return [d for d in pairs(family) if group(family, d) == name]


def answer(family: str, d: tuple[int, int]) -> int:
    _check(family)
    x, y = d
    return x + y if family == "text_plus" else x - y if family == "text_minus" else max(x, y)


def instruction(family: str, d: tuple[int, int]) -> list[str]:
    x, y = (str(v) for v in d)
    if family == "text_plus":
        return ["find", x, "plus", y]
    if family == "text_minus":
        return ["find", x, "minus", y]
    _check(family)
    return ["find", "larger", "of", x, y]


def question(family: str, d: tuple[int, int]) -> str:
    """The LM reasoner's question in English (its prompt adds the answer instruction)."""
    x, y = d
    if family == "text_plus":
        return f"What is {x} + {y}?"
    if family == "text_minus":
        return f"What is {x} - {y}?"
    _check(family)
    return f"Which number is larger, {x} or {y}?"


def trace_words(family: str, d: tuple[int, int], a: int | None, style: str) -> list[str]:
    """The ECR trace around answer a (style "none", or a missing / non-digit a: no trace)."""
    if style not in tasks.STYLES:
        raise ConfigError(f"tte: trace style {style!r} is unknown; one of {tasks.STYLES}")
    if style == "none" or a is None or not 0 <= a <= 9:
        return []
    if style == "final":
        return [NAMES[a]]
    x, y, a_ = str(d[0]), str(d[1]), str(a)
    cot = {
        "text_plus": [x, "+", y, "=", a_],
        "text_minus": [x, "-", y, "=", a_],
        "text_larger": ["max", x, y, "=", a_],
    }[family]
    return ["<think>", *cot, "</think>", NAMES[a]]


def query_tokens(family: str, d: tuple[int, int], trace: list[str]) -> np.ndarray:
    words = instruction(family, d) + trace
    return tasks.pad_to(tasks.encode(words) + [tasks.EOS], tasks.QUERY_LEN, "a text query")


def pair(rng: np.random.Generator, s: tasks.Split, fmt: examples.QueryFormat) -> dict:
    """One training pair of a uniformly drawn text family over its training pairs, with the
    teacher's trace (the true answer; rho > 0: the noisy teacher's corrupted digits)."""
    family = TEXT_FAMILIES[int(rng.integers(len(TEXT_FAMILIES)))]
    train = pairs_in(family, "train")
    d = train[int(rng.integers(len(train)))]
    a = answer(family, d)
    noisy = tasks.corrupt(d, fmt.rho, rng)
    seen = answer(family, noisy) if noisy != d else a
    trace = trace_words(family, noisy, seen if 0 <= seen <= 9 else None, fmt.style)
    row = int(rng.choice(s.by_class[a]))
    shift = int(rng.integers(len(tasks.SHIFTS)))
    return {
        "q_image": tasks.BLANK,
        "q_tokens": query_tokens(family, d, trace),
        "t_image": examples.query_image(s, (row, -1), (shift, 0)),
        "t_tokens": tasks.target_text("simple", a),  # an image target: eos alone
        "label": np.int32(a),
        "family": np.int32(TEXT_FAMILIES.index(family)),
    }


def eval_queries(s: tasks.Split, family: str, name: str, n: int, seed: int) -> examples.Queries:
    """n queries over the family's pairs of group `name`, fixed by (seed, family, group), each
    with a positive image of the answer class and 999 negatives of other classes."""
    rng = np.random.default_rng([seed, TEXT_FAMILIES.index(family), GROUPS.index(name)])
    d_N2 = np.array(pairs_in(family, name))[rng.integers(len(pairs_in(family, name)), size=n)]
    answer_N = np.array([answer(family, tuple(d)) for d in d_N2])
    rows_g = np.repeat(np.arange(len(s.labels_N)), len(tasks.SHIFTS))
    label_g = s.labels_N[rows_g]
    positive, negatives = [], []
    for a in answer_N:
        positive.append(int(rng.choice(s.by_class[a])) * len(tasks.SHIFTS) + int(rng.integers(9)))
        negatives.append(examples.negatives(rng, label_g, rows_g, family, a, -1))
    return examples.Queries(
        family=family,
        image=np.repeat(tasks.BLANK[None], n, 0),
        slots=np.full((n, 2, 8, 8), -1.0, np.float32),
        shown=d_N2,
        k=np.full(n, -1),
        answer=answer_N,
        positive=np.array(positive),
        negatives=np.array(negatives),
    )


def digits(d_2) -> tuple[int, int]:
    return int(d_2[0]), int(d_2[1])


def query_sides(q: examples.Queries, answers: list, style: str):
    """(images, tokens) of text queries whose traces are written around `answers` (per query:
    the teacher's, or the LM's parsed answer, None for none)."""
    tokens = [
        query_tokens(q.family, d, trace_words(q.family, d, a, style))
        for d, a in zip(map(digits, q.shown), answers, strict=True)
    ]
    return q.image, np.stack(tokens)


def answers(q: examples.Queries) -> list[int]:
    """The teacher's answers: computed from each query's own digits (its input text)."""
    return [answer(q.family, digits(d)) for d in q.shown]
