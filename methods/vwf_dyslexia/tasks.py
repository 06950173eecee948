"""The four training tasks as (image, text) examples for the VLM, and their tokens.

Text is tokens: a task token, the sentence's words for sentence-picture matching (one token
per word: `SENTENCE_WORDS`), a query token, then the answer tokens (yes / no, or letters),
right-padded to `TEXT_LEN` + 1 and shifted into inputs / targets; the loss mask is 1 on answer
targets only (the prompt is given, never predicted). Word tokens rather than characters keep
the text 8 tokens long instead of 30: the decoder's cost on CPU is its sequence length, and
the sentence only has to be understood, not read.

  lexical    image: a real word or a pseudoword (half each); answer yes (real) / no
  letters    image: a real word or a pseudoword; answer its first and last letters (builds
             the reading pathway the lexical decision can use)
  shapes     image: circles and squares; answer yes when there are more circles
  sentence   image: two shapes; text: "<x> left of <y>"; answer yes when it matches

The re-test (issue 47, diet "v2") adds a non-reading task on each of the localiser's non-word
categories, drawn by the localiser's own generators, so that no category is out of
distribution, and makes reading (lexical, letters) a minority of the examples (`DIETS`):

  faces      image: a line face (`stimuli.face`); answer yes when it smiles (half frown)
  objects    image: a line object (`stimuli.line_object_parts`); yes when an ellipse is a part
  scrambled  image: a letter string rendered as for reading, then scrambled (`stimuli.scramble`,
             the localiser's "scrambled_word"); yes when its ink is wider than `SCRAMBLED_WIDE`

Words and pseudowords are split into "train", "val" and "eval" by a hash of the string, so
evaluation reads letter strings the model never saw, and the recipe (learning rate,
curriculum) is chosen on "val" strings the lesion evaluation ("eval") never uses.
"""

import dataclasses
import functools
import zlib

import numpy as np

from core.errors import ConfigError
from methods.vwf_dyslexia import stimuli

TASKS = ("lexical", "letters", "shapes", "sentence")  # the first diet's ("v1")
NEW_TASKS = ("faces", "objects", "scrambled")  # the re-test's ("v2"), on the localiser's images
ALL_TASKS = TASKS + NEW_TASKS  # a task's id is its index here
READING = ("lexical", "letters")  # the tasks that read a letter string in the image
# The training tasks whose images each localiser category's generator draws.
TASKS_OF_CATEGORY = {
    "word": READING, "scrambled_word": ("scrambled",), "face": ("faces",), "object": ("objects",),
}  # fmt: skip
# Diet -> task -> weight of its share of the training examples. v2: reading 22.5 % (issue 47:
# "about 20-25 %"), split evenly; the five non-reading tasks share the rest evenly.
READING_SHARE = 0.225
DIETS = {
    "v1": {t: 1.0 for t in TASKS},
    "v2": {t: READING_SHARE / 2 if t in READING else (1 - READING_SHARE) / 5 for t in ALL_TASKS},
}
SPECIALS = ("<pad>", "<query>", "<yes>", "<no>", *(f"<{t}>" for t in TASKS))
SENTENCE_WORDS = (*stimuli.SHAPES, "left", "right", "of")
# The new tasks' tokens come last, so the first diet's ids (and its model's vocabulary size,
# `vocab_size`) are what they were.
V1_VOCAB = (*SPECIALS, *stimuli.LETTERS, *(f"<{w}>" for w in SENTENCE_WORDS))
VOCAB = (*V1_VOCAB, *(f"<{t}>" for t in NEW_TASKS))
TOKEN = {s: i for i, s in enumerate(VOCAB)}
SCRAMBLED_WIDE = 55  # px: about the median ink width of scrambled training strings (jitter 0)
PAD, QUERY, YES, NO = (TOKEN[s] for s in SPECIALS[:4])
SENTENCE_LEN = 4  # words: "<shape> left|right of <shape>"
MAX_LETTERS = 7  # the longest letter string (`stimuli.word_list`, `stimuli.pseudowords`)
# task, sentence, query, yes/no | task, query, the longest answer (every letter, spelled)
TEXT_LEN = max(1 + SENTENCE_LEN + 1 + 1, 1 + 1 + MAX_LETTERS)
SPLITS = {"val": (0, 50), "eval": (50, 100), "train": (100, 1000)}  # per-mille hash buckets


def check_diet(diet: str) -> dict:
    """The diet's task weights, or a one-line error naming it."""
    if diet not in DIETS:
        raise ConfigError(f"unknown diet {diet!r}; expected one of {tuple(DIETS)}")
    return DIETS[diet]


def vocab_size(diet: str) -> int:
    """The model's vocabulary for a diet: the first diet's model has no new task tokens."""
    check_diet(diet)
    return len(V1_VOCAB) if diet == "v1" else len(VOCAB)


def in_split(text: str, split: str) -> bool:
    """A stable hash split of letter strings: "val" and "eval" hold 5 % of them each."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {tuple(SPLITS)}")
    low, high = SPLITS[split]
    return low <= zlib.crc32(text.encode()) % 1000 < high


@functools.cache
def letter_strings(split: str, lexicon_size: int = 0) -> "LetterStrings":
    """The split's `LetterStrings`, built once per process."""
    return LetterStrings(split, lexicon_size=lexicon_size)


def lexicon(size: int) -> tuple[str, ...]:
    """`size` training-split words drawn once (seed 0): the words the model is taught to know.
    A tiny model cannot learn the 25k-word list's membership in CPU minutes, and held-out real
    words would make lexical decision a guess at orthographic statistics beyond the bigrams
    the pseudowords share; a known lexicon makes it what a child's is: is this a word I know?"""
    words = [w for w in stimuli.word_list() if in_split(w, "train")]
    if not 0 < size <= len(words):
        raise ValueError(f"lexicon size {size} must be in 1..{len(words)}")
    picks = np.random.default_rng(0).choice(len(words), size=size, replace=False)
    return tuple(sorted(words[i] for i in picks))


class LetterStrings:
    """The split's real words and a pool of its pseudowords (drawn once per split).

    lexicon_size 0: lexical decision draws the split's real words (evaluation: words never
    trained on). lexicon_size > 0: its real words are `lexicon(lexicon_size)` in both splits
    (evaluation: known words in fresh renderings, pseudowords never seen); the letter read-out
    still reads every word of the split."""

    def __init__(self, split: str, num_pseudowords: int = 20000, lexicon_size: int = 0):
        self.words = [w for w in stimuli.word_list() if in_split(w, split)]
        self.known = list(lexicon(lexicon_size)) if lexicon_size else self.words
        pool = stimuli.pseudowords(num_pseudowords, seed=0 if split == "train" else 1)
        self.pseudowords = [w for w in pool if in_split(w, split)]

    def draw(self, rng: np.random.Generator, *, lexical: bool = False) -> tuple[str, bool]:
        """(string, is a real word): half and half; lexical=True draws real words from the
        lexicon."""
        real = bool(rng.random() < 0.5)
        pool = (self.known if lexical else self.words) if real else self.pseudowords
        return pool[rng.integers(len(pool))], real


def encode(task: str, answer: list[int], text: str = "") -> dict[str, np.ndarray]:
    """inputs, targets [TEXT_LEN] and the answer mask for one example's text (a sentence of
    `SENTENCE_WORDS`)."""
    words = text.split()
    if len(words) > SENTENCE_LEN:
        raise ValueError(f"text {text!r} is longer than the {SENTENCE_LEN} words allowed")
    if 2 + len(words) + len(answer) > TEXT_LEN + 1:
        raise ValueError(f"an answer of {len(answer)} tokens does not fit after {text!r}")
    unknown = sorted(set(words) - set(SENTENCE_WORDS))
    if unknown:
        raise ValueError(f"text {text!r}: words {unknown} not in {SENTENCE_WORDS}")
    seq = [TOKEN[f"<{task}>"], *(TOKEN[f"<{w}>"] for w in words), QUERY, *answer]
    seq = np.array(seq + [PAD] * (TEXT_LEN + 1 - len(seq)), np.int32)
    mask = np.zeros(TEXT_LEN, np.float32)
    first = len(seq) - np.count_nonzero(seq == PAD) - len(answer) - 1
    mask[first : first + len(answer)] = 1.0
    return {"inputs": seq[:-1], "targets": seq[1:], "mask": mask}


def example(rng: np.random.Generator, strings: LetterStrings, fonts=stimuli.FONTS) -> dict:
    """One example of a task drawn uniformly: image [32, 128, 1], text and task id."""
    return task_example(rng, TASKS[int(rng.integers(len(TASKS)))], strings, fonts)


@dataclasses.dataclass(frozen=True)
class Curriculum:
    """The training stream by step, host code keyed by the batch index (`core.data.synthetic`
    indexed=True), so a resumed run sees the same batches. Letter strings are drawn at a fixed
    size and place (jitter 0) until `jitter_from`, then their randomness ramps linearly up to
    `jitter` (the final stimuli's, `stimuli.render_text`; evaluation uses it) at `jitter_to`;
    lexical decision joins the uniform task mixture at `lexical_from` (before it the other
    three tasks share the batch). spell: the letter read-out answers every letter of the
    string, not the first and last. diet: the tasks and their shares (`DIETS`). The defaults
    are the plain stream: the first diet's tasks at full jitter from step 0."""

    jitter: float = 1.0
    jitter_from: int = 0
    jitter_to: int = 0
    lexical_from: int = 0
    spell: bool = False
    diet: str = "v1"

    def __post_init__(self):
        if not 0 <= self.jitter_from <= self.jitter_to or self.lexical_from < 0:
            raise ConfigError(
                f"curriculum needs 0 <= jitter_from <= jitter_to and lexical_from >= 0, got "
                f"{self.jitter_from}, {self.jitter_to}, {self.lexical_from}"
            )
        if not 0.0 <= self.jitter <= 1.0:
            raise ConfigError(f"curriculum jitter must be in [0, 1], got {self.jitter}")
        check_diet(self.diet)

    def jitter_at(self, step: int) -> float:
        if step >= self.jitter_to:
            return self.jitter
        ramp = (step - self.jitter_from) / (self.jitter_to - self.jitter_from)
        return self.jitter * max(0.0, ramp)

    def tasks(self, step: int) -> tuple[str, ...]:
        names = tuple(DIETS[self.diet])
        return names if step >= self.lexical_from else tuple(t for t in names if t != "lexical")

    def draw(self, rng: np.random.Generator, step: int) -> str:
        """A task of batch `step` by the diet's shares (an even diet: one integer draw, the
        stream the first diet has always had)."""
        names = self.tasks(step)
        weights = np.array([DIETS[self.diet][t] for t in names])
        if np.all(weights == weights[0]):
            return names[int(rng.integers(len(names)))]
        return names[int(rng.choice(len(names), p=weights / weights.sum()))]


def curriculum_example(
    rng: np.random.Generator, step: int, strings: LetterStrings, curriculum: Curriculum
) -> dict:
    """One training example of batch `step`: a task drawn by the diet's shares from the
    curriculum's tasks at that step, its letter strings at the step's jitter."""
    task = curriculum.draw(rng, step)
    return task_example(
        rng, task, strings, jitter=curriculum.jitter_at(step), spell=curriculum.spell
    )


def eval_example(rng: np.random.Generator, strings: LetterStrings, curriculum: Curriculum):
    """A held-out example as the trained model is scored: every task, the final jitter."""
    return curriculum_example(
        rng, max(curriculum.jitter_to, curriculum.lexical_from), strings, curriculum
    )


def task_example(
    rng: np.random.Generator,
    task: str,
    strings: LetterStrings,
    fonts=stimuli.FONTS,
    jitter: float = 1.0,
    spell: bool = False,
) -> dict:
    """One example of `task` (the lesion evaluation's per-task sets); `jitter` scales the
    letter strings' random size and place (`stimuli.render_text`); spell: the letter read-out
    answers every letter of the string, not the first and last."""
    if task not in ALL_TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {ALL_TASKS}")
    task_id = ALL_TASKS.index(task)
    if task == "lexical":
        text, real = strings.draw(rng, lexical=True)
        return lexical_example(text, real, fonts[rng.integers(len(fonts))], rng, jitter)
    if task == "letters":
        text, _ = strings.draw(rng)
        image = stimuli.render_text(text, fonts[rng.integers(len(fonts))], rng, jitter)
        out = encode(task, [TOKEN[c] for c in (text if spell else text[0] + text[-1])])
    elif task == "shapes":
        image, label, _ = stimuli.shape_comparison(rng)
        out = encode(task, [YES if label else NO])
    elif task in NEW_TASKS:
        image, label = new_task_image(task, rng, strings, fonts, jitter)
        out = encode(task, [YES if label else NO])
    else:
        image, sentence, label = stimuli.sentence_picture(rng)
        out = encode(task, [YES if label else NO], sentence)
    return {**out, "image": image[:, :, None], "task": np.int32(task_id)}


def new_task_image(task: str, rng, strings: LetterStrings, fonts, jitter: float):
    """(image, label) of a re-test task on a localiser category, drawn by the localiser's own
    generator (`stimuli.localiser_images`): faces and objects as they are; the scrambled
    strings are the lexical task's strings (lexicon words or pseudowords) rendered and
    scrambled as the localiser's "scrambled_word" images are."""
    if task == "faces":
        smile = bool(rng.random() < 0.5)
        return stimuli.face(rng, smile=smile), smile
    if task == "objects":
        image, kinds = stimuli.line_object_parts(rng)
        return image, "ellipse" in kinds
    text, _ = strings.draw(rng, lexical=True)
    image = stimuli.render_text(text, fonts[rng.integers(len(fonts))], rng, jitter)
    image = stimuli.scramble(image, rng)
    return image, stimuli.ink_width(image) > SCRAMBLED_WIDE


def lexical_example(
    text: str, real: bool, font: str, rng: np.random.Generator, jitter: float = 1.0
) -> dict:
    """The lexical-decision example of any letter string (`lexical.py` reads word lists
    through it): rendered as in training, answer yes when `real`."""
    if not text or set(text) - set(stimuli.LETTERS):
        raise ValueError(f"{text!r}: lexical decision takes lowercase a-z strings only")
    image = stimuli.render_text(text, font, rng, jitter)
    out = encode("lexical", [YES if real else NO])
    return {**out, "image": image[:, :, None], "task": np.int32(TASKS.index("lexical"))}
