"""Selective RoPE's re-test (issue 47): the authors' state-tracking recipe reaches the runs, the
validation stream (checkpoint and lr choice, at 4x) is disjoint from the reported test stream,
checkpoints are chosen on validation, and "full_v2" joins RESULT_RUNS with its record."""

import dataclasses
import itertools
import json
import math
import os

import numpy as np
import pytest

import methods.selective_rope as sr
from core import experiment_cli, experiment_runner, optim, results
from core.errors import ConfigError
from core.metrics import NonFiniteLossError
from methods.selective_rope import experiment, experiment_v2, model, retest
from tests.methods import retest_checks

FULL_ARMS = experiment_v2.EXPERIMENT.arms


def full_configs(seed: int = 0) -> list:
    return [
        experiment_v2.EXPERIMENT.config_of(arm, {"lr": lr}, seed, False)
        for arm in FULL_ARMS
        for lr in experiment_v2.LRS
    ]


def shared_sequences(config, seeds, length: int) -> int:
    """How many sequences the validation streams of `seeds` share with their test streams, at
    `length` (a 512-bit sequence recurs only if its generator does)."""

    def draws(split):
        return {
            row.tobytes()
            for seed in seeds
            for row in sr.split_examples(config, f"{split}/len{length}", seed=seed)["inputs"]
        }

    return len(draws("validation") & draws("test"))


def test_validation_stream_is_disjoint_from_test_stream(monkeypatch):
    """The 4x validation examples that choose the checkpoint and the lr are none of the test
    examples that are reported, for any pair of the experiment's seeds; the selection reads only
    validation and the claims only test. With one seed offset for both streams (the authors'
    code chooses on its test set) they coincide, and the check sees it."""
    config = full_configs()[0]
    config.eval.num_examples = 32
    T4 = 4 * experiment_v2.FULL.train_length
    assert sr.validation_lengths(config) == [T4]
    seeds = experiment_v2.EXPERIMENT.seeds
    assert shared_sequences(config, seeds, T4) == 0
    # Training draws example j of seed s from default_rng([s, j]): no held-out offset is a seed.
    offsets = {s + o for s in seeds for o in sr.SPLIT_SEED_OFFSETS.values()}
    assert len(offsets) == len(seeds) * 2 and not offsets & set(seeds)
    assert experiment_v2.EXPERIMENT.select_on == f"validation/len{T4}/last_quarter"
    assert all(c.metric.startswith("test/") for c in experiment_v2.EXPERIMENT.claims)
    planted = {"test": sr.SPLIT_SEED_OFFSETS["test"], "validation": sr.SPLIT_SEED_OFFSETS["test"]}
    monkeypatch.setattr(sr, "SPLIT_SEED_OFFSETS", planted)
    assert shared_sequences(config, seeds, T4) == len(seeds) * 32


def test_the_authors_state_tracking_recipe_reaches_every_run():
    for config in full_configs(seed=2):
        o = config.optim
        assert (o.name, o.weight_decay, o.b1, o.b2, o.eps) == ("adamw", 1e-6, 0.9, 0.999, 1e-8)
        assert not o.grad_clip and o.warmup_steps == 0  # core.optim: 0 is no clipping
        lr_at = optim.schedule(o, config.train.steps)
        # No warm-up: the full lr at step 0 (float32's rounding), cosine to 0 at the end.
        assert float(lr_at(0)) == pytest.approx(o.lr, rel=1e-6)
        assert float(lr_at(config.train.steps)) == 0.0
        assert config.task.bos and config.task.length == 128  # the authors' k
        assert sr.eval_lengths(config) == [128, 256, 512] and sr.validation_lengths(config) == [512]
        cfg = sr.model_config(config)
        assert (cfg.phi_rank, cfg.temp_max, cfg.temp_theta, cfg.use_bias) == (32, 1.0, 1.0, True)
        assert (cfg.conv_silu, cfg.use_gate, cfg.rope_base) == (False, False, 500000.0)
        assert cfg.vocab_size == 4  # PAD, the two bits, BOS
        example = sr.make_task(config).example(np.random.default_rng(0))
        assert example["inputs"][0] == 3 and example["mask"][0] == 0 and example["mask"][1:].all()
    # RoPE and none carry the rank-32 projection's parameters as SwiGLU width.
    params = {model.count_params(sr.model_config(c)) for c in full_configs()}
    assert max(params) - min(params) < 1.5 * 64


def test_bos_shifts_the_same_bits_by_one_position():
    config = full_configs()[0]
    config.task.bos = False
    bits = sr.make_task(config).example(np.random.default_rng(7))
    config.task.bos = True
    with_bos = sr.make_task(config).example(np.random.default_rng(7))
    for key in ("inputs", "targets", "mask"):
        np.testing.assert_array_equal(with_bos[key][1:], bits[key])
    config.task.name = "mqar"
    with pytest.raises(ConfigError, match="task.bos=True needs task.name='parity'"):
        sr.make_task(config)


def test_the_checkpoint_is_chosen_on_validation_and_its_test_numbers_reported():
    # Validation is best at step 2 (twice: the first of equals), test at step 3.
    history = [{"step": 1, "loss": 0.7}]
    for step, val, test in ((1, 0.6, 0.6), (2, 0.9, 0.8), (3, 0.7, 0.95), (4, 0.9, 0.7)):
        history.append(
            {
                "step": step,
                "eval/validation.len64/last_quarter": val,
                "eval/len64/last_quarter": test,
            }
        )
    evals = retest.evaluations(history)
    assert [e["step"] for e in evals] == [1, 2, 3, 4]
    chosen = retest.choose_checkpoint(evals, "validation/len64/last_quarter")
    assert chosen["step"] == 2 and chosen["test/len64/last_quarter"] == 0.8
    with pytest.raises(ConfigError, match="chosen on validation"):
        retest.choose_checkpoint(evals, "test/len64/last_quarter")


def test_a_diverged_run_chooses_among_the_evaluations_it_logged(tmp_path, monkeypatch):
    config = experiment_v2.run_config(experiment_v2.SMOKE, "selective", lr=1e-3, seed=0)
    rows = [
        {"step": 1, "eval/validation.len64/last_quarter": 0.7, "eval/len64/last_quarter": 0.6},
        {"step": 2, "loss": 0.5},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def diverge(*args, **kwargs):
        raise NonFiniteLossError("non-finite loss (nan) at step 3")

    monkeypatch.setattr(retest.train, "run", diverge)
    row = retest.run(config, str(tmp_path))
    assert row["diverged"] == 1.0 and row["checkpoint_step"] == 1
    assert row["test/len64/last_quarter"] == 0.6 and "final_flip_error" not in row
    (tmp_path / "metrics.jsonl").write_text("")  # diverged before any evaluation: chance
    row = retest.run(config, str(tmp_path))
    assert row["validation/len64/last_quarter"] == 0.5 and row["test/len16/exact_match"] == 0.5


def test_full_v2_joins_result_runs_with_its_record():
    has_record = os.path.exists(results.path("selective_rope", experiment.V2))
    assert (experiment.V2 in experiment.RESULT_RUNS) == has_record
    assert experiment.V2 == "full_v2" == experiment_v2.EXPERIMENT.run_name(quick=False)


def test_default_full_job_reports_the_first_study_and_the_re_test(tmp_path, monkeypatch):
    """The default job's full run reports both records, each figure drawn; the quick run the
    first study's alone."""
    report, first, _ = retest_checks.full_job_report(
        experiment, "selective_rope", str(tmp_path), monkeypatch
    )
    names = sorted(os.path.basename(f) for f in report.figures)
    assert names == ["parity.png", "selective_rope_parity_v2.png"]
    quick = experiment.run(str(tmp_path / "quick"), quick=True)
    assert quick.results is first
    assert len(quick.claims) == len(experiment.claims_from_results(first))
    assert [os.path.basename(f) for f in quick.figures] == ["parity.png"]


def fake_run(config, run_dir):
    """Selective solves 1x and 4x (best at the grid's middle rate), RoPE and none sit at chance."""
    del run_dir
    seed, pos = config.seed, config.model.position
    if pos == "selective":
        score = 0.97 - 0.05 * abs(math.log(config.optim.lr / experiment_v2.LRS[1])) + 0.005 * seed
    else:
        score = 0.5 + 0.002 * seed + 0.001 * math.log(config.optim.lr)
    row = {f"validation/len512/{m}": score for m in retest.METRICS}
    for T, m in itertools.product((128, 256, 512), retest.METRICS):
        row[f"test/len{T}/{m}"] = score
    return row | {"checkpoint_step": 500, "diverged": 0.0, "params": 1, "train_length": 128}


def test_v2_claims_derive_from_the_record_after_a_json_round_trip(tmp_path):
    fake = dataclasses.replace(experiment_v2.EXPERIMENT, run=fake_run)
    record = experiment_runner.measure(fake, str(tmp_path))
    assert record["run"] == "full_v2" and len(record["rows"]) == 27
    path = results.save(record, str(tmp_path / "results"))
    assert os.path.exists(path)
    reread = results.load("selective_rope", "full_v2", str(tmp_path / "results"))
    claims = experiment.claims_from_results(reread)  # dispatched by the record's run
    assert len(claims) == len(experiment_v2.CLAIMS) and all(c.n == 3 for c in claims)
    assert [c.holds for c in claims] == [True] * 7
    assert claims[1].metric == "gla/selective/len512/last_quarter"
    assert claims[4].metric == "gla: selective - rope, len512/last_quarter"
    # RoPE and none chose an edge (the highest lr) but are at chance at every lr: excused.
    edges = experiment_runner.edges(reread)
    assert {e["arm"] for e in edges} == {"gla/rope", "gla/none"}
    assert all("at chance" in e["open"] for e in edges)
    assert experiment_runner.choices(reread)["gla/selective"].point == {"lr": experiment_v2.LRS[1]}
    (figure,) = experiment_v2.plot(reread, str(tmp_path))
    assert figure.endswith("parity_v2.png") and os.path.getsize(figure) > 10_000


def test_two_workers_fill_the_cache_that_measure_reads(tmp_path):
    fake = dataclasses.replace(experiment_v2.EXPERIMENT, run=fake_run)
    for worker in (0, 1):
        experiment_cli.fill(fake, str(tmp_path), worker, 2)

    def nothing_left_to_run(config, run_dir):
        raise AssertionError("every run should be cached")

    done = dataclasses.replace(fake, run=nothing_left_to_run)
    assert len(experiment_runner.measure(done, str(tmp_path))["rows"]) == 27


def test_the_smoke_runs_end_to_end_through_the_experiment(tmp_path):
    """One arm, one seed of the smoke experiment through the runner (2 steps, an evaluation
    after each): the row has what the selection and the claims read, at the chosen step."""
    smoke = experiment_v2.SMOKE_EXPERIMENT
    one = dataclasses.replace(smoke, arms=smoke.arms[:1], seeds=(0,), claims=())
    (row,) = experiment_runner.measure(one, str(tmp_path))["rows"]
    assert [e["step"] for e in row["evals"]] == [1, 2]
    chosen = row["evals"][[1, 2].index(row["checkpoint_step"])]
    for T in (16, 64):
        assert row[f"test/len{T}/last_quarter"] == chosen[f"test/len{T}/last_quarter"]
    assert smoke.select_on == "validation/len64/last_quarter" and smoke.select_on in row
    assert row["diverged"] == 0.0 and np.isfinite(row["final_flip_error"])
