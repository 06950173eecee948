"""Real data for the harness, from local paths only: a JSON list of records and a folder of images.
The benchmark's source datasets carry different licences, so nothing is downloaded: a user points
the harness at copies they hold.

    [{"qid": "hc18/042/PI", "image": "hc18/042.png", "task": "PI",
      "options": ["trans-thalamic plane", "femur length plane", ...],
      "answer": "trans-thalamic plane",
      "source_dataset": "hc18", "patient_id": "042", "split": "test", "style": "clinical",
      "region": "head", "bbox": [x0, y0, x1, y1]}, ...]

- `answer` (an option text, normalised through vocab) or `answer_idx`; `question` defaults to
  records.QUESTIONS[task]; `style` or `is_phantom`; `bbox` inclusive, in the ORIGINAL image's
  pixels; `bbox_bin` computed with records.box_bin at the original size when missing.
- Images are read with Pillow as RGB uint8, resized to `size` x `size` when given, and the red
  box drawn AFTER resizing, on the scaled box (a thin box drawn first and shrunk vanishes).
  `"box_drawn": true` says the image already shows it (what write_records stores), so it is not
  drawn twice.
"""

import json
import os

import numpy as np

from core.errors import ConfigError
from methods.fetal_gauge import records, vocab

_REMOTE = ("http://", "https://", "gs://", "s3://", "hf://")


def _local(path: str, what: str) -> str:
    if str(path).startswith(_REMOTE):
        raise ConfigError(f"fetal_gauge: {what} {path!r} is remote; the harness reads local paths")
    return str(path)


def _read_image(path: str, qid: str):
    from PIL import Image

    if not os.path.isfile(path):
        raise ConfigError(f"fetal_gauge: record {qid!r}: no image file {path}")
    try:
        with Image.open(path) as im:
            return im.convert("RGB")
    except OSError as e:
        raise ConfigError(f"fetal_gauge: record {qid!r}: cannot read image {path}: {e}") from None


def _record(raw: dict, image_root: str, size: int | None, draw_boxes: bool) -> records.Record:
    qid = str(raw.get("qid", "?"))

    def bad(field, why):
        return ConfigError(f"fetal_gauge: record {qid!r}: {field}={raw.get(field)!r}: {why}")

    for field in ("qid", "image", "task", "options"):
        if field not in raw:
            raise ConfigError(f"fetal_gauge: record {qid!r} has no {field!r}")
    task = raw["task"]
    if task not in vocab.TASKS:
        raise bad("task", f"one of {vocab.TASKS}")
    options = raw["options"]
    if not isinstance(options, list) or not 2 <= len(options) <= len(records.LETTERS):
        raise bad("options", f"a list of 2 to {len(records.LETTERS)} option texts")
    options = tuple(str(o) for o in options)
    if "answer_idx" in raw:
        idx = raw["answer_idx"]
        if not isinstance(idx, int) or not 0 <= idx < len(options):
            raise bad("answer_idx", f"an index into the {len(options)} options")
    elif "answer" in raw:
        keys = [vocab.canonical_key(o) for o in options]
        answer = str(raw["answer"])
        if vocab.canonical_key(answer) not in keys:
            try:
                answer = vocab.normalize_label(task, answer)
            except ConfigError:
                raise bad("answer", "not among the options nor a label of the task") from None
            if vocab.canonical_key(answer) not in keys:
                raise bad("answer", "not among the options")
        idx = keys.index(vocab.canonical_key(answer))
    else:
        raise ConfigError(f"fetal_gauge: record {qid!r} has neither 'answer' nor 'answer_idx'")
    split = raw.get("split", "test")
    if split not in records.SPLITS:
        raise bad("split", f"one of {records.SPLITS}")
    style = raw.get("style", "phantom" if raw.get("is_phantom") else "clinical")
    if style not in records.STYLES:
        raise bad("style", f"one of {records.STYLES}")

    path = os.path.join(image_root, _local(raw["image"], f"record {qid!r} image"))
    image = _read_image(path, qid)
    width, height = image.size
    bbox, bbox_bin = raw.get("bbox"), raw.get("bbox_bin")
    if bbox is not None:
        if len(bbox) != 4 or not (
            0 <= bbox[0] <= bbox[2] < width and 0 <= bbox[1] <= bbox[3] < height
        ):
            raise bad("bbox", f"[x0, y0, x1, y1] inside the {width} x {height} image")
        bbox_bin = bbox_bin or records.box_bin(bbox, height, width)
        if bbox_bin not in records.BOX_BINS:
            raise bad("bbox_bin", f"one of {records.BOX_BINS}")
    if size:
        image = image.resize((size, size), resample=3)  # bicubic
        if bbox is not None:
            sx, sy = size / width, size / height
            x0, y0, x1, y1 = bbox
            bbox = (
                int(x0 * sx),
                int(y0 * sy),
                min(int(x1 * sx), size - 1),
                min(int(y1 * sy), size - 1),
            )
    pixels = np.asarray(image, np.uint8)
    if bbox is not None and draw_boxes and not raw.get("box_drawn", False):
        pixels = records.draw_red_box(pixels, bbox)
    return records.Record(
        qid=qid,
        image=pixels,
        task=task,
        question=str(raw.get("question") or records.QUESTIONS[task]),
        options=options,
        answer_idx=int(idx),
        source_dataset=str(raw.get("source_dataset", "")),
        patient_id=str(raw.get("patient_id", "")),
        split=split,
        style=style,
        region=str(raw.get("region", "")),
        bbox=None if bbox is None else tuple(int(v) for v in bbox),
        bbox_bin=bbox_bin,
    )


def load_records(
    records_json: str, image_root: str, *, size: int | None = None, draw_boxes: bool = True
) -> list[records.Record]:
    """Records with their images loaded (module docstring); every bad input one line."""
    _local(records_json, "records file")
    _local(image_root, "image root")
    if not os.path.isfile(records_json):
        raise ConfigError(f"fetal_gauge: no records file {records_json}")
    if not os.path.isdir(image_root):
        raise ConfigError(f"fetal_gauge: no image folder {image_root}")
    try:
        with open(records_json) as f:
            raw = json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(f"fetal_gauge: {records_json} is not JSON: {e}") from None
    if not isinstance(raw, list) or not all(isinstance(r, dict) for r in raw):
        raise ConfigError(f"fetal_gauge: {records_json} must hold a JSON list of record objects")
    out = [_record(r, image_root, size, draw_boxes) for r in raw]
    qids = [r.qid for r in out]
    if len(set(qids)) != len(qids):
        dup = next(q for q in qids if qids.count(q) > 1)
        raise ConfigError(f"fetal_gauge: {records_json}: qid {dup!r} appears twice")
    records.check_no_leak(out)
    return out


def write_records(recs, records_json: str, image_root: str) -> None:
    """Each record's image as a PNG under image_root and the JSON list load_records reads back
    (a VG box is already in the image: "box_drawn" is set)."""
    from PIL import Image

    os.makedirs(image_root, exist_ok=True)
    out = []
    for i, r in enumerate(recs):
        name = f"{i:06d}.png"
        Image.fromarray(np.asarray(r.image, np.uint8)).save(os.path.join(image_root, name))
        item = {
            "qid": r.qid,
            "image": name,
            "task": r.task,
            "question": r.question,
            "options": list(r.options),
            "answer_idx": r.answer_idx,
            "source_dataset": r.source_dataset,
            "patient_id": r.patient_id,
            "split": r.split,
            "style": r.style,
            "region": r.region,
        }
        if r.bbox is not None:
            item |= {"bbox": list(r.bbox), "bbox_bin": r.bbox_bin, "box_drawn": True}
        out.append(item)
    os.makedirs(os.path.dirname(os.path.abspath(records_json)), exist_ok=True)
    with open(records_json, "w") as f:
        json.dump(out, f, indent=1)
