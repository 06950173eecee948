"""Run a model over the benchmark's records: batches, dispatch on how the model answers
(`stubs.Model`), one option index (or None, invalid) per record.

A `score_options` model's answer is the argmax of its scores, ties to the lowest index (a
deterministic rule: np.argmax). A `generate` model sees `records.prompt(record, system=system)`
and its text is read by `parse.parse_answer`; text naming no option is None (scored wrong,
counted as invalid by `scoring.score`).
"""

import dataclasses
import sys
import time
from collections.abc import Sequence

import numpy as np

from core.errors import ConfigError
from methods.fetal_gauge.parse import parse_answer
from methods.fetal_gauge.records import Record, prompt

PROGRESS_EVERY_S = 5.0  # a run shorter than this prints nothing


@dataclasses.dataclass(frozen=True)
class Predictions:
    indices: list  # int option index or None (no option could be read) per record
    raw: list  # the generated text per record (None for score_options models)
    seconds: float  # wall time of the whole run


def _model_name(model) -> str:
    return getattr(model, "name", type(model).__name__)


def _answer_mode(model) -> str:
    if callable(getattr(model, "score_options", None)):
        return "score_options"
    if callable(getattr(model, "generate", None)):
        return "generate"
    raise ConfigError(
        f"fetal_gauge: model {_model_name(model)!r} has neither score_options nor generate"
    )


def _images(batch: Sequence[Record]) -> list[np.ndarray]:
    for record in batch:
        if not isinstance(record.image, np.ndarray):
            raise ConfigError(
                f"fetal_gauge: record {record.qid!r} has no image array (image="
                f"{record.image!r}); load local data with local_data.load_records"
            )
    return [record.image for record in batch]


def _check_count(model, outputs, batch: Sequence[Record]) -> list:
    outputs = list(outputs)
    if len(outputs) != len(batch):
        raise ConfigError(
            f"fetal_gauge: model {_model_name(model)!r} returned {len(outputs)} outputs for a "
            f"batch of {len(batch)} (first qid {batch[0].qid!r})"
        )
    return outputs


def _argmax(model, scores, record: Record) -> int:
    scores_K = np.asarray(scores, dtype=np.float64).ravel()
    if scores_K.shape[0] != len(record.options) or not np.all(np.isfinite(scores_K)):
        raise ConfigError(
            f"fetal_gauge: model {_model_name(model)!r} gave {scores_K.shape[0]} scores "
            f"(finite: {bool(np.all(np.isfinite(scores_K)))}) for qid {record.qid!r} with "
            f"{len(record.options)} options; one finite score per option"
        )
    return int(np.argmax(scores_K))  # first maximum: ties go to the lowest index


def evaluate(
    model,
    records: Sequence[Record],
    *,
    batch_size: int = 64,
    system: str | None = None,
    progress: bool = True,
) -> Predictions:
    """The model's answer to every record, in the records' order."""
    if batch_size < 1:
        raise ConfigError(f"fetal_gauge: batch_size={batch_size}; at least 1")
    mode = _answer_mode(model)
    indices: list = []
    raw: list = []
    start = last_print = time.perf_counter()
    for first in range(0, len(records), batch_size):
        batch = records[first : first + batch_size]
        images = _images(batch)
        if mode == "score_options":
            outputs = model.score_options(
                images, [r.question for r in batch], [tuple(r.options) for r in batch]
            )
            outputs = _check_count(model, outputs, batch)
            indices += [_argmax(model, s, r) for s, r in zip(outputs, batch, strict=True)]
            raw += [None] * len(batch)
        else:
            outputs = model.generate(images, [prompt(r, system=system) for r in batch])
            outputs = _check_count(model, outputs, batch)
            indices += [
                parse_answer(text, r.options) for text, r in zip(outputs, batch, strict=True)
            ]
            raw += outputs
        now = time.perf_counter()
        if progress and now - last_print >= PROGRESS_EVERY_S:
            last_print = now
            done = len(indices)
            print(
                f"fetal_gauge: {_model_name(model)}: {done}/{len(records)} questions, "
                f"{done / (now - start):.1f} questions/s",
                file=sys.stderr,
                flush=True,
            )
    return Predictions(indices=indices, raw=raw, seconds=time.perf_counter() - start)
