"""The four training tasks as (image, text) examples for the VLM, and their tokens.

Text is characters: a task token, the sentence's letters for sentence-picture matching, a query
token, then the answer tokens, right-padded to `TEXT_LEN` + 1 and shifted into inputs /
targets; the loss mask is 1 on answer targets only (the prompt is given, never predicted).

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
VOCAB = (*SPECIALS, " ", *stimuli.LETTERS)
TOKEN = {s: i for i, s in enumerate(VOCAB)}
PAD, QUERY, YES, NO = (TOKEN[s] for s in SPECIALS[:4])
SENTENCE_LEN = len("triangle right of triangle")  # the longest sentence
TEXT_LEN = 1 + SENTENCE_LEN + 1 + 2  # task, sentence, query, the longest answer (2 letters)
EVAL_FRACTION = 0.1


def in_split(text: str, split: str) -> bool:
    """A stable hash split of letter strings: "eval" holds EVAL_FRACTION of them."""
    is_eval = zlib.crc32(text.encode()) % 1000 < EVAL_FRACTION * 1000
    return is_eval == (split == "eval")


@functools.cache
def letter_strings(split: str) -> "LetterStrings":
    """The split's `LetterStrings`, built once per process."""
    return LetterStrings(split)


class LetterStrings:
    """The split's real words and a pool of its pseudowords (drawn once per split)."""

    def __init__(self, split: str, num_pseudowords: int = 20000):
        self.words = [w for w in stimuli.word_list() if in_split(w, split)]
        pool = stimuli.pseudowords(num_pseudowords, seed=0 if split == "train" else 1)
        self.pseudowords = [w for w in pool if in_split(w, split)]

    def draw(self, rng: np.random.Generator) -> tuple[str, bool]:
        real = bool(rng.random() < 0.5)
        pool = self.words if real else self.pseudowords
        return pool[rng.integers(len(pool))], real


def encode(task: str, answer: list[int], text: str = "") -> dict[str, np.ndarray]:
    """inputs, targets [TEXT_LEN] and the answer mask for one example's text."""
    seq = [TOKEN[f"<{task}>"], *(TOKEN[c] for c in text), QUERY, *answer]
    if len(text) > SENTENCE_LEN or len(seq) > TEXT_LEN + 1:
        raise ValueError(f"text {text!r} is longer than the {SENTENCE_LEN} characters allowed")
    seq = np.array(seq + [PAD] * (TEXT_LEN + 1 - len(seq)), np.int32)
    mask = np.zeros(TEXT_LEN, np.float32)
    first = len(seq) - np.count_nonzero(seq == PAD) - len(answer) - 1
    mask[first : first + len(answer)] = 1.0
    return {"inputs": seq[:-1], "targets": seq[1:], "mask": mask}


def example(rng: np.random.Generator, strings: LetterStrings, fonts=stimuli.FONTS) -> dict:
    """One example of a task drawn uniformly: image [32, 128, 1], text and task id."""
    task_id = int(rng.integers(len(TASKS)))
    task = TASKS[task_id]
    if task in ("lexical", "letters"):
        text, real = strings.draw(rng)
        image = stimuli.render_text(text, fonts[rng.integers(len(fonts))], rng)
        if task == "lexical":
            out = encode(task, [YES if real else NO])
        else:
            out = encode(task, [TOKEN[text[0]], TOKEN[text[-1]]])
    elif task == "shapes":
        image, label, _ = stimuli.shape_comparison(rng)
        out = encode(task, [YES if label else NO])
    else:
        image, sentence, label = stimuli.sentence_picture(rng)
        out = encode(task, [YES if label else NO], sentence)
    return {**out, "image": image[:, :, None], "task": np.int32(task_id)}
