"""VideoZoomer end to end at the smoke size (both stages, the shared cold start), bad inputs, the
claims (from a record alone, each able to fail), the committed full run, the quick experiment."""

import copy
import os

import pytest

from configs import videozoomer as vz_config
from core import cache, experiment_runner, results, train
from core.errors import ConfigError
from methods import videozoomer
from methods.videozoomer import experiment, runs


def smoke(arm: str):
    c = vz_config.get_config(f"size=smoke,arm={arm}")
    c.dtype = "float32"
    return c


def test_an_arm_trains_both_stages_and_reports_its_episodes(tmp_path):
    summary = runs.train_and_evaluate(smoke("full"), str(tmp_path), "code")
    for kind in ("needle", "count", "order"):
        assert 0 <= summary[f"{kind}/accuracy"] <= 1
        assert 0 < summary[f"{kind}/glance"] <= 1  # the reader guesses at least
    assert summary["frames"] >= summary["frames/glance"] == 32
    assert summary["frames/uniform_2x"] == 2 * summary["frames/uniform_eq"]
    assert len(summary["examples"]) == runs.EXAMPLES and "gold A" in summary["examples"][0]
    # The cold start ran in its own workdir, the RL stage started from it.
    (cold,) = os.listdir(tmp_path / "cold_start")
    (rl,) = os.listdir(tmp_path / "rl")
    assert runs.rl_config(smoke("full"), "x").train.steps == 1  # the smoke size's RL steps
    assert os.path.exists(tmp_path / "rl" / rl / "metrics.jsonl") and cold


def test_arms_share_a_cold_start_exactly_where_the_paper_does():
    key = {arm: cache.key(runs.sft_config(smoke(arm)), "code") for arm in vz_config.ARMS}
    assert key["full"] == key["no_bonus"] == key["sft_only"]
    assert key["no_reflection"] != key["full"]
    assert smoke("no_cold_start").sft.steps == 0


def test_bad_settings_end_in_one_line_naming_them():
    with pytest.raises(ConfigError, match="arm"):
        vz_config.get_config("arm=everything")
    c = smoke("full")
    c.sft.steps = c.train.steps + 1
    with pytest.raises(ConfigError, match="sft.steps"):
        videozoomer.make(c)
    c = smoke("full")
    c.sft.reflection = 1.5
    with pytest.raises(ConfigError, match="reflection"):
        videozoomer.make(c)
    c = smoke("full")
    c.rewards.tool_bonus = -0.1
    with pytest.raises(ConfigError, match="rewards"):
        videozoomer.make(c)
    c = smoke("full")
    c.grpo.group_size = 1
    with pytest.raises(ConfigError, match="group_size"):
        train.plan(c, videozoomer.make(c))


ARM_VALUES = {  # one seed's plausible numbers per arm: needle, count, order, zooms, zoomed
    "full": (0.9, 0.8, 0.85, 1.5, 1.0),
    "sft_only": (0.7, 0.6, 0.6, 1.6, 1.0),
    "no_cold_start": (0.2, 0.2, 0.2, 0.0, 0.0),
    "no_reflection": (0.6, 0.5, 0.5, 1.0, 1.0),
    "no_bonus": (0.85, 0.75, 0.8, 0.3, 0.3),
    "glance_only": (0.35, 0.2, 0.3, 0.0, 0.0),
    "uniform_eq": (0.6, 0.2, 0.45, 0.0, 0.0),
    "uniform_2x": (0.85, 0.3, 0.65, 0.0, 0.0),
}


def _row(arm, seed, **overrides):
    needle, count, order, zooms, zoomed = ARM_VALUES[arm]
    m = {"test/needle/accuracy": needle, "test/count/accuracy": count,
         "test/order/accuracy": order, "test/zooms": zooms, "test/zoomed": zoomed}  # fmt: skip
    m = {k: v + 0.01 * seed for k, v in m.items()} | overrides.get(arm, {})
    m["test/accuracy"] = sum(m[f"test/{k}/accuracy"] for k in ("needle", "count", "order")) / 3
    return {"arm": arm, "seed": seed, **m}


def _record(break_seed1: dict | None = None) -> dict:
    rows = [
        _row(a, s, **(break_seed1 or {}) if s == 1 else {}) for a in ARM_VALUES for s in (0, 1, 2)
    ]  # noqa: E501
    arms = {a.name: experiment_runner._arm_settings(a) for a in experiment.EXPERIMENT.arms}
    config = {"quick": False, "seeds": [0, 1, 2], "arm_key": "arm", "select_on": None,
              "rule": "max", "at_chance": None, "arms": arms}  # fmt: skip
    return {"method": "videozoomer", "run": "full", "config": config, "rows": rows}


def test_claims_come_from_the_record_alone_and_each_can_fail():
    claims = experiment.claims_from_results(_record())
    assert len(claims) == len(experiment.EXPERIMENT.claims) and all(c.holds for c in claims)
    breaks = [  # one plausible failure per claim, in the claims' order (on seed 1)
        {"glance_only": {"test/needle/accuracy": 0.85}},  # the glance finds the needle
        {"full": {"test/count/accuracy": 0.3}},  # the agent cannot count either
        {"uniform_eq": {f"test/{k}/accuracy": 1.0 for k in ("needle", "count", "order")}},
        {"sft_only": {"test/order/accuracy": 1.0, "test/count/accuracy": 0.9}},  # RL adds nothing
        {"no_cold_start": {"test/needle/accuracy": 0.9, "test/order/accuracy": 0.9}},
        {"no_reflection": {"test/zooms": 0.2}},  # fewer than one zoom (breaks claim 8 too? no)
        {"no_reflection": {"test/zooms": 2.0}},  # searches without reflection data (and 8)
        {"full": {"test/zooms": 1.05}},  # reflection data changes nothing
        {"no_bonus": {"test/zoomed": 1.0}},  # tool use does not collapse
    ]
    also = {6: {7}}  # no_reflection's 2 zooms also beats full's: claim 8 fails by construction
    for i, b in enumerate(breaks):
        broken = experiment.claims_from_results(_record(b))
        failing = {j for j, c in enumerate(broken) if not c.holds}
        assert failing == {i} | also.get(i, set()), (b, failing)


def test_the_committed_full_run_rederives_its_claims():
    path = results.path("videozoomer", "full")
    if not os.path.exists(path):
        pytest.skip("no committed full run yet")
    record = results.load("videozoomer", "full")
    claims = experiment.claims_from_results(copy.deepcopy(record))
    assert len(claims) == len(experiment.EXPERIMENT.claims)
    assert {r["seed"] for r in record["rows"]} == set(experiment.SEEDS)


@pytest.mark.slow
def test_quick_experiment_claims_hold_and_are_rederived_from_its_results(tmp_path):
    report = experiment.run(str(tmp_path), quick=True)
    failed = [c.to_dict() for c in report.claims if not c.holds]
    assert not failed, failed
    assert len(report.claims) == sum(s.in_quick for s in experiment.EXPERIMENT.claims)
    derived = experiment.claims_from_results(report.results)
    assert [c.to_dict() for c in derived] == [c.to_dict() for c in report.claims]
