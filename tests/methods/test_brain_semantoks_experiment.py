"""Brain-Semantoks end to end at the smoke size (each arm kind), bad inputs, the claims (from a
record alone, each able to fail), the committed full run, the quick experiment."""

import copy
import os

import pytest

from configs import brain_semantoks as bs_config
from core import experiment_runner, results
from core.errors import ConfigError
from methods import brain_semantoks
from methods.brain_semantoks import experiment, runs


def smoke(kind: str, options: str = ""):
    c = bs_config.get_config(",".join(filter(None, ["size=smoke", options])))
    c.dtype = "float32"
    c.arm_kind = kind
    return c


def test_every_arm_kind_reports_probe_numbers(tmp_path):
    rows = {k: runs.run(smoke(k), str(tmp_path / k)) for k in runs.KINDS}
    for row in rows.values():
        for key in ("test/id/a", "test/id/b", "test/ood/mean", "val/id/a"):
            assert 0.0 <= row[key] <= 1.0
        assert row["test/id/mean"] == pytest.approx((row["test/id/a"] + row["test/id/b"]) / 2)
    # Pretraining logs the collapse diagnostics at every evaluation (smoke: each of 3 steps).
    assert rows["ssl"]["collapse/step"] == [1, 2, 3]
    assert all(v > 0 for v in rows["ssl"]["collapse/effective_rank"])
    # The random-init arm probes the very weights the ssl arm starts from (same seed): the
    # same splits on a different model give different numbers, the same model the same ones.
    assert runs.run(smoke("random_init"), str(tmp_path / "again")) == rows["random_init"]


def test_roi_tokens_pretrain_too(tmp_path):
    row = runs.run(smoke("ssl", "tokens=roi"), str(tmp_path))
    assert 0.0 <= row["test/id/mean"] <= 1.0


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda c: setattr(c.ssl, "ttr_fraction", 1.5), "ttr_fraction"),
        (lambda c: setattr(c.ssl, "masking_frequency", -0.1), "masking_frequency"),
        (lambda c: setattr(c.ssl, "mask_ratio", (0.9, 0.6)), "mask_ratio"),
        (lambda c: setattr(c.data, "subjects", 4), "data.subjects"),
        (lambda c: setattr(c.model, "crop", 1000), "crop"),
        (lambda c: setattr(c.model, "tokens", "voxel"), "tokens"),
        (lambda c: c.model.__setitem__("width", 3), "unknown model fields"),
    ],
)
def test_bad_settings_end_in_one_line_naming_them(change, match):
    c = smoke("ssl")
    change(c)
    with pytest.raises(ConfigError, match=match):
        brain_semantoks.make(c)


def test_bad_options_and_kinds_are_refused():
    with pytest.raises(ConfigError, match="ttr"):
        bs_config.get_config("ttr=sometimes")
    with pytest.raises(ConfigError, match="arm_kind"):
        runs.run(smoke("supervised"), "/nonexistent")


ARM_VALUES = {  # one seed's plausible numbers per arm: A, B, OOD A, OOD B
    "ssl": (0.72, 0.62, 0.66, 0.55),
    "random_init": (0.55, 0.45, 0.52, 0.40),
    "fc": (0.75, 0.36, 0.65, 0.34),
    "no_ttr": (0.70, 0.60, 0.64, 0.53),
    "always_ttr": (0.69, 0.58, 0.63, 0.52),
    "subjects_500": (0.66, 0.55, 0.58, 0.48),
    "subjects_1000": (0.69, 0.59, 0.62, 0.52),
    "subjects_4000": (0.74, 0.64, 0.69, 0.58),
    "low_snr/network": (0.62, 0.52, 0.55, 0.45),
    "low_snr/roi": (0.58, 0.46, 0.52, 0.41),
}


ARMS_KIND = {name: kind for name, (kind, _) in experiment.ARMS.items()}


def _row(arm, seed, overrides):
    a, b, oa, ob = ARM_VALUES[arm]
    m = {"test/id/a": a, "test/id/b": b, "test/ood/a": oa, "test/ood/b": ob}
    m = {k: v + 0.002 * seed for k, v in m.items()} | overrides.get(arm, {})
    m["test/id/mean"] = (m["test/id/a"] + m["test/id/b"]) / 2
    m["test/ood/mean"] = (m["test/ood/a"] + m["test/ood/b"]) / 2
    if ARMS_KIND.get(arm) == "ssl":
        m["collapse/spread_gain"] = overrides.get(arm, {}).get("collapse/spread_gain", 5.0 + seed)
    return {"arm": arm, "seed": seed, **m}


def _record(break_seed1: dict | None = None) -> dict:
    rows = [
        _row(a, s, (break_seed1 or {}) if s == 1 else {}) for a in ARM_VALUES for s in (0, 1, 2)
    ]
    arms = {a.name: experiment_runner._arm_settings(a) for a in experiment.EXPERIMENT.arms}
    config = {"quick": False, "seeds": [0, 1, 2], "arm_key": "arm", "select_on": None,
              "rule": "max", "at_chance": None, "arms": arms}  # fmt: skip
    return {"method": "brain_semantoks", "run": "full", "config": config, "rows": rows}


def test_claims_come_from_the_record_alone_and_each_can_fail():
    claims = experiment.claims_from_results(_record())
    assert len(claims) == len(experiment.EXPERIMENT.claims) and all(c.holds for c in claims)
    breaks = [  # one plausible failure per claim, in the claims' order (on seed 1)
        {"random_init": {"test/id/a": 0.70}},  # pretraining adds little on A
        {"random_init": {"test/id/b": 0.60}},  # nor on B
        {"ssl": {"collapse/spread_gain": 1.0}},  # the teacher never moved
        {"low_snr/roi": {"test/id/a": 0.66, "test/id/b": 0.54}},  # ROI tokens as good
        {"no_ttr": {"test/id/a": 0.76, "test/id/b": 0.66}},  # TTR hurts
        {"always_ttr": {"test/id/a": 0.76, "test/id/b": 0.66}},  # TTR always is better
        {"subjects_4000": {"test/ood/a": 0.5, "test/ood/b": 0.4}},  # more data, worse
        {"subjects_500": {"test/ood/a": 0.7, "test/ood/b": 0.6}},  # small cohort suffices
        {"fc": {"test/id/b": 0.62}},  # FC reads phenotype B too
        {"fc": {"test/id/a": 0.6}},  # FC weak on A
        {"fc": {"test/id/a": 0.95}},  # FC at ceiling on A
    ]
    also = {7: {6}}  # a strong 500-subject cohort fails both scaling claims by construction
    for i, b in enumerate(breaks):
        broken = experiment.claims_from_results(_record(b))
        failing = {j for j, c in enumerate(broken) if not c.holds}
        assert failing == {i} | also.get(i, set()), (b, failing)


def test_the_committed_full_run_rederives_its_claims():
    path = results.path("brain_semantoks", "full")
    if not os.path.exists(path):
        pytest.skip("no committed full run yet")
    record = results.load("brain_semantoks", "full")
    claims = experiment.claims_from_results(copy.deepcopy(record))
    assert len(claims) == len(experiment.EXPERIMENT.claims)
    assert {r["seed"] for r in record["rows"]} == set(experiment.SEEDS)


def test_a_step_on_eight_devices_equals_one_device():
    import jax
    import numpy as np

    from core import train

    c = smoke("ssl")

    def losses(n):
        session = train.init(c, brain_semantoks.make(c), devices=jax.devices()[:n])
        return [r["loss"] for r in session.train(3)]

    # The batch is split over devices and the MCR covariance summed across them by XLA: the
    # same sums in another order, float32 (1e-4 over three steps of a loss of magnitude ~2).
    np.testing.assert_allclose(losses(8), losses(1), rtol=1e-4)


@pytest.mark.slow
def test_quick_experiment_runs_and_its_claims_are_rederived_from_its_results(tmp_path):
    report = experiment.run(str(tmp_path), quick=True)
    assert len(report.claims) == sum(s.in_quick for s in experiment.EXPERIMENT.claims)
    rows = report.results["rows"]
    assert {(r["arm"], r["seed"]) for r in rows} == {
        (a, s) for a in ("ssl", "random_init") for s in experiment.SEEDS
    }
    assert all(0 <= r["test/id/mean"] <= 1 for r in rows)
    derived = experiment.claims_from_results(report.results)
    assert [c.to_dict() for c in derived] == [c.to_dict() for c in report.claims]
