"""The retrieval task: scikit-learn digits as the image modality and a small instruction language.

A query is (an 8 x 16 image holding one digit, or two side by side; an instruction); its target is
an image or a text. Six families, as MMEB's meta-tasks at CPU scale:

    simple      "find this digit"          -> the same digit image at another 1-px shift
    plus_k      "find plus k"              -> an image of (x + k) mod 10
    nine_minus  "find nine minus digit"    -> an image of 9 - x
    larger      "find larger of two"       -> an image of max(x, y)        (two digits shown)
    vqa         "is it even ?" | "is it greater than k ?"  -> the text "yes" or "no"
    classify    "what number ?"            -> the text of the digit's name

`simple` is instance retrieval (the target is the query's own digit image, so the image itself
matters beyond its class); the others are class-level: any image of the answer class is right.

Embedding-centric reasoning (ECR) traces, "<think> CoT </think> final answer":

    plus_k, x = 4, k = 3:  <think> see 4 ; 4 + 3 = 7 </think> seven
    vqa (greater than 3):  <think> see 4 ; 4 > 3 </think> yes

`trace_words(family, digits, k, style)` writes them from the digits a reasoner *perceives*: the
teacher oracle passes the true labels (training data only); at test time the digits come from
the inputs alone (the digits classifier, or a trained reasoner decodes the whole trace), so no
label reaches a test-time trace. style "final" keeps the answer word only; `corrupt` is the noisy
teacher (with probability rho the perceived digits are replaced by other digits, a consistent
but wrong trace).

Evaluation (`eval_queries`): per family, fixed queries from a split; an image family's gallery is
every (image, shift) of the split (9 per image), each query scored against its positive and 999
negatives (other instances for `simple`, other classes otherwise): Precision@1 over 1,000
candidates as in MMEB. A text family's gallery is its label set (yes/no; the ten names).
"""

from typing import NamedTuple

import numpy as np

from core import digits
from core.errors import ConfigError

FAMILIES = ("simple", "plus_k", "nine_minus", "larger", "vqa", "classify")
IMAGE_FAMILIES = FAMILIES[:4]
COMPOSITIONAL = ("plus_k", "nine_minus", "larger")
TEXT_FAMILIES = ("text_plus", "text_minus", "text_larger")  # plain text, no image (`text`)
IMAGE_TARGETS = (*IMAGE_FAMILIES, *TEXT_FAMILIES)  # families whose target is a gallery image
NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
ANSWER_TEXTS = (*NAMES, "yes", "no")  # a text target's id indexes this
YES, NO = 10, 11
STYLES = ("none", "full", "final")

SPECIAL = ("<pad>", "<eos>", "<img>", "<think>", "</think>")
WORDS = (
    *("find", "this", "digit", "plus", "nine", "minus", "larger", "of", "two", "is", "it"),
    *("even", "odd", "greater", "than", "what", "number", "?", "see", ";", "+", "-", "="),
    *(">", "<", "max"),
)
VOCAB = (*SPECIAL, *(str(d) for d in range(10)), *ANSWER_TEXTS, *WORDS)
TOKEN = {w: i for i, w in enumerate(VOCAB)}
PAD, EOS, IMG = TOKEN["<pad>"], TOKEN["<eos>"], TOKEN["<img>"]

INSTRUCTION_LEN = 6  # "is it greater than k ?"
TRACE_LEN = 12  # "<think> see x ; see y ; max = a </think> word" is 11
QUERY_LEN = INSTRUCTION_LEN + TRACE_LEN + 1  # + eos
TARGET_LEN = 2  # a word and eos
SHIFTS = tuple((dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1))
IMAGE_SHAPE = (8, 16, 1)
GALLERY_SIZE = 1000


def encode(words) -> list[int]:
    try:
        return [TOKEN[w] for w in words]
    except KeyError as e:
        raise ConfigError(f"tte: {e.args[0]!r} is not in the task vocabulary") from None


def decode(ids) -> list[str]:
    return [VOCAB[int(i)] for i in ids]


def instruction(family: str, k: int) -> list[str]:
    if family == "simple":
        return ["find", "this", "digit"]
    if family == "plus_k":
        return ["find", "plus", str(k)]
    if family == "nine_minus":
        return ["find", "nine", "minus", "digit"]
    if family == "larger":
        return ["find", "larger", "of", "two"]
    if family == "vqa":
        return ["is", "it", "even", "?"] if k < 0 else ["is", "it", "greater", "than", str(k), "?"]
    if family == "classify":
        return ["what", "number", "?"]
    raise ConfigError(f"tte: family {family!r} is unknown; one of {', '.join(FAMILIES)}")


def answer(family: str, d: tuple[int, int], k: int) -> int:
    """The answer class (image families) or ANSWER_TEXTS id (text families) for digits d."""
    x, y = d
    if family in ("simple", "classify"):
        return x
    if family == "plus_k":
        return (x + k) % 10
    if family == "nine_minus":
        return 9 - x
    if family == "larger":
        return max(x, y)
    if family == "vqa":
        return YES if (x % 2 == 0 if k < 0 else x > k) else NO
    raise ConfigError(f"tte: family {family!r} is unknown; one of {', '.join(FAMILIES)}")


def _cot(family: str, d: tuple[int, int], k: int, a: int) -> list[str]:
    x, y = (str(v) for v in d)
    if family == "plus_k":
        return ["see", x, ";", x, "+", str(k), "=", str(a)]
    if family == "nine_minus":
        return ["see", x, ";", "9", "-", x, "=", str(a)]
    if family == "larger":
        return ["see", x, ";", "see", y, ";", "max", "=", str(a)]
    if family == "vqa" and k < 0:
        return ["see", x, ";", x, "even" if d[0] % 2 == 0 else "odd"]
    if family == "vqa":
        sign = ">" if d[0] > k else "<" if d[0] < k else "="
        return ["see", x, ";", x, sign, str(k)]
    return ["see", x]


def trace_words(family: str, d: tuple[int, int], k: int, style: str) -> list[str]:
    """The ECR trace of a reasoner that perceives digits d (module docstring)."""
    if style not in STYLES:
        raise ConfigError(f"tte: trace style {style!r} is unknown; one of {', '.join(STYLES)}")
    if style == "none":
        return []
    a = answer(family, d, k)
    final = [ANSWER_TEXTS[a]]
    return final if style == "final" else ["<think>", *_cot(family, d, k, a), "</think>", *final]


def corrupt(d: tuple[int, int], rho: float, rng: np.random.Generator) -> tuple[int, int]:
    """With probability rho, every shown digit replaced by a uniformly drawn other digit."""
    if rho <= 0 or rng.random() >= rho:
        return d
    return tuple(v if v < 0 else int((v + rng.integers(1, 10)) % 10) for v in d)


def pad_to(ids: list[int], length: int, what: str) -> np.ndarray:
    if len(ids) > length:
        raise ConfigError(f"tte: {what} of {len(ids)} tokens exceeds {length}")
    return np.asarray(ids + [PAD] * (length - len(ids)), np.int32)


def query_text(family: str, k: int, trace: list[str], *, trace_only: bool = False) -> np.ndarray:
    """[QUERY_LEN] ids: instruction, trace, eos, right-padded (trace_only: the trace alone)."""
    words = ([] if trace_only else instruction(family, k)) + trace
    return pad_to(encode(words) + [EOS], QUERY_LEN, "a query")


def target_text(family: str, a: int) -> np.ndarray:
    """[TARGET_LEN] ids: an image target's is eos alone; a text target's is its word, eos."""
    words = [] if family in IMAGE_FAMILIES else [ANSWER_TEXTS[a]]
    return pad_to(encode(words) + [EOS], TARGET_LEN, "a target")


def shifted(image_88, shift: tuple[int, int]) -> np.ndarray:
    """The 8 x 8 digit moved by (dy, dx), background (-1) filled in."""
    dy, dx = shift
    padded = np.pad(image_88, 1, constant_values=-1.0)
    return padded[1 - dy : 9 - dy, 1 - dx : 9 - dx]


def canvas(left_88, right_88=None) -> np.ndarray:
    """[8, 16, 1]: one digit on the left (and another on the right, else background)."""
    right = np.full((8, 8), -1.0, np.float32) if right_88 is None else right_88
    return np.concatenate([left_88, right], axis=1)[..., None].astype(np.float32)


BLANK = canvas(np.full((8, 8), -1.0, np.float32))


class Split(NamedTuple):
    """A digits split and its class index (rows of each class)."""

    images_N88: np.ndarray
    labels_N: np.ndarray
    by_class: tuple[np.ndarray, ...]


def split(name: str) -> Split:
    """core.digits' fixed split "train" | "validation" | "test"."""
    splits = digits.load_splits()
    if name not in splits._fields:
        raise ConfigError(f"tte: split {name!r} is unknown; one of {', '.join(splits._fields)}")
    s = getattr(splits, name)
    by_class = tuple(np.flatnonzero(s.labels == c) for c in range(10))
    return Split(s.images[..., 0], s.labels, by_class)
