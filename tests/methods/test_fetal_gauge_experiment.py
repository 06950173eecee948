"""Fetal-Gauge's experiment: stub runs score as they must, the claims come from a record alone and
each can fail, the committed full run re-derives, and (slow) the quick experiment's claims hold."""

import copy
import os

import pytest

from core import experiment_runner, results
from methods.fetal_gauge import experiment


def test_stub_runs_hit_their_known_scores_on_a_small_benchmark():
    rows = {
        name: experiment.run_stub({"stub": name, "seed": 1, "num_patients": 20})
        for name in experiment.STUBS
    }
    assert rows["oracle"]["test/micro"] == 1.0 and rows["oracle"]["validation/micro"] == 1.0
    assert rows["parse-failure"]["test/micro"] == 0.0
    assert rows["parse-failure"]["test/invalid_rate"] == 1.0
    for name in ("random", "always-a"):  # ~160 questions: a standard error of ~0.035 at chance
        assert rows[name]["test/micro_dev"] < 0.12, (name, rows[name]["test/micro"])
        assert rows[name]["test/invalid_rate"] == 0.0
    # the style and box-bin breakdowns the trained arm's claims read are there
    assert {"test/clinical/PI", "test/phantom/PI", "test/VG_small"} <= set(rows["random"])


def _record(overrides: dict | None = None) -> dict:
    """A full record in the runner's format whose every claim holds, with `overrides`
    {(arm, metric): [three seeds' values]} applied."""
    good = {
        ("stub/oracle", "test/micro"): [1.0] * 3,
        ("stub/parse-failure", "test/micro"): [0.0] * 3,
        ("stub/parse-failure", "test/invalid_rate"): [1.0] * 3,
        ("stub/random", "test/micro_dev"): [0.01, 0.02, 0.005],
        ("stub/random", "test/chance_covered"): [1.0, 0.8, 1.0],
        ("stub/always-a", "test/micro_dev"): [0.01, 0.015, 0.02],
        ("stub/always-a", "test/chance_covered"): [1.0, 1.0, 0.8],
        ("vlm/untrained", "test/micro_dev"): [0.02, 0.01, 0.03],
        ("vlm/untrained", "test/micro"): [0.30, 0.31, 0.28],
        ("vlm/trained", "test/micro"): [0.90, 0.92, 0.91],
        ("vlm/trained", "test/clinical/PI"): [0.97, 0.98, 0.99],
        ("vlm/trained", "test/clinical/VG_large"): [0.95, 0.96, 0.97],
        ("vlm/trained", "test/VG_large_minus_small"): [0.10, 0.12, 0.09],
        ("vlm/trained", "test/VG_medium_minus_small"): [0.05, 0.04, 0.06],
        ("vlm/trained", "test/clinical_minus_phantom"): [0.10, 0.08, 0.12],
    } | (overrides or {})
    rows = {}
    for (arm, metric), values in good.items():
        lrs = (1e-3,) if arm == "vlm/trained" else (None,)
        for lr in lrs:
            for seed, v in enumerate(values):
                row = rows.setdefault((arm, seed), {"arm": arm, "seed": seed})
                row |= {"validation/micro": 0.5, metric: v} | ({"lr": lr} if lr else {})
    arms = {a.name: experiment_runner._arm_settings(a) for a in experiment._arms(False)}
    arms["vlm/trained"]["grid"] = {"lr": [1e-3]}  # one point: no edge to widen
    config = {"quick": False, "seeds": [0, 1, 2], "arm_key": "arm", "select_on":
              "validation/micro", "rule": "max", "at_chance": None, "arms": arms}  # fmt: skip
    return {"method": "fetal_gauge", "run": "full", "config": config, "rows": list(rows.values())}


def test_claims_come_from_the_record_alone_and_each_can_fail():
    claims = experiment.claims_from_results(_record())
    assert len(claims) == len(experiment.EXPERIMENT.claims) and all(c.holds for c in claims)
    breaks = {  # one plausible failure per claim, in the claims' order
        ("stub/oracle", "test/micro"): [1.0, 0.98, 1.0],
        ("stub/parse-failure", "test/micro"): [0.0, 0.2, 0.0],
        ("stub/parse-failure", "test/invalid_rate"): [1.0, 0.8, 1.0],
        ("stub/random", "test/micro_dev"): [0.01, 0.05, 0.005],
        ("stub/random", "test/chance_covered"): [1.0, 0.2, 1.0],
        ("stub/always-a", "test/micro_dev"): [0.2, 0.2, 0.2],  # no shuffling
        ("stub/always-a", "test/chance_covered"): [0.2, 0.0, 0.2],
        ("vlm/untrained", "test/micro_dev"): [0.02, 0.10, 0.03],
        ("vlm/trained", "test/micro"): [0.90, 0.40, 0.91],
        ("vlm/trained", "test/clinical/PI"): [0.97, 0.85, 0.99],
        ("vlm/trained", "test/clinical/VG_large"): [0.95, 0.80, 0.97],
        ("vlm/trained", "test/VG_large_minus_small"): [0.10, 0.0, 0.09],
        ("vlm/trained", "test/VG_medium_minus_small"): [0.05, -0.02, 0.06],
        ("vlm/trained", "test/clinical_minus_phantom"): [0.10, -0.01, 0.12],
    }
    for i, (key, values) in enumerate(breaks.items()):
        broken = experiment.claims_from_results(_record({key: values}))
        assert [c.holds for c in broken] == [j != i for j in range(len(breaks))], key


def test_the_committed_full_run_rederives_its_claims():
    path = results.path("fetal_gauge", "full")
    if not os.path.exists(path):
        pytest.skip("no committed full run yet")
    record = results.load("fetal_gauge", "full")
    claims = experiment.claims_from_results(copy.deepcopy(record))
    assert len(claims) == len(experiment.EXPERIMENT.claims)
    assert {r["seed"] for r in record["rows"]} == set(experiment.SEEDS)


# About 50 s on 2 idle cores (3 seeds of an 80-step VLM beside 12 stub runs), over the ~45 s a
# method's default tests may take: run with -m slow (or launch.reproduce --quick).
@pytest.mark.slow
def test_quick_experiment_claims_hold_and_are_rederived_from_its_results(tmp_path):
    report = experiment.run(str(tmp_path), quick=True)
    failed = [c.to_dict() for c in report.claims if not c.holds]
    assert not failed, failed
    assert len(report.claims) == sum(s.in_quick for s in experiment.EXPERIMENT.claims)
    derived = experiment.claims_from_results(report.results)
    assert [c.to_dict() for c in derived] == [c.to_dict() for c in report.claims]
