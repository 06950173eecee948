"""DOIT's experiment: claims from a results record, and the quick run (slow)."""

import pytest

from methods.doit import experiment, runs


def record(doit_shift: float) -> dict:
    """Five seeds; every arm at log10 loss -2 (+ a seed jitter), DOIT shifted by `doit_shift`."""
    arms = ("doit", "random", "periodic", *runs.SINGLES)
    rows = [
        {"task": "rosenbrock", "arm": arm, "seed": seed,
         "log10_loss": -2.0 + 0.01 * seed + (doit_shift if arm == "doit" else 0.0)}
        for arm in arms
        for seed in range(5)
    ]  # fmt: skip
    settings = {"tasks": ["rosenbrock"], "seeds": list(range(5)), "cycles": 4, "hybrids": False}
    return {"rows": rows, "config": {"settings": settings, "margin": 0.3}}


@pytest.mark.parametrize(("shift", "hold"), [(-1.0, True), (0.2, True), (0.5, False)])
def test_claims_hold_within_the_margin_and_fail_beyond_it(shift, hold):
    claims = experiment.claims_from_results(record(shift))
    assert len(claims) == 3
    assert [c.holds for c in claims] == [hold] * 3


@pytest.mark.slow
def test_quick_experiment_doit_no_worse_than_the_median_single_optimizer(tmp_path):
    report = experiment.run(str(tmp_path), quick=True)
    assert experiment.quick_check(report.results)
    assert {r["arm"] for r in report.results["rows"]} >= {"doit", "random", "periodic"}
    # "chosen" holds indices into the runner's pool: the record must name them in that order.
    runner_pool = list(runs.task_config("rosenbrock", 4).doit.pool)
    assert report.results["config"]["pool"] == runner_pool
