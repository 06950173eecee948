"""The VWF re-test (issue 47): the localiser's word / scrambled-word pairs share their items and
its words are the taught lexicon's; diet v2 trains on every localiser category with reading a
minority; the official hook zeroes what the official code zeroes; the v2 experiment's wiring,
claims and record; its smoke run end to end."""

import dataclasses
import functools
import json
import os

import jax
import numpy as np
import pytest

from configs import vwf_dyslexia as vwf_config
from core import experiment_runner, results
from core.errors import ConfigError
from core.nn import vlm
from methods.vwf_dyslexia import (
    answer_logits,
    experiment,
    experiment_v2,
    lesion,
    localiser,
    model_config,
    official_hook,
    report_v2,
    retest,
    stimuli,
    tasks,
)
from tests.methods import retest_checks

LEXICON = tasks.lexicon(64)


def pairs_share_items(images: dict) -> bool:
    """Scrambled image i holds word image i's ink (the same pixel values) inside its tile box:
    the ink-matched pair `stimuli.localiser_images` promises."""
    for w, s in zip(images["word"], images["scrambled_word"], strict=True):
        if not np.array_equal(np.sort(w.ravel()), np.sort(s.ravel())):
            return False
        ink_w, ink_s = np.argwhere(w > 0), np.argwhere(s > 0)
        if np.any(ink_s.min(0) < ink_w.min(0) // 4 * 4):
            return False
        if np.any(ink_s.max(0) >= (ink_w.max(0) // 4 + 1) * 4):
            return False
    return True


def test_localiser_word_and_scrambled_word_pairs_share_items():
    images = localiser.category_images(12, seed=3, jitter=0.0, words=LEXICON)
    assert pairs_share_items(images)
    moved = [np.mean(w != s) for w, s in zip(images["word"], images["scrambled_word"], strict=True)]
    assert min(moved) > 0.02  # the letters' pixels moved
    # The flaw (localiser.py before issue 47): each category a seed of its own, so the
    # scrambled words were other words than the words. It fails the check.
    old = {
        c: stimuli.localiser_images(c, 12, seed=3 * 10 + i, jitter=0.0, words=LEXICON)
        for i, c in enumerate(stimuli.CATEGORIES)
    }
    assert not pairs_share_items(old)


@functools.cache
def renderings(words: tuple) -> np.ndarray:
    """[words x fonts, H, W]: every word in every training font at jitter 0 (one size and
    place, so the rendering is a function of word and font)."""
    rng = np.random.default_rng(0)
    return np.stack([stimuli.render_text(w, f, rng, 0.0) for w in words for f in stimuli.FONTS])


def all_rendered_from(images, words) -> bool:
    known = renderings(tuple(words)).reshape(len(words) * len(stimuli.FONTS), -1)
    return all(np.any(np.all(known == im.ravel(), axis=1)) for im in images)


def test_localiser_words_are_the_taught_lexicon_even_beyond_its_size():
    n = 72  # the localiser's count per category, more than the 64-word lexicon
    images = localiser.category_images(n, seed=1, jitter=0.0, words=LEXICON)["word"]
    assert len(images) == n and all_rendered_from(images, LEXICON)
    strings = stimuli.localiser_strings(n, seed=10, words=LEXICON)
    assert set(strings) == set(LEXICON)  # every word once, 8 twice (in other fonts)
    # The flaw: the whole word list (the first study's localiser), words the model never knew.
    old = localiser.category_images(8, seed=1, jitter=0.0)["word"]
    assert not all_rendered_from(old, LEXICON)


def shares(diet: str, steps=(0, 5000), draws: int = 4000) -> dict:
    """task -> its empirical share of training examples (the curriculum's own draws)."""
    curriculum = tasks.Curriculum(0.0, diet=diet)
    rng = np.random.default_rng(0)
    names = [curriculum.draw(rng, steps[i % 2]) for i in range(draws)]
    return {t: names.count(t) / draws for t in tasks.ALL_TASKS}


def in_distribution_with_reading_a_minority(share: dict) -> bool:
    reading = sum(share[t] for t in tasks.READING)
    every_category = all(
        sum(share[t] for t in tasks.TASKS_OF_CATEGORY[c]) > 0.05 for c in stimuli.CATEGORIES
    )
    # 4000 draws: the share's standard error is 0.0066, so [0.20, 0.25] holds 0.225 by 3.8 SE
    return every_category and 0.20 <= reading <= 0.25


def test_diet_v2_trains_on_every_localiser_category_and_reads_22_percent():
    assert sum(tasks.DIETS["v2"][t] for t in tasks.READING) == pytest.approx(0.225)
    assert in_distribution_with_reading_a_minority(shares("v2"))
    assert not in_distribution_with_reading_a_minority(shares("v1"))  # the first study's diet
    strings = tasks.letter_strings("train", 64)
    rng = np.random.default_rng(1)
    labels = {t: [] for t in tasks.NEW_TASKS}
    for i in range(600):
        task = tasks.NEW_TASKS[i % 3]
        ex = tasks.task_example(rng, task, strings, jitter=0.0)
        assert ex["task"] == tasks.ALL_TASKS.index(task) and ex["image"].shape == (32, 128, 1)
        labels[task].append(ex["targets"][np.argmax(ex["mask"])] == tasks.YES)
    assert all(0.35 < np.mean(v) < 0.65 for v in labels.values()), labels  # both answers


def test_new_tasks_draw_the_localisers_own_images():
    for seed in range(5):
        smile = stimuli.face(np.random.default_rng(seed), smile=True)
        np.testing.assert_array_equal(smile, stimuli.face(np.random.default_rng(seed)))
        frown = stimuli.face(np.random.default_rng(seed), smile=False)
        changed_rows = np.flatnonzero((smile != frown).any(axis=1))
        assert 0 < changed_rows.size <= 5  # only the mouth's rows: its shape, not its place
        image, kinds = stimuli.line_object_parts(np.random.default_rng(seed))
        np.testing.assert_array_equal(image, stimuli.line_object(np.random.default_rng(seed)))
        assert 2 <= len(kinds) <= 4 and set(kinds) <= set(stimuli.OBJECT_PARTS)


# --------------------------------------------------------------------------- official hook

CONFIG = vwf_config.get_config("size=smoke,diet=v2")
CONFIG.model.update(patch_size=16, num_layers=2, d_ff=32)  # 16 image tokens; d_ff >= 25 positions
CFG = model_config(CONFIG)
L, F = CFG.decoder.num_layers, CFG.decoder.d_ff


@functools.cache
def params():
    return vlm.init_params(CFG, jax.random.key(0))


@functools.cache
def batch():
    examples = lesion.eval_set(
        2, 0, lexicon_size=64, task_names=tuple(tasks.DIETS["v2"]), jitter=0.0, spell=True
    )
    return next(lesion.batches(examples, 16))


def selection() -> np.ndarray:
    selected = np.random.default_rng(3).random((L, F)) < 0.3
    selected[0, 0], selected[1, 0] = True, False  # decoding zeroes layer 0 whole, not layer 1
    return selected


def intact_gates(gate_mask_LF=None) -> np.ndarray:
    names = vlm.gate_names(CFG)
    b = batch()
    out = vlm.apply(
        CFG, params(), b["image"], b["inputs"], capture=names, gate_mask_LF=gate_mask_LF
    )
    return np.stack([np.asarray(out.captured[n]) for n in names], axis=2)  # [B, S, L, F]


def matches_the_official_hook_on_layer_0(gates_BSLF, selected) -> bool:
    """Layer 0's gates (its input no lesion reaches) equal the official hook applied to the
    intact ones: the prompt in one call (T = prompt length), then one call per answer token."""
    intact = intact_gates()
    prefill = np.asarray(official_hook.prefill_lengths(CFG, batch()["mask"]))
    for b, n in enumerate(prefill):
        calls = [intact[b : b + 1, :n, 0]] + [intact[b : b + 1, p : p + 1, 0] for p in
                                             range(n, intact.shape[1])]  # fmt: skip
        expected = np.concatenate([official_hook.reference_hook(c, selected[0]) for c in calls], 1)
        if not np.allclose(gates_BSLF[b, :, 0], expected[0], atol=1e-5):
            return False
    return True


def test_official_hook_without_a_selection_is_the_intact_model():
    b = batch()
    intact = np.asarray(answer_logits(CFG, params(), b))
    hooked = np.asarray(official_hook.logits(CFG, params(), b, np.zeros((L, F), bool)))
    np.testing.assert_allclose(hooked, intact, atol=1e-5)  # float32: cached steps, other sums


def test_official_hook_zeroes_what_the_official_code_zeroes_and_the_unit_lesion_does_not():
    selected = selection()
    hooked = np.asarray(official_hook.gates(CFG, params(), batch(), selected))
    assert matches_the_official_hook_on_layer_0(hooked, selected)
    # Every layer: a position's whole gate is zero exactly where the hook says (unit s in the
    # prompt, unit 0 at a decoding step), and nowhere else.
    prefill = np.asarray(official_hook.prefill_lengths(CFG, batch()["mask"]))
    for b, n in enumerate(prefill):
        zeroed_SL = np.all(hooked[b] == 0, axis=-1)
        expected_SL = np.asarray(official_hook.keep_LS(selected, n, hooked.shape[1])).T == 0
        np.testing.assert_array_equal(zeroed_SL, expected_SL)
        assert expected_SL[n:, 0].all() and not expected_SL[n:, 1].any()
    # The unit lesion the paper describes zeroes units, not positions: it fails the check.
    unit = intact_gates(lesion.unit_masks(selected))
    assert not matches_the_official_hook_on_layer_0(unit, selected)


def test_official_hook_ignores_units_beyond_the_sequence_that_the_unit_lesion_silences():
    selected = np.zeros((L, F), bool)
    selected[:, 26:] = True  # only units past the 25 positions (16 image + 9 text)
    b = batch()
    intact = np.asarray(answer_logits(CFG, params(), b))
    hooked = np.asarray(official_hook.logits(CFG, params(), b, selected))
    np.testing.assert_allclose(hooked, intact, atol=1e-5)
    unit = np.asarray(answer_logits(CFG, params(), b, lesion.unit_masks(selected)))
    assert np.abs(unit - intact).max() > 1e-3


# --------------------------------------------------------------------------- the experiment


def test_full_v2_joins_result_runs_with_its_record():
    has_record = os.path.exists(results.path("vwf_dyslexia", experiment.V2))
    assert (experiment.V2 in experiment.RESULT_RUNS) == has_record
    assert "full" in experiment.RESULT_RUNS  # the first study's record stays


def test_v2_configs_train_diet_v2_select_on_val_and_vary_only_the_width_and_seed():
    arm = experiment_v2.EXPERIMENT.arms[0]
    a, b = (experiment_v2.config_of(arm, {"d_ff": d}, 1, False) for d in experiment_v2.D_FF)
    assert a.data.diet == "v2" and a.data.lexicon_size == 64 and a.data.spell
    assert a.train.steps == experiment_v2.STEPS and a.seed == 1
    assert (a.model.d_ff, b.model.d_ff) == experiment_v2.D_FF
    assert tuple(a.exp.percents)[-1] == 21 and a.exp.official_percent == 21
    pilot = experiment_v2.config_of(experiment_v2.PILOT.arms[0], {}, 1, False)
    assert pilot.to_dict() == a.to_dict()  # the pilot's runs are the grid's (one cache entry)
    del a.model["d_ff"], b.model["d_ff"]
    assert a.to_dict() == b.to_dict()
    assert experiment_v2.EXPERIMENT.select_on.startswith("validation/")
    assert experiment_v2.EXPERIMENT.run_name(quick=False) == "full_v2" == experiment.V2
    assert "methods/vwf_dyslexia/experiment_v2.py" not in experiment_v2.EXPERIMENT.sources
    with pytest.raises(ConfigError, match="claim_percent"):
        dataclasses.replace(experiment_v2.FULL, percents=(1, 2))
    with pytest.raises(ConfigError, match="diet"):
        vwf_config.get_config("size=cpu,diet=v3")


def fake_run(config, run_dir):
    """Metrics from the width and seed alone: a selective VWF lesion, d_ff 256 best on val."""
    del run_dir
    wiggle = 0.01 * config.seed
    out = {"validation/mean_accuracy": 0.9 if config.model.d_ff == 256 else 0.8}
    for spec in experiment_v2.CLAIMS:
        out[spec.metric] = (spec.margin - 3.0 if spec.form == "at_most" else
                            spec.margin + 0.1) + wiggle  # fmt: skip
    for k in experiment_v2.FULL.percents:  # what report_v2 reads besides the claims
        for m in ("selectivity/vwf", "selectivity/random", "selectivity/vwf_minus_random",
                  "official/selectivity/vwf"):  # fmt: skip
            out.setdefault(f"test/{m}/{k:g}", k / 100 + wiggle)
    out |= {f"test/intact/{t}": 0.9 + wiggle for t in tasks.DIETS["v2"]}
    accuracy = {
        retest.name("vwf", k): {"lexical": 1 - k / 100} for k in experiment_v2.FULL.percents
    }
    out["detail"] = {"accuracy": {"intact": {"lexical": 1.0}, **accuracy}}
    return out


def test_v2_claims_derive_from_the_record_after_a_json_round_trip(tmp_path):
    fake = dataclasses.replace(experiment_v2.EXPERIMENT, run=fake_run)
    record = experiment_runner.measure(fake, str(tmp_path))
    assert record["run"] == "full_v2" and all(e["open"] for e in record["edges"])
    results.save(record, str(tmp_path / "results"))
    reread = results.load("vwf_dyslexia", "full_v2", str(tmp_path / "results"))
    claims = experiment.claims_from_results(reread)
    assert len(claims) == 9 and all(c.holds for c in claims)
    assert experiment_runner.choices(reread)["vlm"].point == {"d_ff": 256}
    assert claims[0].margin == 0.10 and "exploratory" in claims[-2].text
    table = report_v2.table(reread).splitlines()
    assert table[0].endswith("**256: 0.900**, 512: 0.800")  # the width chosen on val, in bold
    assert table[4] == "| lexical | 0.900 | 0.910 | 0.920 | 0.930 | 0.940 |"  # d_ff 256, 5 seeds
    assert table[-1] == (  # k = 21 %: 0.21 + 0.01 x seed, claims 6-7: margin + 0.1 + 0.01 x seed
        "| 21 | 0.230 [0.210, 0.250] | 0.230 [0.210, 0.250] | 0.170 [0.150, 0.190] "
        "| 0.220 [0.200, 0.240] |"
    )
    (figure,) = report_v2.plot(reread, str(tmp_path))
    assert os.path.getsize(figure) > 10_000


@pytest.mark.slow  # ~22 s at load ~8, ~40 s with a cold compile cache: past a method's share
def test_v2_smoke_runs_end_to_end_and_its_record_reads_back(tmp_path, monkeypatch):
    pools = []
    category_images = localiser.category_images

    def recording(n, seed, jitter=1.0, words=None):
        pools.append(words)
        return category_images(n, seed, jitter, words)

    monkeypatch.setattr(localiser, "category_images", recording)
    record = experiment_runner.measure(experiment_v2.EXPERIMENT, str(tmp_path), quick=True)
    assert pools and all(tuple(p) == LEXICON for p in pools)  # the localiser reads the lexicon
    assert record["run"] == "quick_v2" and len(record["rows"]) == 3
    row = record["rows"][0]
    for spec in experiment_v2.CLAIMS:
        assert np.isfinite(row[spec.metric]), spec.metric
    masks = set(row["detail"]["accuracy"])
    assert {"intact", "vwf/21", "official/vwf/21", "official/random/21/1", "all"} <= masks
    assert set(row["detail"]["accuracy"]["intact"]) == set(tasks.DIETS["v2"])
    again = json.loads(json.dumps(record))
    assert len(experiment.claims_from_results(again)) == 9
    assert max(experiment_v2.FULL.percents) < retest.NOT_REACHED


def test_default_full_job_reports_the_first_study_and_the_re_test(tmp_path, monkeypatch):
    """The default job's full run reports both records, the re-test's figure among them."""
    report, _, _ = retest_checks.full_job_report(
        experiment, "vwf_dyslexia", str(tmp_path), monkeypatch
    )
    names = sorted(os.path.basename(f) for f in report.figures)
    assert "vwf_dyslexia_v2.png" in names and len(names) >= 2
