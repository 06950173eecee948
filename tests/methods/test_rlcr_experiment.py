"""RLCR through core.train (warm start, then GRPO), the experiment's claims and its reduced run."""

import dataclasses
import json
import math
import os

import jax
import numpy as np
import pytest

import methods
from configs import rlcr as rlcr_config
from core import cache, results, train
from core.errors import ConfigError
from launch import reproduce
from methods.rlcr import experiment, report, runs


def test_warm_start_then_grpo_under_a_data_parallel_mesh(tmp_path):
    config = rlcr_config.get_config("mesh=cpu,size=smoke")  # 8 devices, 8 prompts x 4
    config.train.eval_every = -1
    config.train.steps = 3  # warm start 1 step, GRPO 2
    result = train.run(config, methods.make(config), str(tmp_path))
    rows = [r for r in result.history if "branch" in r]
    assert [r["branch"] for r in rows] == [0, 1, 1]
    # The logger leaves out the other branch's (NaN-padded) metrics.
    assert "reward" not in rows[0] and "format_token_prob" in rows[0]
    for r in rows[1:]:
        assert "format_token_prob" not in r
        assert 0 <= r["format_rate"] <= 1 and math.isfinite(r["loss"])
        assert r["num_tokens"] == r["completion_length"] * 8 * 4
    # Each branch has its own optimiser state: the warm start's Adam counted 1 step, GRPO's 2.
    counts = {k: int(s[0].count) for k, s in result.state.opt_state.items()}
    assert counts == {"warm": 1, "rl": 2}, counts


def test_both_arms_run_the_same_warm_start(tmp_path):
    # The warm start's numbers are read from the rlcr arm's run and stand for both arms.
    setting = dataclasses.replace(experiment.QUICK, size="smoke", rl_steps=1, overrides=())
    kept = []
    for arm in experiment.ARMS:
        config = experiment.arm_config(arm, 0, setting)
        config.warm_start.steps = 2
        config.train.steps = 3
        _, start = runs.train_policy(config, str(tmp_path / arm), keep_step=2)
        kept.append(start)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), *kept))


@pytest.mark.parametrize(
    "field, match",
    [
        ({"arms": ("rlcr", "ppo")}, "must be a subset"),
        ({"arms": ("rlvr",)}, "includes rlcr"),
        ({"families": ("in_domian",)}, "must be a non-empty subset"),
        ({"seeds": (0, 1)}, "at least 3 seeds"),
    ],
)
def test_a_setting_names_known_arms_and_families_and_enough_seeds(field, match):
    with pytest.raises(ConfigError, match=match):
        dataclasses.replace(experiment.QUICK, **field)


def test_the_run_cache_is_keyed_by_what_is_measured_and_not_by_the_claims():
    full = experiment.arm_config("rlcr", 0, experiment.FULL)
    fewer = experiment.arm_config("rlcr", 0, dataclasses.replace(experiment.FULL, vote_examples=9))
    assert cache.key(full, "code") != cache.key(fewer, "code")  # no stale numbers
    rlvr = experiment.arm_config("rlvr", 0, experiment.FULL)
    assert full.measure.start and not rlvr.measure.start  # the warm start: once per seed
    assert cache.key(full, "code") != cache.key(rlvr, "code")
    # Training and measuring code keys the cache; editing a claim (experiment.py) retrains nothing.
    assert {"methods/rlcr/runs.py", "methods/rlcr/evaluation.py", "configs/rlcr.py"} <= set(
        runs.SOURCES
    )
    assert "core/grpo.py" in runs.SOURCES and "methods/rlcr/experiment.py" not in runs.SOURCES


# The numbers each claim reads (in domain unless "ood"); every other number of the synthetic
# record is random, so a claim that reads the wrong arm, readout or family gets another value.
CLAIM_INPUTS = {
    ("start", "verbalized_mean/ece"): 0.26,
    ("rlcr", "verbalized_mean/ece"): 0.11,
    ("rlcr", "verbalized/accuracy"): 0.75,
    ("rlvr", "verbalized/accuracy"): 0.74,
    ("rlcr", "verbalized/ece"): 0.03,
    ("rlvr", "verbalized/ece"): 0.30,
    ("rlcr", "verbalized/brier"): 0.125,
    ("rlcr", "ideal/brier"): 0.11,
    ("rlvr", "verbalized/ece", "ood"): 0.45,
    ("rlcr", "verbalized/ece", "ood"): 0.15,
    ("rlcr", "verbalized/auroc"): 0.80,
    ("rlvr", "verbalized/auroc"): 0.50,
    ("rlcr", "votes/weighted"): 0.76,
    ("rlcr", "votes/majority"): 0.75,
}
# Each claim's interval mean from CLAIM_INPUTS, in claims_from_results' order (a claim on one
# arm's value gets the mean offset 0.001; the ratio claim is a mean of per-seed ratios).
EXPECTED_MEANS = [0.15, 0.01, -0.01, 0.031, 0.015, 0.0, 0.30, 0.30, 0.01]
EXPECTED_MEANS[5] = float(np.mean([(0.03 + 0.001 * s) / (0.30 + 0.001 * s) for s in range(3)]))
KEYS = [f"{r}/{s}" for r in report.READOUTS for s in report.SCORES]
KEYS += [f"votes/{k}" for k in report.VOTES] + ["bayes/accuracy", "bayes/brier"]


def synthetic_record(
    arms=("start", "rlvr", "rlcr"), families=("in_domain", "out_of_domain"), set_to=None
):
    """Three seeds; a number of CLAIM_INPUTS (or of `set_to`) is its value plus 0.001 x seed on
    every arm, so each paired difference is the same on every seed."""
    rng = np.random.default_rng(0)
    inputs = {**CLAIM_INPUTS, **(set_to or {})}
    rows = []
    for seed in (0, 1, 2):
        for arm in arms:
            for family in families:
                row = {"seed": seed, "arm": arm, "family": family, "format": 1.0, "mean_q": 0.5}
                for key in KEYS:
                    where = (arm, key) if family == "in_domain" else (arm, key, "ood")
                    value = inputs.get(where, float(rng.uniform(0.2, 0.9)))
                    row[key] = value + 0.001 * seed
                rows.append(row)
    setting = experiment.FULL if "rlvr" in arms else experiment.QUICK
    config = dataclasses.asdict(setting)
    return {"method": "rlcr", "run": setting.name, "config": config, "rows": rows}


def test_claims_read_their_arm_readout_and_family_and_can_fail():
    claims = experiment.claims_from_results(synthetic_record())
    np.testing.assert_allclose(  # float sums: ~1e-16
        [c.interval.mean for c in claims], EXPECTED_MEANS, atol=1e-12
    )
    assert all(c.holds and c.n == 3 for c in claims)
    # Each claim fails when its own input moves past its margin.
    for index, change in [
        (0, {("rlcr", "verbalized_mean/ece"): 0.17}),  # ECE drop 0.09 < 0.1
        (1, {("rlcr", "verbalized/accuracy"): 0.715}),  # 2.5 points below RLVR
        (2, {("rlcr", "verbalized/accuracy"): 0.765}),  # 2.5 points above
        (3, {("rlcr", "verbalized/ece"): 0.06}),
        (4, {("rlcr", "ideal/brier"): 0.1}),  # 0.025 above the floor
        (5, {("rlvr", "verbalized/ece"): 0.08}),  # ratio 0.375
        (6, {("rlcr", "verbalized/ece", "ood"): 0.45}),  # a tie out of domain
        (7, {("rlcr", "verbalized/auroc"): 0.59}),  # RLVR's "AUROC ~ 0.5" alone is not enough
        (8, {("rlcr", "votes/weighted"): 0.75}),  # a tie with majority voting
    ]:
        failed = experiment.claims_from_results(synthetic_record(set_to=change))
        assert [c.holds for c in failed] == [i != index for i in range(9)], (index, change)


def test_one_seed_short_of_the_margin_fails_a_claim_its_mean_clears():
    record = synthetic_record()
    for row in record["rows"]:  # seed 2's RLCR ECE 0.07: the mean 0.043 is below 0.05
        if row["arm"] == "rlcr" and row["family"] == "in_domain" and row["seed"] == 2:
            row["verbalized/ece"] = 0.07
    calibrated = experiment.claims_from_results(record)[3]
    assert calibrated.interval.mean < experiment.ECE_TARGET and not calibrated.holds


def test_the_quick_record_gives_claim_1_alone_at_its_own_margin():
    record = synthetic_record(arms=("start", "rlcr"), families=("in_domain",))
    (claim,) = experiment.claims_from_results(record)
    assert claim.margin == experiment.QUICK.ece_drop < experiment.FULL.ece_drop == 0.1
    np.testing.assert_allclose(claim.interval.mean, 0.15, atol=1e-12)
    text = report.notes(record)
    assert "rlvr" not in text and "out_of_domain" not in text and "nan" not in text
    assert set(report.table(record)) == {"start", "rlcr"}


def test_notes_give_an_interval_for_every_measured_number():
    text = report.notes(synthetic_record())
    # start, rlvr, rlcr x 2 families x 5 readouts, then 3 x 2 voting rows
    cells = sum(line.count(" [") for line in text.splitlines() if line.startswith("|"))
    assert text.count("| verbalized_mean |") == 6 and cells == 30 * 4 + 6 * 4
    assert "nan" not in text


COMMITTED = results.path("rlcr", "full")


@pytest.mark.skipif(not os.path.exists(COMMITTED), reason="no committed full run yet")
def test_committed_full_run_rederives_its_claims_on_three_seeds(tmp_path, monkeypatch):
    record = results.load("rlcr", "full")
    assert sorted({r["seed"] for r in record["rows"]}) == list(experiment.FULL.seeds)
    assert {(r["arm"], r["family"]) for r in record["rows"]} == {
        (a, f) for a in ("start", *experiment.ARMS) for f in ("in_domain", "out_of_domain")
    }
    assert record["config"] == json_safe(dataclasses.asdict(experiment.FULL))
    monkeypatch.setattr(runs, "train_and_evaluate", fail_if_trained)
    (report,) = reproduce.reproduce(["rlcr"], str(tmp_path), False, from_results=True)
    assert len(report.claims) == 9 and all(c.n == 3 for c in report.claims)


def json_safe(value):
    return json.loads(json.dumps(value))


def fail_if_trained(*args, **kwargs):
    raise AssertionError("trained although the results file had the run")


# 3 seeds of 40 GRPO steps: ~160 s on 2 shared cores (load ~9), over the ~45 s a method's default
# tests may take: run it with -m slow (or `python -m launch.reproduce --methods=rlcr --quick`).
@pytest.mark.slow
def test_reduced_rlcr_run_calibrates_the_stated_confidence(tmp_path):
    report = experiment.run(str(tmp_path), quick=True)
    (drop,) = report.claims
    # The claim's margin (QUICK.ece_drop) is the assertion; see experiment.QUICK for its basis.
    assert drop.holds and drop.n == 3, (drop.interval, report.notes)
    assert experiment.claims_from_results(report.results)[0].to_dict() == drop.to_dict()
    table = report.metrics["table"]
    assert set(table) == {"rlcr", "start"}  # one training run per seed: the start is read from it
    for arm in ("start", "rlcr"):
        assert set(table[arm]) == {"in_domain"}
        assert table[arm]["in_domain"]["format"] > 0.95  # the warm start taught the format
    assert os.path.getsize(report.figures[0]) > 1000
