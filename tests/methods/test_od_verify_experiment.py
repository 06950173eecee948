"""ODPV end to end on a smoke-size detector (one scene), the claims (from a record alone, each
able to fail), the committed full run, the quick experiment (slow)."""

import copy
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ml_collections import ConfigDict

import methods.od_verify as odv
from configs import od_verify as od_config
from core import experiment_runner, results
from core.errors import ConfigError
from methods.od_verify import baselines, boxes, experiment, runs, verify


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    """A detector trained at the quick size for 150 steps (good enough to find objects: the
    verifier's paths need detections), and the test scenes."""
    c = od_config.get_config("size=quick")
    c.train.steps = 150
    c.train.checkpoint_every = 150
    params = odv.train_detector(c, str(tmp_path_factory.mktemp("odv") / "detector"))
    scenes = odv.eval_scenes(c, "test")
    return c, runs.forwarder(params, c), scenes


def test_one_scene_end_to_end_is_sound_at_its_own_level(scene):
    # Every verifier on one scene: the certified bounds are below the IoU at x0 (a point of Z),
    # the refined bound is at least the unrefined one, and no fresh random perturbation falls
    # below the certified bound (the guarantee allows (1 + T) alpha = 10 %; with Z this tight
    # none does). PGD is an IoU the detector really gives, so it is below the IoU at x0.
    c, fwd, scenes = scene
    exp = ConfigDict(experiment.EXP["quick"] | {"rcp_images": 1})
    s = verify.Settings.from_config(c.verify)
    rec = runs.verify_scene(fwd, jnp.asarray(scenes.images_BSS3[0]), scenes.objects(0),
                            2 / 255, jax.random.key(0), s, exp, with_rcp=True,
                            with_coverage=True)  # fmt: skip
    assert rec["objects"] and rec["odpv_samples"] >= s.n1 + s.n2_used
    assert rec["rcp_samples"] == verify.scenario_count(s.alpha, s.beta, 6 * 64)
    assert 0 <= rec["outside"] <= s.alpha
    for o in rec["objects"]:
        assert o["odpv_t0"] <= o["odpv"] <= o["iou_x0"] + 1e-6
        assert o["rcp"] <= o["iou_x0"] + 1e-6
        assert o["pgd"] <= o["iou_x0"] + 1e-6
        assert o["below_bound"] <= (1 + s.refinements) * s.alpha


def test_pgd_finds_no_higher_iou_than_the_clean_image_and_lowers_the_surrogate(scene):
    c, fwd, scenes = scene
    x0 = jnp.asarray(scenes.images_BSS3[0])
    gt, q = scenes.objects(0)[0]
    clean = float(boxes.best_iou(fwd(x0[None])[0], jnp.asarray(gt), q, 0.25, 0.45))
    attacked = baselines.pgd_iou(fwd, x0, gt, q, 8 / 255, jax.random.key(0), steps=20)
    assert attacked <= clean
    assert baselines.pgd_iou(fwd, x0, gt, q, 0.0, jax.random.key(0), steps=5) == pytest.approx(
        clean
    )  # eps = 0: nothing moves


def test_bad_verifier_inputs_end_in_one_line():
    with pytest.raises(ConfigError, match="eps=-0.1"):
        verify.Sampler(lambda x: x, np.zeros((8, 8, 3)), -0.1, jax.random.key(0))
    with pytest.raises(ConfigError, match="verify.n1=0"):
        verify.Settings.from_config({"n1": 0})


def _row(seed, overrides):
    m = {
        "coverage/outside_max": 0.004, "soundness/sampled_below": 0.0,
        "soundness/violations": 0.0, "samples/odpv_ratio": 1.0, "samples/rcp_ratio": 3.9,
        "refine/raised": 0.05, "time/ratio": 4.0, "detector/map50_test": 0.99,
        "gap/odpv_minus_rcp": 0.02,
    }  # fmt: skip
    m = {k: v + 0.001 * seed for k, v in m.items()} | overrides
    return {"arm": "odpv", "seed": seed, **m}


def _record(break_seed1: dict | None = None) -> dict:
    rows = [_row(s, (break_seed1 or {}) if s == 1 else {}) for s in (0, 1, 2)]
    arms = {a.name: experiment_runner._arm_settings(a) for a in experiment.EXPERIMENT.arms}
    config = {"quick": False, "seeds": [0, 1, 2], "arm_key": "arm", "select_on": None,
              "rule": "max", "at_chance": None, "arms": arms}  # fmt: skip
    return {"method": "od_verify", "run": "full", "config": config, "rows": rows}


def test_claims_come_from_the_record_alone_and_each_can_fail():
    claims = experiment.claims_from_results(_record())
    assert len(claims) == len(experiment.EXPERIMENT.claims) and all(c.holds for c in claims)
    breaks = [  # one plausible failure per claim, in the claims' order (on seed 1)
        {"coverage/outside_max": 0.2},  # Z misses outputs: a wrong c1 or a reused sample set
        {"soundness/sampled_below": 0.4},  # the bound certifies more than the samples allow
        {"soundness/violations": 3.0},  # PGD beats the bound
        {"samples/odpv_ratio": 4.0},  # ODPV's count grew with the output
        {"samples/rcp_ratio": 1.0},  # RCP_N's count did not
        {"refine/raised": -0.5},  # refinement never helps
        {"time/ratio": 0.5},  # ODPV slower
        {"detector/map50_test": 0.5},  # a poor detector
        {"gap/odpv_minus_rcp": -0.5},  # RCP_N tighter
    ]
    for i, b in enumerate(breaks):
        broken = experiment.claims_from_results(_record(b))
        failing = {j for j, c in enumerate(broken) if not c.holds}
        assert failing == {i}, (b, failing)


def test_the_committed_full_run_rederives_its_claims():
    path = results.path("od_verify", "full")
    if not os.path.exists(path):
        pytest.skip("no committed full run yet")
    record = results.load("od_verify", "full")
    claims = experiment.claims_from_results(copy.deepcopy(record))
    assert len(claims) == len(experiment.EXPERIMENT.claims)
    assert {r["seed"] for r in record["rows"]} == set(experiment.SEEDS)


@pytest.mark.slow
def test_quick_experiment_runs_and_its_claims_are_rederived_from_its_results(tmp_path):
    report = experiment.run(str(tmp_path), quick=True)
    assert len(report.claims) == sum(s.in_quick for s in experiment.EXPERIMENT.claims)
    assert all(c.holds for c in report.claims)  # coverage and PAC soundness on its objects
    derived = experiment.claims_from_results(report.results)
    assert [c.to_dict() for c in derived] == [c.to_dict() for c in report.claims]


def test_diagnosis_ratios_are_consistent(scene, monkeypatch):
    # sqrt(3) ||g||_1 / ||g||_2 lies in [sqrt(3), sqrt(3 d)]; the measured drop of one signed
    # step is the worst case to first order, so it is positive for a detected object.
    from methods.od_verify import diagnose

    c, fwd, scenes = scene
    monkeypatch.setattr(diagnose, "IMAGES", 2)
    rows = diagnose.object_rows(fwd, scenes)
    assert rows
    d = 64 * 64 * 3
    for r in rows:
        assert np.sqrt(3) - 1e-6 <= r["linear_ratio"] <= np.sqrt(3 * d) + 1e-6
        assert r["signed_step_drop"] > 0 and r["uniform_std"] > 0
