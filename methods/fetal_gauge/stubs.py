"""The model interface the harness runs, and stub models that check the harness and the scoring.

A model answers in one of two ways: `generate` (free text, read by `parse.parse_answer`, as a
chat VLM answers) or `score_options` (one score per option, the argmax wins, as a likelihood
ranking over the options does). The stubs pin down what the scorecard must show: the oracle
scores 1.0; uniform random scores chance; always-"A" scores chance ONLY because the options are
shuffled (on unshuffled options it scores whatever fraction of answers sit at A); a model whose
text never names an option scores 0.0 with invalid rate 1.0.
"""

import hashlib
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from core.errors import ConfigError
from methods.fetal_gauge.records import LETTERS, Record, prompt

STUB_NAMES = ("oracle", "random", "always-a", "parse-failure")


@runtime_checkable
class Model(Protocol):
    """What `harness.evaluate` runs. Define ONE of the two methods below (score_options wins
    when both exist):

    generate(images: list[np.ndarray], prompts: list[str]) -> list[str]
    score_options(images, questions: list[str], options: list[tuple[str, ...]])
        -> list[np.ndarray]   # len(options[i]) scores for question i; higher is better
    """

    name: str


def question_key(image, text: str) -> str:
    """sha256 of an image's bytes (with its shape and dtype, so two shapes never collide) and a
    text: identifies a question by content, never by its position in a call."""
    digest = hashlib.sha256()
    if isinstance(image, np.ndarray):
        array = np.ascontiguousarray(image)
        digest.update(f"{array.shape}|{array.dtype}|".encode())
        digest.update(array.tobytes())
    else:
        digest.update(f"path|{image}|".encode())
    digest.update(text.encode())
    return digest.hexdigest()


class Oracle:
    """Answers every question of `records` with its correct letter, looked up by the sha256 of
    the image bytes plus the prompt the harness shows (so `system` must match the harness's)."""

    name = "oracle"

    def __init__(self, records: Sequence[Record], *, system: str | None = None):
        self._letters: dict[str, str] = {}
        for record in records:
            key = question_key(record.image, prompt(record, system=system))
            if self._letters.setdefault(key, record.answer_letter) != record.answer_letter:
                raise ConfigError(
                    f"fetal_gauge: oracle: qid {record.qid!r} repeats another record's image and "
                    "prompt with a different answer"
                )

    def generate(self, images: list, prompts: list[str]) -> list[str]:
        answers = []
        for image, text in zip(images, prompts, strict=True):
            key = question_key(image, text)
            if key not in self._letters:
                raise ConfigError(
                    "fetal_gauge: oracle was asked a question (image + prompt) that is not among "
                    f"the records it was built from: {text.splitlines()[0]!r}"
                )
            answers.append(self._letters[key])
        return answers


class UniformRandom:
    """Uniform random scores per option from one seeded stream: accuracy at chance."""

    name = "random"

    def __init__(self, seed: int = 0):
        self._rng = np.random.default_rng(seed)

    def score_options(self, images, questions, options) -> list[np.ndarray]:
        return [self._rng.uniform(size=len(opts)) for opts in options]


class AlwaysA:
    """Always answers "A": at chance on shuffled options, biased on unshuffled ones."""

    name = "always-a"

    def generate(self, images, prompts) -> list[str]:
        return [LETTERS[0]] * len(prompts)


class ParseFailure:
    """Answers a text that names no option (no standalone letter, no option text): every
    answer is invalid."""

    name = "parse-failure"
    TEXT = "Unclear."

    def generate(self, images, prompts) -> list[str]:
        return [self.TEXT] * len(prompts)


def make_stub(name: str, records: Sequence[Record] | None = None, seed: int = 0):
    """The stub the CLI names: oracle (needs the records), random, always-a, parse-failure."""
    if name == "oracle":
        if records is None:
            raise ConfigError("fetal_gauge: model='oracle' needs the records it answers")
        return Oracle(records)
    if name == "random":
        return UniformRandom(seed)
    if name == "always-a":
        return AlwaysA()
    if name == "parse-failure":
        return ParseFailure()
    raise ConfigError(
        f"fetal_gauge: model={name!r}; one of {', '.join(STUB_NAMES)} or vlm:<workdir>"
    )
