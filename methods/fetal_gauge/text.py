"""Word-level tokens for the small VLM: the words of every option text (vocab.VOCAB) and every
question (records.QUESTIONS), lower-cased; punctuation marks are tokens of their own. A word
outside them (real data's free text) is UNK: the tiny model only reads the phantom language."""

import re

from methods.fetal_gauge.records import QUESTIONS
from methods.fetal_gauge.vocab import VOCAB

PAD, BOS, SEP, EOS, UNK = 0, 1, 2, 3, 4
SPECIALS = ("<pad>", "<bos>", "<sep>", "<eos>", "<unk>")
_WORD = re.compile(r"[a-z0-9]+|[^\sa-z0-9]")


def words(text: str) -> list[str]:
    return _WORD.findall(str(text).lower())


WORDS = tuple(
    sorted({w for texts in VOCAB.values() for t in texts for w in words(t)}
           | {w for q in QUESTIONS.values() for w in words(q)})
)  # fmt: skip
INDEX = {w: i + len(SPECIALS) for i, w in enumerate(WORDS)}
VOCAB_SIZE = len(SPECIALS) + len(WORDS)


def encode(text: str) -> list[int]:
    return [INDEX.get(w, UNK) for w in words(text)]


def decode(ids) -> str:
    table = (*SPECIALS, *WORDS)
    return " ".join(table[int(i)] for i in ids)
