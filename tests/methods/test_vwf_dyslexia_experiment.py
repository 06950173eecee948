"""methods/vwf_dyslexia/experiment and report: the claims derived from a results record
(synthetic rows whose drops are known), the quick smoke checks (synthetic records with each
break), and the quick experiment (slow)."""

import numpy as np
import pytest

from methods.vwf_dyslexia import experiment, report, tasks

SEEDS = (0, 1, 2)


def record(vwf_lexical_drop=0.3, random_lexical_drop=0.02, scale_drop=None) -> dict:
    """A full-run record: intact 0.9 on every task; VWF at k drops lexical decision by
    vwf_lexical_drop * k / 4 (other tasks by 0.01), random masks by random_lexical_drop."""
    s = experiment.FULL
    rows = []

    def row(seed, mask, lexical_drop, other_drop=0.01):
        wiggle = 0.01 * seed * (mask != "intact")  # seeds differ: intervals have width
        acc = {t: 0.9 - other_drop for t in tasks.TASKS}
        acc["lexical"] = 0.9 - lexical_drop - wiggle
        rows.append({"seed": seed, "mask": mask, **acc})

    for seed in SEEDS:
        row(seed, "intact", 0.0, 0.0)
        for k in s.percents:
            row(seed, experiment.name("vwf", k), vwf_lexical_drop * k / 4)
            row(seed, experiment.name("vwf_per_layer", k), vwf_lexical_drop * k / 8)
            for d in range(s.random_masks):
                row(seed, experiment.name("random", k, d), random_lexical_drop + 0.001 * d)
        for v in s.scales:
            drop = (scale_drop or {}).get(v, vwf_lexical_drop if v == 0 else 0.0)
            row(seed, experiment.name("scale", v), drop)
    settings = {**experiment.dataclasses.asdict(s), "seeds": list(SEEDS)}
    return {"run": "full", "config": {"settings": settings}, "rows": rows}


def test_claims_hold_on_a_selective_lesion_and_fail_when_it_is_not():
    claims = experiment.claims_from_results(record())
    assert len(claims) == 5 and all(c.holds for c in claims), [c.to_dict() for c in claims]
    # VWF at 4 %: lexical drop 0.3 + 0.01 seed (mean 0.31), the others 0.01: selectivity 0.30
    assert claims[0].interval.mean == pytest.approx(0.30, abs=1e-9)
    # smallest k with lexical < 0.65: 0.9 - 0.3 k / 4 - 0.01 seed < 0.65 -> k = 4 on each seed
    assert report.smallest_k(record(), 0.65) == {0: 4, 1: 4, 2: 4}

    weak = experiment.claims_from_results(record(vwf_lexical_drop=0.05, random_lexical_drop=0.04))
    assert not weak[0].holds and not weak[1].holds  # neither selective nor beyond random
    assert not weak[2].holds and weak[2].interval.mean == report.NOT_REACHED
    # s = -2 as selective as s = 0: "only s = 0" fails
    collapse = experiment.claims_from_results(record(scale_drop={-2: 0.3}))
    assert collapse[0].holds and not collapse[4].holds


def test_random_draws_are_averaged_per_seed():
    means = report.random_mean(record(random_lexical_drop=0.1), 4, lambda d: d["lexical"])
    draws = experiment.FULL.random_masks
    expected = 0.1 + 0.001 * np.mean(range(draws))
    for seed in SEEDS:
        assert means[seed] == pytest.approx(expected + 0.01 * seed, abs=1e-9)


def quick_record(intact=0.5, lesioned=0.42, t_max=12.0) -> dict:
    """A quick-run record: every yes/no task at `intact` (letters 0) intact and at `lesioned`
    with every decoder MLP unit silenced; the localiser's largest t per seed."""
    rows = []
    for seed in SEEDS:
        wiggle = 0.01 * seed  # seeds differ: intervals have width
        for mask, acc in (("intact", intact), ("all", lesioned)):
            yes_no = {t: acc + wiggle for t in report.YES_NO}
            rows.append({"seed": seed, "mask": mask, "letters": 0.0, **yes_no})
    per_seed = {str(seed): {"t_max": t_max + seed} for seed in SEEDS}
    settings = {**experiment.dataclasses.asdict(experiment.QUICK), "seeds": list(SEEDS)}
    return {"run": "quick", "config": {"settings": settings}, "rows": rows, "per_seed": per_seed}


def test_quick_checks_hold_for_a_working_pipeline_and_fail_for_each_break():
    assert all(c.holds for c in experiment.claims_from_results(quick_record()))
    # Each break fails its own check and only that one (the order of report.quick_checks).
    breaks = {
        # (lesioned 0.1 keeps the lesion check passing, so only the first check is tested)
        "untrained: answers neither yes nor no": (quick_record(intact=0.0, lesioned=0.1), 0),
        "localiser without a contrast": (quick_record(t_max=2.0), 1),
        "a lesion that does nothing": (quick_record(lesioned=0.5), 2),
    }
    for what, (rec, failing) in breaks.items():
        holds = [c.holds for c in experiment.claims_from_results(rec)]
        assert holds == [i != failing for i in range(3)], (what, holds)
    # A lesion that raises accuracy changes the answers too: the change is |all - intact|.
    assert experiment.claims_from_results(quick_record(lesioned=0.58))[2].holds


# The quick run cannot assert the paper's claim: at 300 steps its model has learned no task
# (measured 2026-12-04 at load ~4: yes/no tasks 0.41-0.59, the share of one answer; letters 0;
# 77-126 s), and the full run (10000 steps, lexical 0.99) measured the claim false anyway
# (README). It checks the pipeline end to end: the answer format learned, a localiser contrast,
# a lesion that reaches the forward pass, and claims re-derived from the record equal to the
# run's own.
@pytest.mark.slow  # three short trainings, localiser and lesions: 77-144 s on 2 cores at load ~4
def test_quick_experiment_runs_end_to_end_and_its_smoke_checks_hold(tmp_path):
    report = experiment.run(str(tmp_path), quick=True)
    assert len(report.claims) == 3 and all(c.n == 3 for c in report.claims)
    assert all(c.holds for c in report.claims), [c.to_dict() for c in report.claims]
    again = experiment.claims_from_results(report.results)
    assert [c.to_dict() for c in again] == [c.to_dict() for c in report.claims]
    intact = [r for r in report.results["rows"] if r["mask"] == "intact"]
    assert sorted(r["seed"] for r in intact) == [0, 1, 2]


def test_whole_layer_selections_silence_one_layer_each_and_all_of_them():
    layers, width = 3, 5
    out = experiment.whole_layers(layers, width)
    assert list(out) == ["layer/0", "layer/1", "layer/2", "all"]
    for i in range(layers):
        rows_on = out[f"layer/{i}"].all(axis=1)
        assert rows_on.tolist() == [j == i for j in range(layers)]  # a layer, not a unit column
        assert out[f"layer/{i}"].sum() == width
    assert out["all"].all() and out["all"].shape == (layers, width)
