"""The answer vocabularies of the five Fetal-Gauge tasks and the label normalisation.

The benchmark (paper 16) normalises every source dataset's labels to one vocabulary per task:
abbreviations expanded ("abdomcirc" -> "abdominal circumference plane"), synonyms merged, so that
one option text means one answer. Distractors are drawn from the same task's vocabulary, and a
distractor that normalises to the answer would make two options correct: `records.make_mcq`
refuses one.

The canonical texts below are those the generated phantoms use (`phantoms.py`); real data adds
its own entries through `SYNONYMS`-style tables passed to `normalize_label(..., synonyms=)`.

Tasks (the paper's):
- PI, plane identification: which standard plane is shown;
- VC, view conformity: is the plane diagnostically standard (complete, centred, right zoom);
- FO, fetal orientation: presentation (where the head lies);
- CD, clinical diagnosis: normal / benign / malignant;
- VG, visual grounding: which structure lies inside the red box.
"""

import re

from core.errors import ConfigError

TASKS = ("PI", "VC", "FO", "CD", "VG")

VOCAB = {
    "PI": (
        "trans-thalamic plane",
        "abdominal circumference plane",
        "femur length plane",
        "four-chamber heart plane",
    ),
    "VC": ("standard plane", "non-standard plane"),
    "FO": ("cephalic", "breech", "transverse, head left", "transverse, head right"),
    "CD": ("normal", "benign", "malignant"),
    "VG": (
        "skull",
        "thalami",
        "midline falx",
        "abdomen",
        "stomach bubble",
        "spine",
        "femur",
        "thorax",
        "heart",
    ),
}

# raw label (lower case, after `_key`) -> canonical text; every canonical text maps to itself.
SYNONYMS = {
    "PI": {
        "tt": "trans-thalamic plane",
        "transthalamic": "trans-thalamic plane",
        "trans thalamic": "trans-thalamic plane",
        "fetal brain": "trans-thalamic plane",
        "ac": "abdominal circumference plane",
        "abdomcirc": "abdominal circumference plane",
        "fetal abdomen": "abdominal circumference plane",
        "fl": "femur length plane",
        "fetal femur": "femur length plane",
        "4ch": "four-chamber heart plane",
        "four chamber": "four-chamber heart plane",
        "fetal thorax": "four-chamber heart plane",
    },
    "VC": {
        "standard": "standard plane",
        "conforming": "standard plane",
        "non standard": "non-standard plane",
        "nonstandard": "non-standard plane",
        "non-standard": "non-standard plane",
    },
    "FO": {
        "vertex": "cephalic",
        "head down": "cephalic",
        "head up": "breech",
        "transverse left": "transverse, head left",
        "transverse right": "transverse, head right",
    },
    "CD": {"healthy": "normal", "no lesion": "normal", "cancer": "malignant"},
    "VG": {"falx": "midline falx", "stomach": "stomach bubble", "fetal heart": "heart"},
}


def _key(text: str) -> str:
    """Lower case, spaces collapsed, outer punctuation stripped: what two spellings share."""
    return re.sub(r"\s+", " ", str(text).strip().lower()).strip(" .:;()[]")


def check_task(task: str) -> str:
    if task not in TASKS:
        raise ConfigError(f"fetal_gauge: task={task!r}; one of {', '.join(TASKS)}")
    return task


def normalize_label(task: str, raw: str, *, synonyms: dict | None = None) -> str:
    """The canonical option text of `raw` in `task`'s vocabulary; one line naming the label
    when it has none. `synonyms` (raw -> canonical) extends `SYNONYMS[task]` for a new source."""
    check_task(task)
    table = {_key(c): c for c in VOCAB[task]}
    table |= {_key(k): v for k, v in SYNONYMS[task].items()}
    table |= {_key(k): v for k, v in (synonyms or {}).items()}
    key = _key(raw)
    if key not in table:
        raise ConfigError(
            f"fetal_gauge: label {raw!r} of task {task} is not in its vocabulary or synonyms"
        )
    return table[key]


def canonical_key(text: str) -> str:
    """The comparison key of an option text (for "no distractor normalises to the answer" and
    the answer parser's text match)."""
    return _key(text)
