"""Think-Then-Embed's experiment: the claims from a record alone (each able to fail), the learning
rate chosen on validation only, the committed full run, the quick experiment (slow)."""

import copy
import math
import os

import pytest

from core import experiment_runner, results
from methods.tte import experiment, experiment_text

BASE = {  # test P@1 per arm where every claim holds (validation mean peaks at lr 3e-3)
    "baseline": dict(compositional=0.02, vqa=0.80, simple=0.02, mean=0.25),
    "tte_t": dict(compositional=0.73, vqa=0.98, simple=0.04, mean=0.70),
    "tte_s": dict(compositional=0.72, vqa=0.98, simple=0.04, mean=0.69),
    "final_only": dict(compositional=0.70, vqa=0.98, simple=0.03, mean=0.66),
    "noisy_0.1": dict(compositional=0.70, vqa=0.95, simple=0.03, mean=0.66),
    "noisy_0.3": dict(compositional=0.68, vqa=0.90, simple=0.03, mean=0.60),
    "noisy_0.5": dict(compositional=0.40, vqa=0.80, simple=0.03, mean=0.45),
    "trace_only": dict(compositional=0.72, vqa=0.98, simple=0.00, mean=0.55),
    "tte_u_mhsa": dict(compositional=0.70, vqa=0.97, simple=0.03, mean=0.67),
    "tte_u_pooler": dict(compositional=0.30, vqa=0.90, simple=0.01, mean=0.40),
}


def _record(breaks: dict | None = None) -> dict:
    rows = []
    for a in experiment.EXPERIMENT.arms:
        arm = a.name
        for lr in a.grid["lr"]:
            for seed in experiment.SEEDS:
                test = BASE[arm] | (breaks or {}).get(arm, {})
                row = {f"test/p1/{k}": v + 0.002 * seed for k, v in test.items()}
                distance = abs(math.log10(lr / 3e-3))  # the validation optimum: the middle
                row["validation/p1/mean"] = BASE[arm]["mean"] - 0.1 * distance + 0.001 * seed
                rows.append({"arm": arm, "lr": lr, "seed": seed, **row})
    return _as_record(experiment.EXPERIMENT, rows)


def _as_record(e: experiment_runner.Experiment, rows: list) -> dict:
    """A full record of `e` holding `rows`, as `experiment_runner.measure` writes one."""
    arms = {a.name: experiment_runner._arm_settings(a) for a in e.arms}
    config = {"quick": False, "seeds": list(e.seeds), "arm_key": "arm", "select_on": e.select_on,
              "rule": "max", "at_chance": None, "arms": arms}  # fmt: skip
    return {"method": "tte", "run": e.run_name(quick=False), "config": config, "rows": rows}


def test_claims_come_from_the_record_alone_and_each_can_fail():
    claims = experiment.claims_from_results(_record())
    assert len(claims) == len(experiment.CLAIMS) and all(c.holds for c in claims)
    breaks = [  # one plausible failure per claim, in the claims' order
        {"baseline": {"compositional": 0.65}},  # the trace helps by less than 0.10
        {"tte_s": {"compositional": 0.01}},  # the reasoner's traces are useless
        {"tte_s": {"compositional": 0.80}},  # the student beats its teacher
        {"baseline": {"vqa": 0.95}},  # VQA needs no trace
        {"baseline": {"simple": 0.06}},  # the trace hurts simple retrieval
        {"final_only": {"mean": 0.75}},  # the answer alone is better
        {"noisy_0.1": {"compositional": 0.01}},  # a little noise ruins the embedder
        {"noisy_0.3": {"compositional": 0.01}},
        {"trace_only": {"mean": 0.68}},  # the trace alone is as good
        {"tte_u_mhsa": {"mean": 0.55}},  # the head falls far behind the separate embedder
        {"tte_u_pooler": {"mean": 0.70}},  # the last-layer pooler is as good
    ]
    assert len(breaks) == len(experiment.CLAIMS)
    for i, b in enumerate(breaks):
        broken = experiment.claims_from_results(_record(b))
        failing = {j for j, c in enumerate(broken) if not c.holds}
        assert failing == {i}, (b, failing)


def test_the_learning_rate_is_chosen_on_validation_not_test():
    record = _record()
    for row in record["rows"]:  # test scores that would favour another learning rate
        row["test/p1/mean"] += 1.0 if row["lr"] < 3e-3 else 0.0
    chosen = experiment_runner.choices(record)
    assert {sel.point["lr"] for sel in chosen.values()} == {3e-3}


TEXT_BASE = {"baseline_text": 0.25, "tte_t_text": 0.70, "tte_lm_text": 0.65}  # every claim holds


def _text_record(breaks: dict | None = None) -> dict:
    rows = []
    for a in experiment_text.EXPERIMENT.arms:
        for lr in a.grid["lr"]:
            for seed in experiment_text.SEEDS:
                test = (breaks or {}).get(a.name, TEXT_BASE[a.name])
                distance = abs(math.log10(lr / 3e-3))
                rows.append({
                    "arm": a.name, "lr": lr, "seed": seed,
                    "test/unseen/p1/mean": test + 0.002 * seed,
                    experiment_text.SELECT_ON: TEXT_BASE[a.name] - 0.1 * distance + 0.001 * seed,
                })  # fmt: skip
    return _as_record(experiment_text.EXPERIMENT, rows)


def test_the_text_part_claims_come_from_its_record_and_each_can_fail():
    claims = experiment.claims_from_results(_text_record())  # dispatched on record["run"]
    assert len(claims) == len(experiment_text.CLAIMS) and all(c.holds for c in claims)
    breaks = [  # one plausible failure per claim, in the claims' order
        {"baseline_text": 0.62},  # the embedder generalised the arithmetic by itself
        {"tte_lm_text": 0.20},  # the LM's wrong answers mislead the embedder below no trace
        {"tte_lm_text": 0.75},  # the LM's traces as good as the teacher's
    ]
    for i, b in enumerate(breaks):
        broken = experiment.claims_from_results(_text_record(b))
        failing = {j for j, c in enumerate(broken) if not c.holds}
        assert failing == {i}, (b, failing)


@pytest.mark.parametrize("part", [experiment, experiment_text], ids=["full", "full_text"])
def test_the_committed_records_rederive_their_claims(part):
    run = part.EXPERIMENT.run_name(quick=False)
    if not os.path.exists(results.path("tte", run)):
        pytest.skip(f"no committed {run} record yet")
    record = results.load("tte", run)
    claims = experiment.claims_from_results(copy.deepcopy(record))  # dispatched on the run
    assert len(claims) == len(part.CLAIMS)
    assert {r["seed"] for r in record["rows"]} == set(part.SEEDS)
    lm_rows = [r for r in record["rows"] if r["arm"] == "tte_lm_text"]
    assert all(0.0 <= r["lm_accuracy/test"] <= 1.0 for r in lm_rows)
    assert bool(lm_rows) == (part is experiment_text)


@pytest.mark.slow
def test_quick_experiment_shows_the_trace_helping_on_compositional_families(tmp_path):
    report = experiment.run(str(tmp_path), quick=True)
    names = [c.text for c in report.claims if not c.holds]
    assert report.claims and not names, names
    derived = experiment.claims_from_results(report.results)
    assert [c.to_dict() for c in derived] == [c.to_dict() for c in report.claims]
