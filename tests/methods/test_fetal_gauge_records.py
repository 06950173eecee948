"""Fetal-Gauge records, answer parser and local data (paper 16's harness): properties that hold
for correct code and fail for plausible bugs (MCQ distractors, shuffling, stable per-qid rngs,
patient-level splits, prompt format, red boxes, parser table, local JSON round trip and errors)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from core.errors import ConfigError
from methods.fetal_gauge import local_data, parse, records, vocab

PI_SOURCE = (
    "AC",
    "abdominal circumference plane",
    "femur length plane",
    "trans-thalamic plane",
    "four-chamber heart plane",
)


def _one_line_error(fn, *needles):
    with pytest.raises(ConfigError) as err:
        fn()
    message = str(err.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)
    return message


# ---- make_mcq / build -------------------------------------------------------------------------


def test_make_mcq_never_offers_a_synonym_of_the_answer():
    answer = "abdominal circumference plane"
    for i in range(200):
        options, idx = records.make_mcq(
            "PI", answer, np.random.default_rng(i), vocab_texts=PI_SOURCE, k=4
        )
        assert options[idx] == answer
        assert "AC" not in options
        assert len(options) == len(set(options)) == 4


def test_make_mcq_caps_k_at_the_vocabulary():
    for task in vocab.TASKS:
        for answer in vocab.VOCAB[task]:
            options, idx = records.make_mcq(task, answer, np.random.default_rng(0), k=8)
            assert len(options) == min(8, len(vocab.VOCAB[task]))
            assert len(set(options)) == len(options) and set(options) <= set(vocab.VOCAB[task])
            assert options[idx] == answer
    options, _ = records.make_mcq("VC", "standard plane", np.random.default_rng(1), k=4)
    assert sorted(options) == sorted(vocab.VOCAB["VC"])


def test_make_mcq_answer_outside_vocabulary_is_one_line():
    _one_line_error(lambda: records.make_mcq("CD", "cyst", np.random.default_rng(0)), "cyst", "CD")
    _one_line_error(
        lambda: records.make_mcq(
            "PI", "kidney plane", np.random.default_rng(0), vocab_texts=PI_SOURCE
        ),
        "kidney plane",
    )


# ---- shuffling --------------------------------------------------------------------------------


def _pi_records(n, seed):
    answers = vocab.VOCAB["PI"]
    return [
        records.build(f"q{i}", None, "PI", answers[i % 4], seed=seed, split="test", patient_id=i)
        for i in range(n)
    ]


def test_answer_position_is_uniform():
    recs = _pi_records(4000, seed=3)
    at_a = np.mean([r.answer_idx == 0 for r in recs])
    # Binomial(4000, 1/4): sd = sqrt(.25 * .75 / 4000) ~ 0.0068, so 0.03 is ~4.4 sd: a correct
    # shuffle falls outside with probability ~1e-5; an unshuffled build (answer first) gives 1.
    assert abs(at_a - 0.25) < 0.03


def test_shuffle_options_keeps_option_set_and_answer():
    moved = 0
    for r in _pi_records(200, seed=5):
        s = records.shuffle_options(r, seed=9)
        assert sorted(s.options) == sorted(r.options)
        assert s.answer == r.answer
        moved += s.options != r.options
    assert moved > 100  # a reshuffle that never moves anything is no reshuffle


def test_reshuffle_with_the_build_seed_is_not_always_a():
    # The regression fixed by separate rng streams: one stream for build and reshuffle replayed
    # the build's draws, and always-A scored 100 % on 2-option VC questions.
    seed, n = 11, 2000
    recs = [
        records.build(
            f"vc{i}", None, "VC", vocab.VOCAB["VC"][i % 2], seed=seed, split="test", patient_id=i
        )
        for i in range(n)
    ]
    reshuffled = [records.shuffle_options(r, seed=seed) for r in recs]
    always_a = np.mean([r.answer_idx == 0 for r in reshuffled])
    # Binomial(2000, 1/2): sd ~ 0.011, the band 0.05 is ~4.5 sd.
    assert abs(always_a - 0.5) < 0.05


# ---- qid_rng ----------------------------------------------------------------------------------


def test_qid_rng_is_stable_across_processes_and_separates_qids_and_streams():
    here = [records.qid_rng(7, q, stream=s).integers(0, 2**31, 4).tolist()
            for q in ("a/1/PI", "b/2/VG") for s in (0, 1)]  # fmt: skip
    code = (
        "from methods.fetal_gauge import records;"
        "print([records.qid_rng(7, q, stream=s).integers(0, 2**31, 4).tolist()"
        " for q in ('a/1/PI', 'b/2/VG') for s in (0, 1)])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == str(here)
    assert len({tuple(v) for v in here}) == 4  # qids and streams all differ
    other_seed = records.qid_rng(8, "a/1/PI").integers(0, 2**31, 4).tolist()
    assert other_seed != here[0]


# ---- patient-level splits ---------------------------------------------------------------------


def test_patient_split_partitions_patients_in_the_fractions():
    ids = [f"p{i}" for i in range(50)]
    split = records.patient_split(ids, seed=1)
    assert set(split) == set(ids)
    counts = {s: sum(v == s for v in split.values()) for s in records.SPLITS}
    assert counts == {"train": 30, "validation": 10, "test": 10}
    fr = {"train": 0.5, "validation": 0.25, "test": 0.25}
    counts = {s: list(records.patient_split(ids, fractions=fr).values()).count(s) for s in fr}
    # 12.5 and 37.5 round to even (12 and 38 cumulative): the remainder goes to the last split
    assert counts["train"] == 25 and abs(counts["validation"] - 12.5) <= 1
    assert sum(counts.values()) == 50
    assert records.patient_split(ids, seed=1) == records.patient_split(list(reversed(ids)), seed=1)
    assert records.patient_split(ids, seed=1) != records.patient_split(ids, seed=2)


def test_check_no_leak_names_the_patient():
    a = records.build("q1", None, "CD", "normal", seed=0, split="train", patient_id="p7")
    b = records.build("q2", None, "CD", "benign", seed=0, split="test", patient_id="p7")
    c = records.build("q3", None, "CD", "benign", seed=0, split="test", patient_id="p8")
    records.check_no_leak([a, c])
    _one_line_error(lambda: records.check_no_leak([a, c, b]), "p7", "train", "test")


# ---- prompt -----------------------------------------------------------------------------------


def test_prompt_format():
    r = records.build("q", None, "FO", "breech", seed=0, split="test", patient_id="p")
    lines = [r.question] + [f"{'ABCD'[i]}. {o}" for i, o in enumerate(r.options)]
    lines.append("Answer with the option letter only.")
    assert records.prompt(r) == "\n".join(lines)
    system = "You are reading a fetal ultrasound image."
    assert records.prompt(r, system=system) == "\n".join([system, *lines])


# ---- boxes ------------------------------------------------------------------------------------


def test_box_bin_edges():
    # a 100 x 100 image: share = w * h / 10000; small below 0.02 (200 px), medium below 0.08
    assert records.box_bin((0, 0, 9, 18), 100, 100) == "small"  # 190 px
    assert records.box_bin((0, 0, 9, 19), 100, 100) == "medium"  # 200 px: the edge
    assert records.box_bin((0, 0, 19, 38), 100, 100) == "medium"  # 780 px
    assert records.box_bin((0, 0, 19, 39), 100, 100) == "large"  # 800 px: the edge


def test_draw_red_box_outline_only_on_an_rgb_copy():
    gray = np.full((40, 40), 90, np.uint8)
    before = gray.copy()
    out = records.draw_red_box(gray, (5, 6, 20, 30))
    np.testing.assert_array_equal(gray, before)  # input untouched
    assert out.shape == (40, 40, 3) and out.dtype == np.uint8
    red = np.all(out == [255, 0, 0], axis=-1)
    for x, y in [(5, 6), (20, 6), (5, 30), (20, 30), (12, 6), (5, 18), (20, 18), (12, 30)]:
        assert red[y, x], (x, y)
    assert not red[7:30, 6:20].any()  # thickness 1 at 40 px: the interior is untouched
    np.testing.assert_array_equal(out[7:30, 6:20], 90)
    assert red.sum() == 2 * 16 + 2 * 25 - 4  # the outline and nothing outside it
    thin = records.draw_red_box(np.zeros((30, 30, 3), np.uint8), (10, 3, 10, 20))
    assert np.all(thin[3:21, 10] == [255, 0, 0])  # a 1-pixel-wide box survives


# ---- parser -----------------------------------------------------------------------------------

ABCD = ("opt one", "opt two", "opt three", "opt four")
FO = vocab.VOCAB["FO"]
PARSES = [
    ("B", ABCD, 1),
    ("(B)", ABCD, 1),
    ("B.", ABCD, 1),
    ("Answer: B", ABCD, 1),
    ("**C**", ABCD, 2),
    ("The answer is D.", ABCD, 3),
    ("b)", ABCD, 1),
    ("(a)", ABCD, 0),
    ("Breech", FO, FO.index("breech")),
    ("Abdomen", ABCD, None),
    ("B or C", ABCD, None),
    ("E", ABCD, None),
    ("I think it is C", ABCD, 2),
    ("vertex", FO, FO.index("cephalic")),
    ("non-standard plane", ("standard plane", "non-standard plane"), 1),
    ("It is a non-standard plane.", ("standard plane", "non-standard plane"), 1),
    ("", ABCD, None),
    (None, ABCD, None),
]


@pytest.mark.parametrize("text,options,expected", PARSES)
def test_parse_answer_table(text, options, expected):
    assert parse.parse_answer(text, options) == expected


def test_parse_answer_article_is_not_option_a():
    assert parse.parse_answer("A plane like this is standard", vocab.VOCAB["PI"]) != 0
    # breech at index 1: the text match must win over the letter B inside the word
    assert parse.parse_answer("Breech", ("cephalic", "breech", "transverse, head left")) == 1
    assert parse.parse_answer("Breech", ("breech", "cephalic", "transverse, head left")) == 0


# ---- local data -------------------------------------------------------------------------------


def _tiny_set(rng):
    img = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
    # write_records marks a VG image as already boxed, so load must not draw again; the image
    # here carries no box, which makes a second drawing visible (redrawing a box is idempotent)
    vg = np.full((32, 32, 3), 70, np.uint8)
    return [
        records.build("p1/PI", img, "PI", "femur length plane", seed=0, split="train",
                      patient_id="p1", source_dataset="src", region="femur"),
        records.build("p2/CD", img[::-1].copy(), "CD", "malignant", seed=0, split="test",
                      patient_id="p2", source_dataset="src", style="phantom", region="lesion"),
        records.build("p2/VG", vg, "VG", "stomach bubble", seed=0, split="test", patient_id="p2",
                      source_dataset="src", bbox=(4, 5, 20, 25),
                      bbox_bin=records.box_bin((4, 5, 20, 25), 32, 32)),
    ]  # fmt: skip


def test_write_load_round_trip(tmp_path):
    recs = _tiny_set(np.random.default_rng(0))
    local_data.write_records(recs, str(tmp_path / "r.json"), str(tmp_path / "img"))
    back = local_data.load_records(str(tmp_path / "r.json"), str(tmp_path / "img"))
    assert len(back) == len(recs)
    for a, b in zip(recs, back, strict=True):
        for field in ("qid", "task", "question", "options", "answer_idx", "source_dataset",
                      "patient_id", "split", "style", "region", "bbox", "bbox_bin"):  # fmt: skip
            assert getattr(a, field) == getattr(b, field), field
        np.testing.assert_array_equal(a.image, b.image)  # PNG is lossless; no box drawn twice


def _write_json(tmp_path, items, name="r.json"):
    path = tmp_path / name
    path.write_text(json.dumps(items))
    return str(path)


def _save_png(path, array):
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def test_load_resizes_then_draws_the_scaled_box(tmp_path):
    _save_png(tmp_path / "img" / "a.png", np.full((200, 200, 3), 128, np.uint8))
    item = {"qid": "v", "image": "a.png", "task": "VG", "options": ["heart", "spine"],
            "answer": "heart", "bbox": [50, 100, 149, 179]}  # fmt: skip
    path = _write_json(tmp_path, [item])
    (r,) = local_data.load_records(path, str(tmp_path / "img"), size=64)
    assert r.image.shape == (64, 64, 3)
    x0, y0, x1, y1 = (int(50 * 0.32), int(100 * 0.32), int(149 * 0.32), int(179 * 0.32))
    assert r.bbox == (x0, y0, x1, y1)
    red = np.all(r.image == [255, 0, 0], axis=-1)
    for x, y in [(x0, y0), (x1, y0), (x0, y1), (x1, y1)]:
        assert red[y, x], (x, y)
    assert not red[y0 + 1 : y1, x0 + 1 : x1].any()  # thickness 1 at 64 px: outline only
    assert r.bbox_bin == records.box_bin((50, 100, 149, 179), 200, 200)  # from the original size


GOOD = {"qid": "q1", "image": "a.png", "task": "CD", "options": ["normal", "benign"],
        "answer": "benign"}  # fmt: skip
BAD_RECORDS = [
    ({"task": "XX"}, ("'q1'", "task")),
    ({"answer": "malignant"}, ("'q1'", "answer")),
    ({"answer_idx": 2}, ("'q1'", "answer_idx")),
    ({"task": "VG", "options": ["heart", "spine"], "answer": "heart", "bbox": [0, 0, 10, 16]},
     ("'q1'", "bbox")),
    ({"image": "missing.png"}, ("'q1'", "no image file", "missing.png")),
    ({"image": "http://example.org/a.png"}, ("http://example.org/a.png", "remote")),
    ({"image": "gs://bucket/a.png"}, ("gs://bucket/a.png", "remote")),
]  # fmt: skip


@pytest.mark.parametrize("change,needles", BAD_RECORDS)
def test_bad_record_is_one_line(tmp_path, change, needles):
    _save_png(tmp_path / "img" / "a.png", np.zeros((16, 16, 3), np.uint8))
    item = GOOD | change
    path = _write_json(tmp_path, [item])
    _one_line_error(lambda: local_data.load_records(path, str(tmp_path / "img")), *needles)


def test_bad_files_are_one_line(tmp_path):
    _save_png(tmp_path / "img" / "a.png", np.zeros((16, 16, 3), np.uint8))
    root = str(tmp_path / "img")
    load = local_data.load_records
    missing = str(tmp_path / "nope.json")
    _one_line_error(lambda: load(missing, root), missing)
    good = _write_json(tmp_path, [GOOD])
    _one_line_error(lambda: load(good, str(tmp_path / "noimg")), "image folder", "noimg")
    _one_line_error(lambda: load("http://host/r.json", root), "http://host/r.json", "remote")
    _one_line_error(lambda: load("gs://b/r.json", root), "gs://b/r.json", "remote")
    _one_line_error(lambda: load(good, "gs://b/images"), "gs://b/images", "remote")
    dup = _write_json(tmp_path, [GOOD, GOOD], "dup.json")
    _one_line_error(lambda: load(dup, root), "'q1'", "twice")
    not_list = _write_json(tmp_path, GOOD, "obj.json")
    _one_line_error(lambda: load(not_list, root), "obj.json", "list")
