"""Fetal-Gauge phantoms: determinism, labels that agree with the drawn geometry, paired styles,
and the benchmark's splits, red boxes and box-size bins."""

import collections

import numpy as np
import pytest
from scipy import ndimage

from core.errors import ConfigError
from methods.fetal_gauge import phantom_set, phantoms, records
from methods.fetal_gauge.vocab import VOCAB

MAIN_ELLIPSE = {"head": "skull", "abdomen": "abdomen", "thorax": "thorax"}
PLANE_KINDS = tuple(MAIN_ELLIPSE)


def _draw(kind, seed, style="clinical"):
    return phantoms.render(kind, style, np.random.default_rng([seed, 7]))


def test_same_seed_same_bytes_and_different_seed_differs():
    for kind in phantoms.KINDS:
        first, _ = _draw(kind, 3)
        again, _ = _draw(kind, 3)
        other, _ = _draw(kind, 4)
        assert first.image.tobytes() == again.image.tobytes(), kind
        assert first.labels == again.labels and first.structures == again.structures, kind
        assert first.image.tobytes() != other.image.tobytes(), kind
        assert first.image.dtype == np.uint8 and first.image.shape == (phantoms.SIZE,) * 2


def test_boxes_enclose_the_visible_structure_masks_by_one_pixel():
    for seed in range(20):
        for kind in phantoms.KINDS:
            scan, masks = _draw(kind, seed)
            assert set(scan.structures) == set(masks), kind
            for name, (x0, y0, x1, y1) in scan.structures.items():
                assert name in VOCAB["VG"]
                ys, xs = np.nonzero(masks[name])
                # one pixel outside the mask on all four sides (clipped at the image's edge):
                # covers every mask pixel and the outline paints none of them
                last = phantoms.SIZE - 1
                tight = (xs.min() - 1, ys.min() - 1, xs.max() + 1, ys.max() + 1)
                expected = tuple(int(np.clip(v, 0, last)) for v in tight)
                assert expected == (x0, y0, x1, y1), (kind, name)
                assert masks[name].shape == scan.image.shape


def test_structures_are_drawn_where_their_masks_are():
    """Each structure differs from its 2-pixel surround the way it should: bright ones brighter,
    dark ones darker (phantom style, weak speckle, so single scans decide)."""
    bright, dark = ("skull", "spine", "femur"), ("stomach bubble", "heart", "thalami")
    fan = phantoms.fan_mask()
    for seed in range(10):
        for kind in phantoms.KINDS:
            scan, masks = _draw(kind, seed, "phantom")
            for name, mask in masks.items():
                # designed contrasts are >= 40 grey levels; mask pixels at 25 % coverage mix
                # in their surround, so a structure must still differ by 12
                surround = ndimage.binary_dilation(mask, iterations=2) & ~mask & fan
                inside, outside = scan.image[mask].mean(), scan.image[surround].mean()
                if name in bright:
                    assert inside > outside + 12, (kind, name, inside, outside)
                if name in dark:
                    assert inside < outside - 12, (kind, name, inside, outside)


def _ellipse_extent(geometry):
    (a, b), t = geometry["axes"], geometry["angle"]
    return (
        2 * np.sqrt((a * np.cos(t)) ** 2 + (b * np.sin(t)) ** 2),
        2 * np.sqrt((a * np.sin(t)) ** 2 + (b * np.cos(t)) ** 2),
    )


def test_view_conformity_label_matches_the_geometry():
    size, faults = phantoms.SIZE, collections.Counter()
    centre = np.array(phantoms.CENTRE) * size
    for seed in range(120):
        kind = PLANE_KINDS[seed % 3]
        scan, _ = _draw(kind, seed)
        geometry = scan.geometry
        x0, y0, x1, y1 = scan.structures[MAIN_ELLIPSE[kind]]
        width, height = _ellipse_extent(geometry)
        # the visible box, measured from the image's mask, against the whole ellipse's extent
        complete = min(x1 - x0 + 1 - width, y1 - y0 + 1 - height) >= 0
        off = np.hypot((x0 + x1) / 2 - centre[0], (y0 + y1) / 2 - centre[1])
        major = geometry["axes"][0] / size
        right_zoom = phantoms.STANDARD_AXIS[0] <= major <= phantoms.STANDARD_AXIS[1]
        centred = off < 3.0  # centre jitter 0.02 * 64 = 1.3 px plus rasterisation
        breaks = {"cut": not complete, "off-centre": not centred, "zoom": not right_zoom}
        if scan.labels["VC"] == "standard plane":
            assert not any(breaks.values()), (seed, breaks)
        else:
            fault = geometry["fault"]
            assert breaks[fault], (seed, fault, breaks)
            faults[fault] += 1
            if fault == "off-centre":  # still complete: one rule broken at a time
                assert complete and right_zoom, seed
    assert set(faults) == set(phantoms.FAULTS)


def test_fetal_head_lies_on_the_side_the_label_names():
    seen = set()
    for seed in range(40):
        scan, masks = _draw("fetus", seed)
        label = scan.labels["FO"]
        ys, xs = np.nonzero(masks["skull"])
        body_x, body_y = scan.geometry["body_centre"]
        dx, dy = xs.mean() - body_x, ys.mean() - body_y  # measured from the skull's mask
        side = (
            ("transverse, head right" if dx > 0 else "transverse, head left")
            if abs(dx) > abs(dy)
            else ("cephalic" if dy > 0 else "breech")
        )
        assert side == label, (seed, label, dx, dy)
        seen.add(label)
    assert seen == set(VOCAB["FO"])


def test_labels_are_balanced_per_kind():
    for kind, task in (("head", "VC"), ("fetus", "FO"), ("lesion", "CD")):
        counts = collections.Counter(
            phantoms.scan(kind, "clinical", np.random.default_rng([1, i])).labels[task]
            for i in range(300)
        )
        assert set(counts) == set(VOCAB[task]), kind
        expected = 300 / len(VOCAB[task])
        # 4 binomial standard deviations at most: a fixed or skewed draw fails
        tolerance = 4 * np.sqrt(expected)
        assert all(abs(n - expected) < tolerance for n in counts.values()), (kind, counts)


def test_styles_share_anatomy_and_differ_in_look():
    for kind in phantoms.KINDS:
        clinical, _ = _draw(kind, 5, "clinical")
        phantom, _ = _draw(kind, 5, "phantom")
        assert clinical.labels == phantom.labels and clinical.structures == phantom.structures
        # speckle: the phantom style is smoother inside the fan
        fan = phantoms.fan_mask()
        rough = [
            np.abs(np.diff(s.image.astype(float), axis=1))[fan[:, 1:]].mean()
            for s in (clinical, phantom)
        ]
        assert rough[0] > 1.5 * rough[1], (kind, rough)
        # background: black outside the fan in clinical, grey in phantom
        outside = ~ndimage.binary_dilation(fan)  # away from the fan's mixed edge pixels
        assert clinical.image[outside].max() < 10 < phantom.image[outside].min()


def test_bad_kind_and_style_are_one_line_errors():
    for kwargs, field in (({"kind": "hand"}, "kind"), ({"style": "sketch"}, "style")):
        args = {"kind": "head", "style": "clinical"} | kwargs
        with pytest.raises(ConfigError, match=field):
            phantoms.scan(args["kind"], args["style"], np.random.default_rng(0))


@pytest.fixture(scope="module")
def benchmark():
    return phantom_set.phantom_benchmark(30, seed=2)


def test_no_patient_in_two_splits_and_unique_qids(benchmark):
    records.check_no_leak(benchmark)
    split_of = {}
    for record in benchmark:
        assert split_of.setdefault(record.patient_id, record.split) == record.split
    assert len({r.qid for r in benchmark}) == len(benchmark)
    assert set(split_of.values()) == set(records.SPLITS)


def test_two_style_splits_hold_every_scan_in_both_styles(benchmark):
    by_question = collections.defaultdict(dict)
    for record in benchmark:
        pid, scan_index, style, *question = record.qid.split("/")
        by_question[(record.split, pid, scan_index, *question)][style] = record.answer
    for (split, *_), answers in by_question.items():
        styles = phantom_set.DEFAULT_STYLES[split]
        assert set(answers) == set(styles), (split, answers)
        assert len(set(answers.values())) == 1  # same label in both styles


def test_red_box_outline_is_drawn_after_resizing(benchmark):
    vg = [r for r in benchmark if r.task == "VG"]
    assert vg
    for record in vg:
        image, (x0, y0, x1, y1) = record.image, record.bbox
        assert image.shape == (phantoms.SIZE, phantoms.SIZE, 3)
        red = (image[..., 0] == 255) & (image[..., 1] == 0) & (image[..., 2] == 0)
        # thickness max(1, round(0.005 * 64)) = 1 px: every corner red, nothing inside
        assert red[y0, x0] and red[y0, x1] and red[y1, x0] and red[y1, x1], record.qid
        assert not red[y0 + 1 : y1, x0 + 1 : x1].any(), record.qid
        grey = image[..., 0] == image[..., 1]
        assert (grey | red).all()  # the scan itself is grey: only the box is coloured
        assert record.bbox_bin == records.box_bin(record.bbox, phantoms.SIZE, phantoms.SIZE)


def test_small_boxes_survive_and_all_three_bins_occur(benchmark):
    bins = collections.Counter(r.bbox_bin for r in benchmark if r.task == "VG")
    assert set(bins) == set(records.BOX_BINS), bins
    assert min(bins.values()) >= 0.1 * sum(bins.values()), bins
    tasks = collections.Counter(r.task for r in benchmark)
    assert set(tasks) == {"PI", "VC", "FO", "CD", "VG"}
