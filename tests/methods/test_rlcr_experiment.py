"""RLCR through core.train (warm start, then GRPO) and the experiment's reduced run."""

import dataclasses
import json
import math
import os
from pathlib import Path

import jax
import pytest

import methods
from configs import rlcr as rlcr_config
from core import train
from core.errors import ConfigError
from methods.rlcr import experiment


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
    # The quick run reads the warm start's params from the rlcr arm, the full run from rlvr's.
    setting = dataclasses.replace(experiment.QUICK, size="smoke", rl_steps=1, overrides=())
    kept = []
    for arm in experiment.ARMS:
        config = experiment.arm_config(arm, 0, setting)
        config.warm_start.steps = 2
        config.train.steps = 3
        _, start = experiment.train_policy(config, str(tmp_path / arm), keep_step=2)
        kept.append(start)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), *kept))


@pytest.mark.parametrize("field", [{"arms": ("rlcr", "ppo")}, {"families": ("in_domian",)}])
def test_a_setting_names_known_arms_and_families(field):
    with pytest.raises(ConfigError, match="must be a non-empty subset"):
        dataclasses.replace(experiment.QUICK, **field)


def finite_leaves(tree) -> list[float]:
    if isinstance(tree, dict):
        return [x for v in tree.values() for x in finite_leaves(v)]
    return [tree] if isinstance(tree, float) else []


def test_full_run_numbers_and_notes_are_unchanged_from_the_saved_run():
    # experiment_full.json holds every measurement of the full run: the table, claims and notes
    # derived from them must read as saved (the reduced run's changes leave the full one alone).
    saved = json.loads((Path(experiment.__file__).parent / "experiment_full.json").read_text())
    runs = saved["metrics"]["runs"]
    assert json.dumps(experiment.table(runs)) == json.dumps(saved["metrics"]["table"])
    assert saved["notes"].startswith(experiment.notes(runs))
    measured = [c.measured for c in experiment.claims(runs, quick=False)]
    assert measured == [c["measured"] for c in saved["claims"]]


def test_quick_run_reports_only_what_it_measured():
    # The saved full run cut down to what the quick one measures: no arm, family, probe or
    # vote it did not measure shows up, as NaN or otherwise.
    saved = json.loads((Path(experiment.__file__).parent / "experiment_full.json").read_text())
    runs = {}
    for arm in ("rlcr", "start"):
        runs[arm] = []
        for result in saved["metrics"]["runs"][arm]:
            entry = {k: v for k, v in result["in_domain"].items() if k != "votes"}
            for key in ("scores", "bins"):
                entry[key] = {k: v for k, v in entry[key].items() if k != "probe"}
            runs[arm].append({"in_domain": entry})
    table = experiment.table(runs)
    assert set(table) == {"rlcr", "start"} and set(table["start"]) == {"in_domain"}
    assert "probe" not in table["rlcr"]["in_domain"] and "votes" not in table["rlcr"]["in_domain"]
    assert all(math.isfinite(x) for x in finite_leaves(table))
    text = experiment.notes(runs)
    assert "nan" not in text and "rlvr" not in text and "out_of_domain" not in text
    (claim,) = experiment.claims(runs, quick=True)
    assert (
        claim.measured
        == table["rlcr"]["in_domain"]["verbalized"]["ece"]
        / (table["start"]["in_domain"]["verbalized"]["ece"])
    )


# 75 s on 2 shared cores (load ~6-10; 225 s before the quick run dropped RLVR, out of domain,
# the probe and voting), over the ~45 s a method's default tests may take: run it with -m slow
# (or `python -m launch.reproduce --methods=rlcr --quick`).
@pytest.mark.slow
def test_reduced_rlcr_run_calibrates_the_stated_confidence(tmp_path):
    report = experiment.run(str(tmp_path), quick=True)
    (kept,) = report.claims
    # The claim's margin (experiment.ECE_KEPT) is the assertion; see the module for its basis.
    assert kept.holds, (kept.measured, report.notes)
    table = report.metrics["table"]
    assert set(table) == {"rlcr", "start"}  # one training run: the warm start is read from it
    for arm in ("start", "rlcr"):
        assert set(table[arm]) == {"in_domain"}
        assert table[arm]["in_domain"]["format"] > 0.95  # the warm start taught the format
    assert os.path.getsize(report.figures[0]) > 1000
