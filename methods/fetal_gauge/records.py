"""The benchmark's record: one multiple-choice question about one image (schema of paper 16's
harness; the builders that fill it are below the class)."""

import dataclasses
import hashlib
from typing import Any

import numpy as np

from core.errors import ConfigError
from methods.fetal_gauge import vocab

BOX_BINS = ("small", "medium", "large")
STYLES = ("clinical", "phantom")
SPLITS = ("train", "validation", "test")
LETTERS = "ABCDEFGH"


@dataclasses.dataclass(frozen=True)
class Record:
    qid: str  # unique over the benchmark
    image: Any  # uint8 [H, W, 3] array, or a path relative to the image root (local data)
    task: str  # one of vocab.TASKS
    question: str
    options: tuple[str, ...]  # option texts in the order shown (after shuffling)
    answer_idx: int  # index into options of the correct one
    source_dataset: str = "phantoms"
    patient_id: str = ""
    split: str = "test"  # one of SPLITS
    style: str = "clinical"  # rendering style (phantoms) or "clinical" / "phantom" for real data
    region: str = ""  # head, abdomen, femur, thorax, fetus, lesion, ...
    bbox: tuple[int, int, int, int] | None = None  # VG: (x0, y0, x1, y1) in the image's pixels
    bbox_bin: str | None = None  # VG: one of BOX_BINS

    @property
    def answer(self) -> str:
        return self.options[self.answer_idx]

    @property
    def answer_letter(self) -> str:
        return LETTERS[self.answer_idx]

    @property
    def is_phantom(self) -> bool:
        return self.style == "phantom"

    def with_image(self, image: np.ndarray) -> "Record":
        return dataclasses.replace(self, image=image)


# ---- builders (pure functions, seeded) ----------------------------------------------------

QUESTIONS = {
    "PI": "Which standard plane is shown in this fetal ultrasound image?",
    "VC": "Is this plane diagnostically standard?",
    "FO": "What is the fetal presentation?",
    "CD": "What is the diagnosis of the lesion?",
    "VG": "Which structure is inside the red box?",
}
INSTRUCTION = "Answer with the option letter only."

# VG box-size bins by the box's share of the image area (the paper does not give its thresholds):
# below SMALL_MAX small, below MEDIUM_MAX medium, else large. At 64 x 64 px, 0.02 is ~9 x 9 px.
SMALL_MAX = 0.02
MEDIUM_MAX = 0.08


def qid_rng(seed: int, qid: str, stream: int = 0) -> np.random.Generator:
    """A generator for one question, stable across processes (sha256, not the salted hash()).
    `stream` separates uses: building the options (0) and reshuffling them (1). With one stream
    for both, a reshuffle with the build's seed replayed the build's draws: on 2-option
    questions always-A then scored 100 % (the quick experiment's always-A claim caught it)."""
    digest = hashlib.sha256(str(qid).encode()).digest()
    return np.random.default_rng([int(seed), int.from_bytes(digest[:8], "little"), int(stream)])


def _same_answer(task: str, a: str, b: str) -> bool:
    """Whether two option texts mean one answer: the same key, or the same canonical label."""
    if vocab.canonical_key(a) == vocab.canonical_key(b):
        return True
    try:
        return vocab.normalize_label(task, a) == vocab.normalize_label(task, b)
    except ConfigError:
        return False


def make_mcq(task, answer, rng, *, vocab_texts=None, k=4) -> tuple[tuple[str, ...], int]:
    """(options, answer_idx): the answer and min(k, |vocab|) - 1 distractors drawn without
    replacement from the task's vocabulary (a source's own list when given), never one that
    normalises to the answer, shuffled by `rng`."""
    vocab.check_task(task)
    texts = tuple(vocab_texts) if vocab_texts is not None else vocab.VOCAB[task]
    if vocab_texts is None:
        answer = vocab.normalize_label(task, answer)
    if not any(_same_answer(task, answer, t) for t in texts):
        raise ConfigError(f"fetal_gauge: answer {answer!r} is not in task {task}'s vocabulary")
    pool = [t for t in dict.fromkeys(texts) if not _same_answer(task, answer, t)]
    k = min(int(k), len(pool) + 1)
    if k < 2:
        raise ConfigError(f"fetal_gauge: task {task} leaves fewer than 2 options for {answer!r}")
    picks = rng.choice(len(pool), size=k - 1, replace=False)
    options = [answer, *(pool[i] for i in picks)]
    order = rng.permutation(k)
    shuffled = tuple(options[i] for i in order)
    return shuffled, int(np.flatnonzero(order == 0)[0])


def build(
    qid,
    image,
    task,
    answer,
    *,
    seed,
    split,
    patient_id,
    style="clinical",
    region="",
    source_dataset="phantoms",
    bbox=None,
    bbox_bin=None,
    vocab_texts=None,
    k=4,
) -> Record:
    """One question: QUESTIONS[task], options from make_mcq with the question's own rng."""
    options, idx = make_mcq(task, answer, qid_rng(seed, qid), vocab_texts=vocab_texts, k=k)
    if split not in SPLITS or style not in STYLES:
        raise ConfigError(
            f"fetal_gauge: {qid}: split={split!r} / style={style!r}; {SPLITS} / {STYLES}"
        )
    return Record(qid, image, task, QUESTIONS[task], options, idx, source_dataset, str(patient_id),
                  split, style, region, None if bbox is None else tuple(int(v) for v in bbox),
                  bbox_bin)  # fmt: skip


def shuffle_options(record: Record, seed: int) -> Record:
    """The same options in a new order drawn from qid_rng(seed, qid, stream=1); the answer
    follows."""
    order = qid_rng(seed, record.qid, stream=1).permutation(len(record.options))
    options = tuple(record.options[i] for i in order)
    return dataclasses.replace(
        record, options=options, answer_idx=int(np.flatnonzero(order == record.answer_idx)[0])
    )


def patient_split(patient_ids, *, fractions=None, seed=0) -> dict[str, str]:
    """{patient: split}: whole patients to train / validation / test in the given fractions
    (rounded; the remainder to the last split), shuffled by `seed`."""
    fractions = fractions or {"train": 0.6, "validation": 0.2, "test": 0.2}
    if set(fractions) - set(SPLITS) or any(f < 0 for f in fractions.values()):
        raise ConfigError(f"fetal_gauge: fractions={fractions}; non-negative, splits of {SPLITS}")
    if abs(sum(fractions.values()) - 1) > 1e-9:
        raise ConfigError(f"fetal_gauge: fractions={fractions} must sum to 1")
    ids = sorted(dict.fromkeys(str(p) for p in patient_ids))
    order = np.random.default_rng([int(seed), 7]).permutation(len(ids))
    names = list(fractions)
    ends = np.round(np.cumsum([fractions[n] for n in names]) * len(ids)).astype(int)
    ends[-1] = len(ids)
    out, start = {}, 0
    for name, end in zip(names, ends, strict=True):
        out |= {ids[i]: name for i in order[start:end]}
        start = end
    return out


def check_no_leak(records) -> None:
    """One line naming a patient whose questions sit in two splits."""
    seen: dict[tuple[str, str], str] = {}
    for r in records:
        key = (r.source_dataset, r.patient_id)
        if seen.setdefault(key, r.split) != r.split:
            raise ConfigError(
                f"fetal_gauge: patient {r.patient_id!r} of {r.source_dataset} is in both "
                f"{seen[key]} and {r.split} (qid {r.qid})"
            )


def prompt(record: Record, *, system: str | None = None) -> str:
    """Question, lettered options, the instruction (the optional system line first)."""
    lines = [system] if system else []
    lines.append(record.question)
    lines += [f"{LETTERS[i]}. {text}" for i, text in enumerate(record.options)]
    lines.append(INSTRUCTION)
    return "\n".join(lines)


def box_bin(bbox, height: int, width: int) -> str:
    """The VG size bin of an inclusive (x0, y0, x1, y1) box by its share of the image area."""
    x0, y0, x1, y1 = bbox
    share = (x1 - x0 + 1) * (y1 - y0 + 1) / float(height * width)
    return "small" if share < SMALL_MAX else "medium" if share < MEDIUM_MAX else "large"


def draw_red_box(image: np.ndarray, bbox, thickness: int | None = None) -> np.ndarray:
    """An RGB copy with the inclusive box (x0, y0, x1, y1) outlined in (255, 0, 0), thickness
    max(1, round(0.005 max(H, W))) pixels inward from the box's edge, clipped to the image.
    Draw it on the image at the size the model reads: a 1-pixel box shrunk later vanishes."""
    image = np.asarray(image)
    if image.ndim == 3 and image.shape[-1] == 1:
        image = image[..., 0]
    rgb = np.repeat(image[..., None], 3, axis=-1) if image.ndim == 2 else image[..., :3]
    rgb = np.array(rgb, dtype=np.uint8, copy=True)
    H, W = rgb.shape[:2]
    t = thickness or max(1, round(0.005 * max(H, W)))
    x0, y0, x1, y1 = (int(v) for v in bbox)
    if not (x0 <= x1 and y0 <= y1):
        raise ConfigError(f"fetal_gauge: bbox {tuple(bbox)} needs x0 <= x1 and y0 <= y1")
    x0, x1 = max(x0, 0), min(x1, W - 1)
    y0, y1 = max(y0, 0), min(y1, H - 1)
    red = np.array([255, 0, 0], np.uint8)
    rgb[y0 : min(y0 + t, y1 + 1), x0 : x1 + 1] = red
    rgb[max(y1 - t + 1, y0) : y1 + 1, x0 : x1 + 1] = red
    rgb[y0 : y1 + 1, x0 : min(x0 + t, x1 + 1)] = red
    rgb[y0 : y1 + 1, max(x1 - t + 1, x0) : x1 + 1] = red
    return rgb
