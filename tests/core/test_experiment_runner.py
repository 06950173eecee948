"""core.experiment_runner on a fake experiment (no training): validation-only choices, grid-edge
refusals, claims re-derived from the saved record, the run cache, and pairing by seed."""

import json
import math
import random

import pytest

from core import experiment_runner as er
from core.errors import ConfigError
from core.experiment_runner import Arm, ClaimSpec, Experiment

LRS = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)
SEEDS = (0, 1, 2, 3)


def seed_noise(seed: int) -> float:
    """Shared by every arm of a seed (as a seed's data would be), and large next to EFFECT."""
    return 0.3 * ((seed * 7919) % 13) / 13


EFFECT = 0.1  # "better" over "base" on every seed, at every lr


class FakeRuns:
    """A run's metrics: a quadratic in log10(lr) peaking at the arm's validation (test) peak,
    plus the arm's effect and the seed's noise. Counts the runs it computes."""

    def __init__(self):
        self.calls = []

    def __call__(self, config, workdir):
        self.calls.append((config["arm"], config["lr"], config["seed"]))
        x = math.log10(config["lr"])
        base = config["effect"] + seed_noise(config["seed"]) + 0.05 * (config.get("kind") == "b")
        score = lambda peak: 1 - 0.1 * (x - math.log10(peak)) ** 2 + base  # noqa: E731
        return {
            "validation/score": score(config["val_peak"]),
            "test/score": score(config["test_peak"]),
            "test/q": 0.5 if config["quick"] else 0.0,  # a quick run's own metric
        }


def config_of(arm, point, seed, quick):
    return {"arm": arm.name, "seed": seed, "quick": quick, **point, **arm.settings}


def arm(name, *, effect=0.0, val_peak=1e-3, test_peak=1e-2, lrs=LRS, **kw):
    settings = dict(effect=effect, val_peak=val_peak, test_peak=test_peak)
    return Arm(name, grid={"lr": lrs}, settings=settings, **kw)


BEATS = ClaimSpec("beats", "better beats base", "test/score", "better", EFFECT / 2, "base")
AT_LEAST = ClaimSpec(
    "at_least", "base is fine", "test/score", "base", 0.5, quick_margin=0.4, quick_metric="test/q"
)


def experiment(runs, arms=None, claims=(BEATS, AT_LEAST), **kw):
    arms = arms or (arm("better", effect=EFFECT), arm("base"))
    return Experiment(
        slug="toy",
        arms=arms,
        seeds=SEEDS,
        config_of=config_of,
        run=runs,
        claims=claims,
        **{"select_on": "validation/score", **kw},
    )


def round_trip(record):
    return json.loads(json.dumps(record))


def test_choice_is_the_validation_argmax_and_reads_no_test_number(tmp_path):
    record = er.measure(experiment(FakeRuns()), str(tmp_path))
    chosen = er.choices(record)
    # Validation peaks at 1e-3; test at 1e-2, where a choice that read test numbers would go.
    assert {name: sel.point for name, sel in chosen.items()} == {
        "better": {"lr": 1e-3},
        "base": {"lr": 1e-3},
    }
    assert chosen["base"].n == len(SEEDS) and set(chosen["base"].means) == {(lr,) for lr in LRS}
    # Without any test number the choices are the same.
    blind = round_trip(record)
    for row in blind["rows"]:
        del row["test/score"]
    assert er.choices(blind) == chosen
    # The reported numbers are the chosen point's test numbers, seed by seed.
    reported = er.reported(record, "base", "test/score")
    assert reported == {
        r["seed"]: r["test/score"] for r in record["rows"] if (r["arm"], r["lr"]) == ("base", 1e-3)
    }


def test_selection_on_a_test_metric_or_a_grid_without_selection_is_refused():
    with pytest.raises(ConfigError, match="names the test split"):
        experiment(FakeRuns(), select_on="test/score")
    with pytest.raises(ConfigError, match="toy: .*'better' has a grid but no select_on"):
        experiment(FakeRuns(), select_on=None)
    with pytest.raises(ConfigError, match="baseline=None"):
        ClaimSpec("beats", "x", "test/score", "better", 0.1)
    with pytest.raises(ConfigError, match="names no arm 'nobody'"):
        experiment(FakeRuns(), claims=(ClaimSpec("at_most", "x", "test/score", "nobody", 1.0),))


def test_a_run_without_the_selection_metric_or_with_clashing_keys_is_refused(tmp_path):
    renamed = lambda config, workdir: {"validation/other": 1.0}  # noqa: E731
    with pytest.raises(ConfigError, match="toy: toy better lr=0.0001 seed 0 returned no select"):
        er.measure(experiment(renamed), str(tmp_path / "a"))
    clashing = lambda config, workdir: {"validation/score": 1.0, "seed": 7}  # noqa: E731
    with pytest.raises(ConfigError, match=r"toy: run metrics \['seed'\] clash"):
        er.measure(experiment(clashing), str(tmp_path / "b"))


def test_an_edge_choice_stops_the_claims_unless_open_or_at_chance(tmp_path):
    edgy = (arm("better", effect=EFFECT, val_peak=1e-1), arm("base"))  # peak past the grid
    record = er.measure(experiment(FakeRuns(), arms=edgy), str(tmp_path))
    # The record is complete (a caller can save it) and lists the edge; claims refuse it.
    assert len(record["rows"]) == 2 * len(LRS) * len(SEEDS)
    assert record["edges"] == [dict(arm="better", axis="lr", value=1e-2, side="high", open=None)]
    with pytest.raises(ConfigError, match=r"toy: grid not finished.*better: lr=0.01 \(high\)$"):
        er.claims(experiment(FakeRuns(), arms=edgy), round_trip(record))
    # Open with a reason: listed, and the claims go on.
    why = "a higher lr diverges on the real task"
    opened = (arm("better", effect=EFFECT, val_peak=1e-1, open_edges={("lr", "high"): why}),)
    exp = experiment(FakeRuns(), arms=opened + edgy[1:])
    record = er.measure(exp, str(tmp_path))  # every run cached: the grid did not change
    assert record["edges"][0]["open"] == why and len(er.claims(exp, record)) == 2
    # At chance: every point of the arm under `at_chance` (here every point of every arm), a
    # flat grid has no optimum to bracket.
    exp = experiment(FakeRuns(), arms=edgy, at_chance=10.0)
    assert er.measure(exp, str(tmp_path))["edges"][0]["open"].startswith("at chance")
    # Only the low side open: the high edge still stops it.
    low_only = (arm("better", effect=EFFECT, val_peak=1e-1, open_edges={("lr", "low"): why}),)
    exp = experiment(FakeRuns(), arms=low_only + edgy[1:])
    with pytest.raises(ConfigError, match="grid not finished"):
        er.claims(exp, er.measure(exp, str(tmp_path)))


def test_arms_without_a_grid_or_on_a_categorical_axis(tmp_path):
    settings = dict(effect=0.0, val_peak=1e-3, test_peak=1e-2, lr=1e-3)
    arms = (
        arm("better", effect=EFFECT),
        Arm("base", settings=settings),  # one point: {}
        Arm("kinds", grid={"kind": ("a", "b")}, settings=settings),  # no edge to extend
    )
    record = er.measure(experiment(FakeRuns(), arms=arms), str(tmp_path))
    chosen = er.choices(round_trip(record))
    assert [chosen[a].point for a in ("better", "base", "kinds")] == [
        {"lr": 1e-3},
        {},
        {"kind": "b"},
    ]
    assert record["edges"] == [] and len(er.claims(experiment(FakeRuns(), arms=arms), record)) == 2


def test_claims_rederived_from_the_saved_record_equal_the_live_ones(tmp_path):
    exp = experiment(FakeRuns())
    record = er.measure(exp, str(tmp_path))
    live = [c.to_dict() for c in er.claims(exp, record)]
    assert [c["metric"] for c in live] == ["test/score: better - base", "base/test/score"]
    assert [c.to_dict() for c in er.claims(exp, round_trip(record))] == live
    # The record alone says what ran: its grids and seeds, not the experiment's current ones.
    wider = (arm("better", effect=EFFECT, lrs=LRS + (3e-2,)), arm("base"))
    widened = experiment(FakeRuns(), arms=wider)
    assert [c.to_dict() for c in er.claims(widened, round_trip(record))] == live


def test_a_second_measure_recomputes_nothing_and_a_wider_grid_only_its_new_points(tmp_path):
    runs = FakeRuns()
    er.measure(experiment(runs), str(tmp_path))
    assert len(runs.calls) == 2 * len(LRS) * len(SEEDS)
    runs.calls.clear()
    # Same runs, another claim: nothing recomputed.
    er.measure(experiment(runs, claims=(AT_LEAST,)), str(tmp_path))
    assert runs.calls == []
    wider = (arm("better", effect=EFFECT, lrs=LRS + (3e-2,)), arm("base"))
    record = er.measure(experiment(runs, arms=wider), str(tmp_path))
    assert sorted(runs.calls) == [("better", 3e-2, s) for s in SEEDS]
    assert len(record["rows"]) == (2 * len(LRS) + 1) * len(SEEDS)


def test_beats_pairs_by_seed_not_by_row_order(tmp_path):
    exp = experiment(FakeRuns())
    record = er.measure(exp, str(tmp_path))
    (beats, _) = er.claims(exp, record)
    # Paired by seed the seed noise cancels: every difference is EFFECT (float rounding aside),
    # where mis-paired seeds would differ by up to 0.3.
    assert beats.interval.low == pytest.approx(EFFECT) == beats.interval.high
    shuffled = round_trip(record)
    random.Random(0).shuffle(shuffled["rows"])
    assert [c.to_dict() for c in er.claims(exp, shuffled)] == [
        c.to_dict() for c in er.claims(exp, record)
    ]


def test_quick_records_use_quick_margins_and_leave_out_what_did_not_run(tmp_path):
    full_only = ClaimSpec(
        "at_most", "better is capped", "test/score", "better", 9.0, in_quick=False
    )
    exp = experiment(
        FakeRuns(),
        claims=(BEATS, AT_LEAST, full_only),
        quick_arms=(arm("base", lrs=(1e-3, 3e-3)),),  # 2 points: always on an edge
        quick_seeds=(0, 1, 2),
    )
    record = er.measure(exp, str(tmp_path), quick=True)
    assert record["run"] == "quick" and {r["seed"] for r in record["rows"]} == {0, 1, 2}
    assert record["edges"] and record["edges"][0]["open"] is None  # recorded, not refused
    (claim,) = er.claims(exp, round_trip(record))
    assert (claim.text, claim.margin, claim.n) == ("base is fine", 0.4, 3)
    assert (claim.metric, claim.interval.mean) == ("base/test/q", 0.5)
    # A full record missing a claim's arm is an error, not a skipped claim.
    full = er.measure(experiment(FakeRuns()), str(tmp_path))
    del full["config"]["arms"]["better"]
    with pytest.raises(ConfigError, match="no arm 'better'"):
        er.claims(exp, full)


def test_an_older_record_reads_as_the_runner_would_have_written_it(tmp_path):
    exp = experiment(FakeRuns())
    record = er.measure(exp, str(tmp_path))
    older = {"method": "toy", "config": {"quick": False}, "rows": round_trip(record)["rows"]}
    adopted = er.adopt_older(exp, older)
    assert "arms" not in older["config"]  # the record itself is not changed
    assert [c.to_dict() for c in er.claims(exp, adopted)] == [
        c.to_dict() for c in er.claims(exp, record)
    ]
    with pytest.raises(ConfigError, match="toy: results record without config.arms"):
        er.claims(exp, older)
