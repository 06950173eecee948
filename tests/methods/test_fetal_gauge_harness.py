"""Fetal-Gauge harness, stubs and CLI: the stubs score what they must (oracle 1, parse failure 0
with every answer invalid, always-A and random at chance on shuffled options), the oracle does
not depend on call order, dispatch and argmax ties, one-line errors, the CLI end to end."""

import numpy as np
import pytest

from core.errors import ConfigError
from methods.fetal_gauge import harness, run_benchmark, scoring, stubs
from methods.fetal_gauge.parse import parse_answer
from methods.fetal_gauge.records import Record
from methods.fetal_gauge.vocab import TASKS, VOCAB

NUM_QUESTIONS = 400
# Accuracy of a model at chance on n=400 questions of chance c ~ 0.3: binomial standard
# deviation sqrt(0.3 * 0.7 / 400) = 0.023; 0.07 is 3 sd (the seeds fix the draw, so no flake).
CHANCE_TOLERANCE = 0.07


def make_records(num, *, shuffled, seed=0):
    """Records over all tasks, 2-4 options from the task's vocabulary; a distinct random image
    each. shuffled=False puts every answer at A (the position-bias case)."""
    rng = np.random.default_rng(seed)
    records = []
    for i in range(num):
        task = TASKS[i % len(TASKS)]
        vocab = VOCAB[task]
        k = min(len(vocab), 2 + i % 3)
        options = [vocab[j] for j in rng.permutation(len(vocab))[:k]]
        answer_idx = int(rng.integers(k)) if shuffled else 0
        image = rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
        question = f"question about task {task}?"
        records.append(Record(f"q{i}", image, task, question, tuple(options), answer_idx))
    return records


def run_score(model, records, **kwargs):
    predictions = harness.evaluate(model, records, progress=False, **kwargs)
    return predictions, scoring.score(records, predictions.indices, n_boot=100)


def test_oracle_scores_one_whatever_the_call_order():
    records = make_records(NUM_QUESTIONS, shuffled=True)
    oracle = stubs.make_stub("oracle", records)
    order = np.random.default_rng(1).permutation(len(records))
    reordered = [records[i] for i in order]  # asked in another order, other batch borders
    _, scores = run_score(oracle, reordered, batch_size=7)
    assert scores["micro"]["accuracy"] == 1.0
    assert scores["invalid_rate"] == 0.0


def test_parse_failure_scores_zero_and_every_answer_is_invalid():
    for task in TASKS:  # its text reads as no option of any task's vocabulary
        assert parse_answer(stubs.ParseFailure.TEXT, VOCAB[task]) is None
    records = make_records(60, shuffled=True)
    predictions, scores = run_score(stubs.make_stub("parse-failure"), records)
    assert scores["micro"]["accuracy"] == 0.0
    assert scores["invalid_rate"] == 1.0
    assert predictions.raw == [stubs.ParseFailure.TEXT] * len(records)


def test_always_a_is_at_chance_only_because_options_are_shuffled():
    always_a = stubs.make_stub("always-a")
    _, shuffled = run_score(always_a, make_records(NUM_QUESTIONS, shuffled=True))
    assert abs(shuffled["micro"]["accuracy"] - shuffled["chance_micro"]) < CHANCE_TOLERANCE
    _, unshuffled = run_score(always_a, make_records(NUM_QUESTIONS, shuffled=False))
    assert unshuffled["micro"]["accuracy"] == 1.0  # every answer at A: the bias shows
    assert all(row["A"]["accuracy"] == 1.0 for row in shuffled["position_bias"].values())


def test_random_is_at_chance_even_when_every_answer_is_at_a():
    # On unshuffled options a model with any position preference is far from chance; a
    # uniform random one is not.
    records = make_records(NUM_QUESTIONS, shuffled=False)
    predictions, scores = run_score(stubs.make_stub("random", seed=3), records)
    assert abs(scores["micro"]["accuracy"] - scores["chance_micro"]) < CHANCE_TOLERANCE
    assert predictions.raw == [None] * len(records)


class _Scorer:
    """score_options model with fixed scores per question; generate too, to check dispatch."""

    name = "fixed"

    def __init__(self, scores_of=lambda opts: np.zeros(len(opts)), count_delta=0):
        self.scores_of, self.count_delta = scores_of, count_delta

    def score_options(self, images, questions, options):
        scores = [self.scores_of(opts) for opts in options]
        return scores[: len(scores) + self.count_delta] if self.count_delta < 0 else scores

    def generate(self, images, prompts):
        raise AssertionError("score_options must be preferred when a model has both")


def test_argmax_ties_go_to_the_lowest_index_and_score_options_is_preferred():
    records = make_records(20, shuffled=True)
    predictions = harness.evaluate(_Scorer(), records, progress=False)
    assert predictions.indices == [0] * len(records)
    last_two_tied = _Scorer(lambda opts: np.array([0.0] * (len(opts) - 2) + [1.0, 1.0]))
    predictions = harness.evaluate(last_two_tied, records, progress=False)
    assert predictions.indices == [len(r.options) - 2 for r in records]


def test_model_errors_are_one_line_naming_model_and_qid():
    records = make_records(10, shuffled=True)
    first_batch = r"'fixed' returned 3 outputs for a batch of 4 \(first qid 'q0'\)"
    with pytest.raises(ConfigError, match=first_batch):
        harness.evaluate(_Scorer(count_delta=-1), records, batch_size=4, progress=False)
    with pytest.raises(ConfigError, match=r"'fixed' gave 1 scores .*qid 'q0'") as error:
        harness.evaluate(_Scorer(lambda opts: np.zeros(1)), records, progress=False)
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="neither score_options nor generate"):
        harness.evaluate(object(), records, progress=False)
    with pytest.raises(ConfigError, match="model='nope'"):
        stubs.make_stub("nope")
    with pytest.raises(ConfigError, match="oracle"):
        stubs.make_stub("oracle")


def test_progress_reports_questions_per_second(monkeypatch, capsys):
    monkeypatch.setattr(harness, "PROGRESS_EVERY_S", 0.0)
    harness.evaluate(stubs.AlwaysA(), make_records(10, shuffled=True), batch_size=5)
    assert "10/10 questions" in capsys.readouterr().err


def test_cli_scores_a_written_set_and_bad_input_is_one_line(tmp_path, capsys):
    from methods.fetal_gauge.local_data import write_records

    rng = np.random.default_rng(0)
    records = [
        r.with_image(rng.integers(0, 256, size=(16, 16, 3), dtype=np.uint8))
        for r in make_records(30, shuffled=True)
    ]
    records_json, image_root = str(tmp_path / "records.json"), str(tmp_path / "images")
    write_records(records, records_json, image_root)
    out = tmp_path / "card"
    argv = ["--records", records_json, "--images", image_root, "--out", str(out)]
    assert run_benchmark.main(argv + ["--model", "oracle", "--size", "16"]) == 0
    printed = capsys.readouterr().out
    assert "| PI | 6 | 100.0 [100.0, 100.0]" in printed and "overall (micro)" in printed
    written = {p.name for p in out.iterdir()}
    assert written == {"scores.json", "report.md", "accuracy.png", "predictions.jsonl"}

    bad = ["--records", str(tmp_path / "missing.json"), "--images", image_root, "--out", "x"]
    for wrong in (
        bad,
        argv + ["--model", "nope"],
        argv + ["--tasks", "XX"],
        ["--size", "a"],
        argv + ["--split", "val"],
    ):
        assert run_benchmark.main(wrong) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("fetal_gauge"), err
