"""The answer parser: a model's free text -> the index of the option it names, or None (invalid:
scored wrong and counted apart).

Rules, in order:
1. Markup stripped ("**B**", "`B`"), then the standalone option letters within range: an
   upper-case letter that is not part of a word ("B", "(B)", "B.", "Answer: B", "B)"), or a
   lower-case one inside markup ("(b)", "b)", "b."). A letter inside a word is never one
   ("Breech", "Abdomen"), nor the article "a" ("a plane"). Options run A-H, so the pronoun "I"
   ("I think") is never a letter. One distinct letter: that option. Two different letters:
   ambiguous, go on to the text match.
2. The option texts: the whole answer equals one (canonical_key, or the same normalised label
   through the task vocabularies' synonyms); else exactly one option text contained in it.
3. Otherwise None.
"""

import contextlib
import re
from collections.abc import Sequence

from core.errors import ConfigError
from methods.fetal_gauge import vocab
from methods.fetal_gauge.records import LETTERS

_MARKUP = re.compile(r"[*_`]")
# An upper-case letter standing alone (not inside a word: no letter, digit or apostrophe beside it).
_UPPER = re.compile(r"(?<![A-Za-z0-9'])([A-H])(?![A-Za-z0-9'])")
# A lower-case letter in markup: "(b)", "b)", "b." at the start or after a space / colon.
_LOWER = re.compile(r"(?:^|(?<=[\s:(]))\(?([a-h])(?:\)|\.(?!\w))")
_ARTICLE = re.compile(r"^\s+[a-z]")  # "A plane": the letter followed by a lower-case word


def _letters(text: str, k: int) -> list[int]:
    found = []
    for m in _UPPER.finditer(text):
        letter = m.group(1)
        if letter == "A" and _ARTICLE.match(text[m.end() :]) and not text[: m.start()].strip():
            continue  # "A plane like this ...": the article opening a sentence
        found.append(LETTERS.index(letter))
    found += [LETTERS.index(m.group(1).upper()) for m in _LOWER.finditer(text)]
    return [i for i in dict.fromkeys(found) if i < k]


def _label(text: str) -> set[str]:
    """The canonical labels a text normalises to in any task's vocabulary."""
    out = set()
    for task in vocab.TASKS:
        with contextlib.suppress(ConfigError):  # not a label of that task
            out.add(vocab.normalize_label(task, text))
    return out


def _text_match(text: str, options: Sequence[str]) -> int | None:
    key = vocab.canonical_key(text)
    for i, option in enumerate(options):
        if vocab.canonical_key(option) == key:
            return i
    labels = _label(text)
    hits = [i for i, option in enumerate(options) if labels & ({option} | _label(option))]
    if len(hits) == 1:
        return hits[0]
    contained = [
        i
        for i, option in enumerate(options)
        if re.search(rf"(?<![a-z]){re.escape(vocab.canonical_key(option))}(?![a-z])", key)
    ]
    # "transverse, head left" contains no other option, but "non-standard plane" contains
    # "standard plane": keep the longest of nested matches.
    contained = [
        i
        for i in contained
        if not any(i != j and options[i].lower() in options[j].lower() for j in contained)
    ]
    return contained[0] if len(contained) == 1 else None


def parse_answer(text: str | None, options: Sequence[str]) -> int | None:
    """The option index `text` names, or None (module docstring)."""
    if not text or not str(text).strip():
        return None
    text = _MARKUP.sub("", str(text)).strip()
    letters = _letters(text, len(options))
    if len(letters) == 1:
        return letters[0]
    return _text_match(text, options)
