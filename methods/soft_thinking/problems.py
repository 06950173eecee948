"""Arithmetic problems for the pretrained model, generated and checked by code: a ladder of
difficulty levels from the simple end, disjoint validation and test problems, answer parsing.

    problems.LEVELS                       # ("add_1d", "add_2d_1d", "add_3x1d", "word_1", "word_2")
    qs = problems.draw("add_1d", "validation", n=48, seed=0)   # [Problem(question, answer, level)]
    problems.parse_answer(" is 12.")      # 12: the first integer after the delimiter, same line

Levels (`LEVELS`, in the order of the issue's first look at the model: single-digit sums easiest,
multi-step word problems hardest):
- add_1d: "What is a + b?" with single digits, in three phrasings;
- add_2d_1d: a two-digit plus a one-digit number, same phrasings;
- add_3x1d: three single digits, "What is a + b + c?" and two other phrasings;
- word_1: a one-step word problem (someone has a items, gets b more or gives b away);
- word_2: two steps (gets b more, then gives c away).
Every problem is a question text and its integer answer. The answer is computed when the
problem is made, from the same numbers the text is written from; the tests check it again by
reading the numbers back out of the text.

Splits: a problem belongs to validation or test by a hash of its question text (Knuth's
multiplicative hash of a CRC-32, as task.py hashes its multisets), so the same question is
never in both; `draw` returns distinct problems of one split. There is no training split: the
model is used as it is (the paper's setting is training-free). Validation problems only choose
the difficulty level (`experiment_pretrained`); test problems are cut into disjoint test splits
there.
"""

import dataclasses
import re
import zlib

import numpy as np

from core.errors import ConfigError

SPLITS = ("validation", "test")
# Out of every 10 hash buckets: 3 validation, 7 test (test needs several disjoint splits).
_BUCKETS = {"validation": (0, 1, 2), "test": (3, 4, 5, 6, 7, 8, 9)}
MAX_DRAWS_PER_PROBLEM = 200  # rejection draws per wanted problem before giving up

_NAMES = (("Sara", "she"), ("Tom", "he"), ("Maria", "she"), ("Ben", "he"), ("Lena", "she"))
_ITEMS = ("apples", "pencils", "marbles", "books", "stickers", "cookies")
_SUM_PHRASINGS = ("What is {}?", "Compute {}.", "Calculate {}.")


@dataclasses.dataclass(frozen=True)
class Problem:
    question: str
    answer: int
    level: str


def _sum_problem(level, rng, ranges) -> Problem:
    terms = [int(rng.integers(low, high + 1)) for low, high in ranges]
    phrasing = _SUM_PHRASINGS[int(rng.integers(len(_SUM_PHRASINGS)))]
    return Problem(phrasing.format(" + ".join(map(str, terms))), sum(terms), level)


def _word_problem(level, rng, steps: int) -> Problem:
    name, pronoun = _NAMES[int(rng.integers(len(_NAMES)))]
    items = _ITEMS[int(rng.integers(len(_ITEMS)))]
    have = int(rng.integers(2, 10))
    sentences = [f"{name} has {have} {items}."]
    ops = ["gets", "gives"] if steps == 2 else [["gets", "gives"][int(rng.integers(2))]]
    for op in ops:
        if op == "gets":
            more = int(rng.integers(1, 10))
            sentences.append(f"{pronoun.capitalize()} gets {more} more {items}.")
            have += more
        else:
            away = int(rng.integers(1, have + 1))  # never below zero
            sentences.append(f"{pronoun.capitalize()} gives {away} {items} to a friend.")
            have -= away
    sentences.append(f"How many {items} does {name} have now?")
    return Problem(" ".join(sentences), have, level)


_MAKERS = {
    "add_one": lambda rng: _sum_problem("add_one", rng, [(0, 99), (1, 1)]),
    "add_1d": lambda rng: _sum_problem("add_1d", rng, [(0, 9), (0, 9)]),
    "add_2d_1d": lambda rng: _sum_problem("add_2d_1d", rng, [(10, 99), (0, 9)]),
    "add_3x1d": lambda rng: _sum_problem("add_3x1d", rng, [(0, 9)] * 3),
    "word_1": lambda rng: _word_problem("word_1", rng, steps=1),
    "word_2": lambda rng: _word_problem("word_2", rng, steps=2),
}
LEVELS = tuple(_MAKERS)


def split_of(question: str) -> str:
    """The split of a question: a hash of its text into 10 buckets (module docstring)."""
    bucket = (zlib.crc32(question.encode()) * 2654435761) % 2**32 % 10
    return next(name for name, buckets in _BUCKETS.items() if bucket in buckets)


def draw(level: str, split: str, n: int, seed: int) -> list[Problem]:
    """n distinct problems of `level` in `split`, reproducible from `seed`."""
    if level not in _MAKERS:
        raise ConfigError(f"soft_thinking problems: level {level!r}; expected one of {LEVELS}")
    if split not in SPLITS:
        raise ConfigError(f"soft_thinking problems: split {split!r}; expected one of {SPLITS}")
    rng = np.random.default_rng([seed, SPLITS.index(split), LEVELS.index(level)])
    found: dict[str, Problem] = {}
    for _ in range(MAX_DRAWS_PER_PROBLEM * n):
        if len(found) == n:
            break
        problem = _MAKERS[level](rng)
        if problem.question not in found and split_of(problem.question) == split:
            found[problem.question] = problem
    if len(found) < n:
        raise ConfigError(
            f"soft_thinking problems: level {level!r} has only {len(found)} distinct {split} "
            f"problems in {MAX_DRAWS_PER_PROBLEM * n} draws; asked for n={n}"
        )
    return list(found.values())


# An integer: an optional minus (ASCII or the Unicode minus sign), digits, optional thousands
# groups ("1,000"); not the digits of a decimal's fraction part.
_INTEGER = re.compile(r"(?<![\d.])([-\u2212]?)(\d{1,3}(?:,\d{3})+|\d+)(?![\d]|\.\d)")


_MARKER = "answer"  # the delimiter's word: a later one restates the answer


def parse_answer(text_after_delimiter: str) -> int | None:
    """The answer in what follows the delimiter (" answer"): the first integer on the line of
    the LAST "answer" in it (the delimiter's own line when there is no other), e.g. " is 12."
    -> 12, " to find.\n\nSo, the answer is 13." -> 13; None if that line has no integer."""
    lower = text_after_delimiter.lower()
    last = lower.rfind(_MARKER)
    tail = text_after_delimiter[last + len(_MARKER) :] if last >= 0 else text_after_delimiter
    match = _INTEGER.search(tail.split("\n", 1)[0])
    if match is None:
        return None
    sign, digits = match.groups()
    value = int(digits.replace(",", ""))
    return -value if sign else value
