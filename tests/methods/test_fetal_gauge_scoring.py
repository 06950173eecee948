"""Fetal-Gauge scoring and scorecard: micro vs macro, per-question chance, bootstrap coverage,
invalid answers, position bias, breakdowns, the three scorecard files."""

import json

import numpy as np
import pytest

from core.errors import ConfigError
from methods.fetal_gauge import scorecard, scoring
from methods.fetal_gauge.records import Record

IMAGE = np.zeros((2, 2, 3), np.uint8)


def record(qid, task, answer_idx, *, k=4, **fields):
    options = tuple(f"option {j}" for j in range(k))
    return Record(qid, IMAGE, task, "q?", options, answer_idx, **fields)


def test_micro_is_question_weighted_and_macro_the_mean_of_tasks():
    # PI: 4 questions, 3 right (0.75); VC: 1 question, wrong (0.0).
    # micro = 3 / 5 = 0.6; macro = (0.75 + 0.0) / 2 = 0.375 (by hand).
    records = [record(f"pi{i}", "PI", 0) for i in range(4)] + [record("vc", "VC", 1, k=2)]
    predictions = [0, 0, 0, 2, 0]
    scores = scoring.score(records, predictions, n_boot=50)
    assert scores["tasks"]["PI"]["accuracy"] == pytest.approx(0.75)
    assert scores["tasks"]["VC"]["accuracy"] == pytest.approx(0.0)
    assert scores["micro"]["accuracy"] == pytest.approx(0.6)
    assert scores["macro"]["accuracy"] == pytest.approx(0.375)


def test_chance_is_the_mean_of_one_over_k_with_mixed_option_counts():
    # 2, 3 and 4 options: chance = (1/2 + 1/3 + 1/4) / 3 = 13/36, not 1 / mean(k) = 1/3.
    records = [record("a", "PI", 0, k=2), record("b", "PI", 0, k=3), record("c", "PI", 0, k=4)]
    records.append(record("d", "VC", 0, k=2))
    assert scoring.chance(records)["PI"] == pytest.approx(13 / 36)
    scores = scoring.score(records, [0, 0, 0, 0], n_boot=50)
    assert scores["tasks"]["PI"]["chance"] == pytest.approx(13 / 36)
    assert scores["tasks"]["VC"]["chance"] == pytest.approx(0.5)
    assert scores["chance_micro"] == pytest.approx((13 / 12 + 1 / 2) / 4)
    assert scores["chance_macro"] == pytest.approx((13 / 36 + 1 / 2) / 2)


def test_bootstrap_interval_covers_the_true_accuracy_at_the_nominal_rate():
    # 400 simulated runs of a Bernoulli(0.7) model on 200 questions. If the 95 % interval covers
    # p with probability 0.95, the number of covering runs is Binomial(400, 0.95): standard
    # deviation sqrt(400 * 0.95 * 0.05) / 400 = 0.011 in rate, so [0.92, 0.98] is about
    # +-2.7 sd (a correct interval fails it with probability under 1 %; the seed fixes it).
    # A 90 % interval (a wrong tail) covers ~0.90 and fails; so does a too-narrow one.
    rng = np.random.default_rng(0)
    p, n, runs = 0.7, 200, 400
    covered = 0
    for run in range(runs):
        correct = rng.random(n) < p
        low, high = scoring.bootstrap_interval(correct, seed=run, n_boot=1000)
        covered += low <= p <= high
    assert 0.92 <= covered / runs <= 0.98


def test_bootstrap_interval_matches_resampling_questions():
    # The binomial shortcut must give the interval that resampling n indices gives: same
    # distribution, so the endpoints agree to Monte-Carlo error (4000 resamples: the 2.5 %
    # quantile's error is ~0.005 at n=100; 0.02 allows ~4 such errors).
    correct = np.arange(100) % 10 < 6  # accuracy 0.6
    rng = np.random.default_rng(1)
    means = correct[rng.integers(0, 100, size=(4000, 100))].mean(axis=1)
    expected = np.percentile(means, [2.5, 97.5])
    low, high = scoring.bootstrap_interval(correct, seed=3, n_boot=4000)
    assert low == pytest.approx(expected[0], abs=0.02)
    assert high == pytest.approx(expected[1], abs=0.02)


def test_invalid_answers_are_wrong_and_counted():
    records = [record(f"q{i}", "CD", 1, k=3) for i in range(4)]
    scores = scoring.score(records, [None, 1, None, 0], n_boot=50)
    assert scores["tasks"]["CD"]["accuracy"] == pytest.approx(0.25)
    assert scores["tasks"]["CD"]["invalid_rate"] == pytest.approx(0.5)
    assert scores["invalid_rate"] == pytest.approx(0.5)
    assert sum(scores["predicted_letters"]["CD"].values()) == pytest.approx(0.5)


def test_position_bias_by_correct_letter_and_predicted_letters():
    # A model that always picks A: right exactly when the answer sits at A.
    records = [record(f"q{i}", "FO", i % 4) for i in range(8)]
    scores = scoring.score(records, [0] * 8, n_boot=50)
    bias = scores["position_bias"]["FO"]
    assert bias["A"] == {"n": 2, "accuracy": 1.0}
    assert all(bias[x] == {"n": 2, "accuracy": 0.0} for x in "BCD")
    assert scores["predicted_letters"]["FO"] == {"A": 1.0}


def test_breakdowns_group_by_field_and_skip_none():
    records = [
        record("s1", "VG", 0, bbox_bin="small", style="phantom"),
        record("s2", "VG", 0, bbox_bin="small"),
        record("l1", "VG", 0, bbox_bin="large"),
        record("p1", "PI", 0),  # bbox_bin None, region "": in no cell of either
    ]
    scores = scoring.score(records, [0, 1, 0, 0], n_boot=50)
    by_bin = scores["by"]["bbox_bin"]
    assert set(by_bin) == {"VG"}
    assert by_bin["VG"]["small"]["n"] == 2 and by_bin["VG"]["small"]["accuracy"] == 0.5
    assert by_bin["VG"]["large"]["accuracy"] == 1.0
    assert scores["by"]["style"]["VG"]["phantom"]["n"] == 1
    assert scores["by"]["style"]["PI"]["clinical"]["n"] == 1
    assert scores["by"]["region"] == {}


def test_bad_predictions_are_one_line_errors():
    records = [record("a", "PI", 0), record("b", "PI", 0)]
    with pytest.raises(ConfigError, match="1 predictions for 2 records"):
        scoring.score(records, [0])
    with pytest.raises(ConfigError, match="'b'") as error:
        scoring.score(records, [0, 4])
    assert "\n" not in str(error.value)


def test_scorecard_writes_json_report_and_plot(tmp_path):
    records = [record(f"q{i}", task, i % 2, k=2) for i, task in enumerate(["PI", "VC"] * 5)]
    scores = scoring.score(records, [i % 2 for i in range(10)], n_boot=50)
    paths = scorecard.write(scores, str(tmp_path / "card"), title="test card")
    with open(paths["scores"]) as f:
        assert json.load(f)["micro"]["accuracy"] == 1.0
    with open(paths["report"]) as f:
        report = f.read()
    assert "| PI | 5 | 100.0 [100.0, 100.0] | 50.0 | 0.0 |" in report
    assert "overall (micro)" in report and "mean of tasks (macro)" in report
    assert (
        "Position bias" in report and "by region" not in report
    )  # region "" (not given) is skipped
    with open(paths["plot"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
