"""Q&C's transform end to end at the smoke size, its BOPs accounting, its claims (from a record
alone, each able to fail), the committed full run, and (slow) the quick experiment."""

import copy
import os

import jax
import numpy as np
import pytest

from configs import quant_cache as qc_config
from core import experiment_runner, results, train
from core.errors import ConfigError
from methods.quant_cache import cost, experiment, make, model_config, pipeline, sampling, schedule
from methods.quant_cache.settings import parse


@pytest.fixture(scope="module")
def smoke_model(tmp_path_factory):
    """A smoke-size model trained for its two steps, and its workdir."""
    workdir = str(tmp_path_factory.mktemp("qc_model"))
    c = qc_config.get_config("size=smoke")
    c.train.checkpoint_every = c.train.steps  # the transform reads the final checkpoint
    result = train.run(c, make(c), workdir, devices=jax.devices()[:1])
    return workdir, result.state.params


def test_transform_runs_every_kind_of_setting_over_init_from(smoke_model, tmp_path):
    workdir, _ = smoke_model
    c = qc_config.get_config("size=smoke,stage=transform,settings=fp/c2/w4a4/w4a4+c2+tap+vc")
    c.train.init_from = workdir
    row = train.run(c, make(c), str(tmp_path / "t"), devices=jax.devices()[:1]).history[-1]
    for name in ("fp", "c2", "w4a4", "w4a4+c2+tap+vc"):
        assert np.isfinite(row[f"eval/{name}/fd"]), name
        assert 0 <= row[f"eval/{name}/accuracy"] <= 1
        assert f"eval/{name}/var/{c.quant_cache.sample_steps}" in row  # steps + 1 values
    assert row["eval/fp/var_dev"] == 0.0
    # Same noise, another model: quantised samples differ from full precision's.
    assert row["eval/w4a4/fd"] != row["eval/fp/fd"]
    assert {"eval/pool/cos_gap", "eval/pool/cos_gap_growth"} <= set(row)


def test_the_transform_refuses_a_run_without_a_model_or_with_a_bad_setting():
    c = qc_config.get_config("size=smoke,stage=transform")
    with pytest.raises(ConfigError, match="init_from"):
        train.plan(c, make(c))
    with pytest.raises(ConfigError, match="w4a9"):
        make(qc_config.get_config("size=smoke,stage=transform,settings=fp/w4a9"))
    with pytest.raises(ConfigError, match="stage"):
        qc_config.get_config("stage=deploy")


def test_bops_accounting(smoke_model):
    _, params = smoke_model
    c = qc_config.get_config("size=smoke")
    cfg, sched = model_config(c), schedule(c)
    macs = sampling.layer_macs(cfg, params, sched)
    assert any(sampling.is_quantized(p) for p in macs) and not all(map(sampling.is_quantized, macs))
    speed = {n: cost.speedup(cfg, macs, parse(n), 50) for n in ("fp", "c2", "c3", "w8a8", "w4a4")}
    assert speed["fp"] == 1.0
    assert 1 < speed["c2"] < 2 and speed["c2"] < speed["c3"] < 3  # replays are not free
    assert 1 < speed["w8a8"] < (32 * 32) / (8 * 8)  # embeddings and final layer stay float
    assert speed["w4a4"] > speed["w8a8"]
    assert cost.speedup(cfg, macs, parse("w4a4+c2"), 50) > speed["w4a4"]


def _row(seed, **overrides):
    fd = {"fp": 4.0, "c2": 4.3, "w4a4": 50.0, "w4a4+c2": 55.0, "w4a4+c2+kmeans": 56.0,
          "w4a4+c2+tap": 53.0, "w4a4+c2+vc": 20.0, "w4a4+c2+tap+vc": 18.0}  # fmt: skip
    m = {f"{k}/fd": v + 0.1 * seed for k, v in fd.items()}
    m |= {"w4a4+c2/var_dev": 0.15, "w4a4+c2+vc/var_dev": 0.03}
    m |= {"pool/cos_gap": 0.01, "pool/cos_gap_growth": 0.02}
    m |= overrides
    return {"arm": "transform", "seed": seed, **m, **pipeline.derived(m)}


def _record(break_seed1: dict | None = None) -> dict:
    rows = [_row(s, **(break_seed1 or {}) if s == 1 else {}) for s in (0, 1, 2)]
    arms = {a.name: experiment_runner._arm_settings(a) for a in experiment.EXPERIMENT.arms}
    config = {"quick": False, "seeds": [0, 1, 2], "arm_key": "arm", "select_on": None,
              "rule": "max", "at_chance": None, "arms": arms}  # fmt: skip
    return {"method": "quant_cache", "run": "full", "config": config, "rows": rows}


def test_claims_come_from_the_record_alone_and_each_can_fail():
    claims = experiment.claims_from_results(_record())
    assert len(claims) == len(experiment.EXPERIMENT.claims) and all(c.holds for c in claims)
    breaks = [  # one plausible failure per claim, in the claims' order (on seed 1)
        {"pool/cos_gap": -0.05},
        {"pool/cos_gap_growth": -0.05},
        {"w4a4/fd": 54.9},  # Q alone almost as bad as Q + C: additive, not superadditive
        {"w4a4+c2+tap+vc/fd": 70.0},  # also breaks "closest to fp" (claim 9)
        {"w4a4+c2+tap/fd": 60.0},  # TAP worse than uniform (and than k-means)
        {"w4a4+c2+kmeans/fd": 40.0},
        {"w4a4+c2+vc/fd": 60.0},
        {"w4a4+c2+vc/var_dev": 0.3},
        {"w4a4+c2+vc/fd": 10.0},  # plain VC closer to fp than TAP + VC
    ]
    also = {3: {8}, 4: {5}}  # breaks that fail a second claim by construction
    for i, b in enumerate(breaks):
        broken = experiment.claims_from_results(_record(b))
        failing = {j for j, c in enumerate(broken) if not c.holds}
        assert failing == {i} | also.get(i, set()), (b, failing)


def test_the_committed_full_run_rederives_its_claims():
    path = results.path("quant_cache", "full")
    if not os.path.exists(path):
        pytest.skip("no committed full run yet")
    record = results.load("quant_cache", "full")
    claims = experiment.claims_from_results(copy.deepcopy(record))
    assert len(claims) == len(experiment.EXPERIMENT.claims)
    assert {r["seed"] for r in record["rows"]} == set(experiment.SEEDS)


# About 40 s on 2 idle cores (a 1,500-step model, then 3 seeds of 5 settings), over the ~45 s a
# method's default tests may take with the rest of them: run with -m slow (or launch.reproduce
# --quick).
@pytest.mark.slow
def test_quick_experiment_claims_hold_and_are_rederived_from_its_results(tmp_path):
    report = experiment.run(str(tmp_path), quick=True)
    failed = [c.to_dict() for c in report.claims if not c.holds]
    assert not failed, failed
    assert len(report.claims) == sum(s.in_quick for s in experiment.EXPERIMENT.claims)
    derived = experiment.claims_from_results(report.results)
    assert [c.to_dict() for c in derived] == [c.to_dict() for c in report.claims]
