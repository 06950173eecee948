"""The phantom benchmark: generated patients, patient-level splits, one record per question.

Each patient has `scans_per_patient` scans cycling through phantoms.KINDS; each scan gives
PI (head/abdomen/femur/thorax), VC (head/abdomen/thorax), FO (fetus), CD (lesion) and one VG
question per visible structure (its box drawn in red on the RGB copy after resizing, with
bbox and records.box_bin set). A split that lists two styles renders every scan in both from
the same generator state, so the phantom-vs-clinical gap (paper 16: phantom-style images score
lower) is measured on paired scans with identical labels, and VG's bins let the box-size
effect (large > medium > small) be measured.
"""

import numpy as np

from core.errors import ConfigError
from methods.fetal_gauge import phantoms, records

DEFAULT_STYLES = {
    "train": ("clinical",),
    "validation": ("clinical", "phantom"),
    "test": ("clinical", "phantom"),
}
SOURCE = "phantoms"


def patient_id(index: int) -> str:
    return f"p{index:05d}"


def phantom_benchmark(
    num_patients: int,
    seed: int,
    *,
    styles_by_split: dict | None = None,
    fractions: dict | None = None,
    size: int = phantoms.SIZE,
    scans_per_patient: int = 6,
) -> list[records.Record]:
    """Records of `num_patients` generated patients; scan j of patient i is drawn from
    np.random.default_rng([seed, i, j]) (once per style of the patient's split)."""
    if not isinstance(num_patients, int) or num_patients < 1:
        raise ConfigError(f"fetal_gauge phantom_set: num_patients={num_patients!r}; an int >= 1")
    if not isinstance(scans_per_patient, int) or scans_per_patient < 1:
        raise ConfigError(
            f"fetal_gauge phantom_set: scans_per_patient={scans_per_patient!r}; an int >= 1"
        )
    styles_by_split = DEFAULT_STYLES if styles_by_split is None else styles_by_split
    for split, styles in styles_by_split.items():
        if split not in records.SPLITS or not styles or set(styles) - set(records.STYLES):
            raise ConfigError(
                f"fetal_gauge phantom_set: styles_by_split[{split!r}]={styles!r}; splits in "
                f"{records.SPLITS}, each a non-empty tuple of {records.STYLES}"
            )
    ids = [patient_id(i) for i in range(num_patients)]
    split_kwargs = {} if fractions is None else {"fractions": fractions}
    split_of = records.patient_split(ids, seed=seed, **split_kwargs)
    out = []
    for index, pid in enumerate(ids):
        split = split_of[pid]
        for scan_index in range(scans_per_patient):
            kind = phantoms.KINDS[scan_index % len(phantoms.KINDS)]
            for style in styles_by_split.get(split, ("clinical",)):
                rng = np.random.default_rng([seed, index, scan_index])
                scan = phantoms.scan(kind, style, rng, size=size)
                out += _scan_records(scan, f"{pid}/{scan_index}/{style}", seed, split, pid, size)
    return out


def _scan_records(scan, prefix, seed, split, pid, size) -> list[records.Record]:
    rgb = np.repeat(scan.image[:, :, None], 3, axis=2)
    common = dict(seed=seed, split=split, patient_id=pid, style=scan.style, region=scan.kind)
    out = [
        records.build(f"{prefix}/{task}", rgb, task, answer, source_dataset=SOURCE, **common)
        for task, answer in sorted(scan.labels.items())
    ]
    for name, bbox in scan.structures.items():
        out.append(
            records.build(
                f"{prefix}/VG/{name}",
                records.draw_red_box(rgb, bbox),
                "VG",
                name,
                source_dataset=SOURCE,
                bbox=bbox,
                bbox_bin=records.box_bin(bbox, size, size),
                **common,
            )
        )
    return out
