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

Words and pseudowords are split into "train" and "eval" by a hash of the string, so evaluation
reads letter strings the model never saw.
"""

import functools
import zlib

import numpy as np

from methods.vwf_dyslexia import stimuli

TASKS = ("lexical", "letters", "shapes", "sentence")
SPECIALS = ("<pad>", "<query>", "<yes>", "<no>", *(f"<{t}>" for t in TASKS))
SENTENCE_WORDS = (*stimuli.SHAPES, "left", "right", "of")
VOCAB = (*SPECIALS, *stimuli.LETTERS, *(f"<{w}>" for w in SENTENCE_WORDS))
TOKEN = {s: i for i, s in enumerate(VOCAB)}
PAD, QUERY, YES, NO = (TOKEN[s] for s in SPECIALS[:4])
SENTENCE_LEN = 4  # words: "<shape> left|right of <shape>"
TEXT_LEN = 1 + SENTENCE_LEN + 1 + 2  # task, sentence, query, the longest answer (2 letters)
EVAL_FRACTION = 0.1


def in_split(text: str, split: str) -> bool:
    """A stable hash split of letter strings: "eval" holds EVAL_FRACTION of them."""
    is_eval = zlib.crc32(text.encode()) % 1000 < EVAL_FRACTION * 1000
    return is_eval == (split == "eval")


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
    if len(words) > SENTENCE_LEN or len(answer) > 2:
        raise ValueError(f"text {text!r} is longer than the {SENTENCE_LEN} words allowed")
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


def task_example(
    rng: np.random.Generator, task: str, strings: LetterStrings, fonts=stimuli.FONTS
) -> dict:
    """One example of `task` (the lesion evaluation's per-task sets)."""
    task_id = TASKS.index(task)
    if task == "lexical":
        text, real = strings.draw(rng, lexical=True)
        return lexical_example(text, real, fonts[rng.integers(len(fonts))], rng)
    if task == "letters":
        text, _ = strings.draw(rng)
        image = stimuli.render_text(text, fonts[rng.integers(len(fonts))], rng)
        out = encode(task, [TOKEN[text[0]], TOKEN[text[-1]]])
    elif task == "shapes":
        image, label, _ = stimuli.shape_comparison(rng)
        out = encode(task, [YES if label else NO])
    else:
        image, sentence, label = stimuli.sentence_picture(rng)
        out = encode(task, [YES if label else NO], sentence)
    return {**out, "image": image[:, :, None], "task": np.int32(task_id)}


def lexical_example(text: str, real: bool, font: str, rng: np.random.Generator) -> dict:
    """The lexical-decision example of any letter string (`lexical.py` reads word lists
    through it): rendered as in training, answer yes when `real`."""
    if not text or set(text) - set(stimuli.LETTERS):
        raise ValueError(f"{text!r}: lexical decision takes lowercase a-z strings only")
    image = stimuli.render_text(text, font, rng)
    out = encode("lexical", [YES if real else NO])
    return {**out, "image": image[:, :, None], "task": np.int32(TASKS.index("lexical"))}
