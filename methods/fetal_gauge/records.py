"""The benchmark's record: one multiple-choice question about one image (schema of paper 16's
harness; the builders that fill it are below the class)."""

import dataclasses
from typing import Any

import numpy as np

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
