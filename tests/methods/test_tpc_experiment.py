"""TPC's experiment (methods/tpc/experiment.py, report.py): the claims read from a planted
results record, the cascade's tau, and (slow) the quick experiment end to end."""

import numpy as np
import pytest

from methods.tpc import experiment
from methods.tpc import report as tpc_report


def _record(mid_gap=0.03, cascade_gap=-0.002, cost=0.2, mlp_gap=0.0, order2_gap=0.05):
    """A results record of one dataset, 3 seeds, with the claims' per-seed gaps planted (the
    seeds spread by +-0.002 around them)."""
    rows = []
    for seed, jitter in zip((0, 1, 2), (-0.002, 0.0, 0.002), strict=True):
        lin = 0.9 + jitter
        o2 = lin + order2_gap
        prog = [lin, o2, 0.95 + jitter, 0.95 + jitter, 0.96 + jitter]
        joint_all = [lin, *(np.array(prog[1:-1]) - mid_gap), prog[-1]]
        where = {"dataset": "digits", "seed": seed}
        rows += [
            {**where, "arm": "linear", "val_f1": [lin], "test_f1": [lin]},
            {**where, "arm": "progressive", "val_f1": prog, "test_f1": prog},
            {**where, "arm": "joint_all", "val_f1": joint_all, "test_f1": joint_all},
            {**where, "arm": "mlp@N", "val_f1": [0.9], "test_f1": [prog[-1] + mlp_gap]},
            {**where, "arm": "mlp@2", "val_f1": [0.9], "test_f1": [o2]},
            {
                **where,
                "arm": "cascade",
                "tau": 0.9,
                "val_f1": [0.9],
                "test_f1": [prog[-1] + cascade_gap],
                "cost_fraction": cost + jitter,
                "mean_params": 100.0,
                "mean_exit_order": 1.5,
                "exit_fraction": [0.5, 0.3, 0.1, 0.05, 0.05],
                "curve": [[t, 0.9, 100.0] for t in experiment.TAUS],
            },
        ]
    info = {"D": 64, "layer": None, "counts": [65, 1105, 2145, 3185, 4225]}
    info |= {"mlp_hidden": {"mlp@2": 17, "mlp@N": 64}, "mlp_params": {"mlp@2": 1123, "mlp@N": 4225}}
    return {
        "config": {"datasets": ["digits"], "open_edges": []},
        "rows": rows,
        "datasets": {"digits": info},
        "selections": [],
        "edges": [],
    }


def _holds(record) -> list[bool]:
    return [c.holds for c in experiment.claims_from_results(record)]


def test_claims_from_results_fail_when_a_gap_crosses_its_margin(tmp_path):
    """Each claim reads its own arms and holds or fails with its planted gap (pairing by seed,
    the margins' signs, the orders 2..N-1 slice, the cost bound), and the README's table and
    figure come from the record alone."""
    assert _holds(_record()) == [True] * 5
    assert _holds(_record(mid_gap=-0.02)) == [False, True, True, True, True]
    assert _holds(_record(cascade_gap=-0.02)) == [True, False, True, True, True]
    assert _holds(_record(cost=0.6)) == [True, True, False, True, True]
    assert _holds(_record(mlp_gap=0.02)) == [True, True, True, False, True]
    assert _holds(_record(order2_gap=0.01)) == [True, True, True, True, False]
    assert all(c.n == 3 for c in experiment.claims_from_results(_record()))
    text = tpc_report.table(_record())
    assert "| progressive - joint_all, orders 2..N-1 | +0.030" in text
    tpc_report.plot(_record(), str(tmp_path / "f.png"))
    assert (tmp_path / "f.png").stat().st_size > 0


def _quick(record, **test_f1):
    """The record as a quick run's, with the named arms' test F1 rows replaced per seed by
    `fn(row's test F1)`."""
    for row in record["rows"]:
        if row["arm"] in test_f1:
            row["test_f1"] = test_f1[row["arm"]](row["test_f1"])
    record["config"]["quick"] = True
    return record


def test_quick_checks_hold_for_a_working_pipeline_and_fail_for_broken_ones():
    """The quick run's smoke checks (truncations and cascade far above chance, the cascade's
    cost, joint_all no worse than the MLP, progressive's higher orders above its frozen order
    1): each fails for the break it guards against, and the full claims are not read."""
    assert _holds(_quick(_record())) == [True] * 5
    claims = experiment.claims_from_results(_quick(_record()))
    assert [c.text.startswith("smoke:") for c in claims] == [True, True, False, True, True]
    assert all(c.n == 3 for c in claims)
    chance = experiment.CHANCE_F1["digits"]
    at_chance = lambda f1: [chance] * len(f1)  # e.g. shuffled labels: every arm at chance
    broken = {a: at_chance for a in ("linear", "progressive", "joint_all", "mlp@N", "cascade")}
    assert _holds(_quick(_record(), **broken)) == [False, False, True, True, False]
    # One truncation of one arm near chance: the check reads every order 2..N-1 of both arms.
    one_low = lambda f1: [*f1[:2], chance + 0.1, *f1[3:]]
    assert _holds(_quick(_record(), joint_all=one_low)) == [False, True, True, True, True]
    assert _holds(_quick(_record(cost=0.6))) == [True, True, False, True, True]
    assert _holds(_quick(_record(mlp_gap=0.02))) == [True, True, True, False, True]
    # Progressive's higher orders never trained: every order equals its frozen order 1.
    untrained = lambda f1: [f1[0]] * len(f1)
    assert _holds(_quick(_record(), progressive=untrained)) == [True, True, True, True, False]
    # The check reads order N, not an earlier order (order 2 here still above the probe).
    last_untrained = lambda f1: [*f1[:-1], f1[0]]
    assert _holds(_quick(_record(), progressive=last_untrained)) == [True, True, True, True, False]


def test_chance_f1_is_the_all_positive_predictor_on_every_quick_seed():
    """CHANCE_F1 is F1 of predicting "positive" on every test row, 2p / (1 + p), per seed."""
    from methods.tpc import data

    for seed in (0, 1, 2):
        p = float(np.mean(data.load("digits", seed=seed).y_test))
        # 5e-4: the constant is written to three decimals.
        assert abs(2 * p / (1 + p) - experiment.CHANCE_F1["digits"]) < 5e-4, seed


def test_cascade_tau_is_below_one_and_chosen_on_validation():
    """The cheapest tau within the validation tolerance of the full order; when no tau is
    within it, the best validation F1 (never tau = 1, at which the cascade is the full order
    by construction)."""
    counts = np.array([10, 20, 30])
    y = np.array([1, 0] * 50)
    sign = np.where(y == 1, 1.0, -1.0)
    # Order 1 confident and right on every row: the loosest tau already matches the full order.
    Y = np.stack([3.0 * sign, 3.0 * sign, 3.0 * sign], 1)
    tau, edges = experiment.choose_tau(Y, y, counts)
    assert tau == experiment.TAUS[0] and edges["tau"] == "low"
    # Order 1 confident and wrong on a fifth of the rows, unsure elsewhere; the full order
    # right everywhere: only taus past order 1's confidence (sigmoid(2) = .88) qualify.
    wrong = np.arange(100) % 5 == 0
    Y1 = np.where(wrong, -2.0 * sign, 0.1 * sign)
    Y = np.stack([Y1, Y1 + 0.2 * sign, 5.0 * sign], 1)
    tau, _ = experiment.choose_tau(Y, y, counts)
    assert tau == 0.9  # the cheapest tau above .88
    assert max(experiment.TAUS) < 1.0


# The quick run trains 9 runs (3 seeds x progressive, joint_all, the MLP matched at order N):
# about 32 CPU-seconds, mostly tracing; slow-marked (the default suite checks the claims'
# logic on a planted record above).
@pytest.mark.slow
def test_quick_experiment(tmp_path):
    """Digits, 3 seeds, 5 epochs per order, one grid point: the whole protocol end to end.
    Measured (test F1, seeds 0 / 1 / 2): linear .905 / .911 / .919, progressive order 5
    .919 / .923 / .931, joint_all .980 / .965 / .980, MLP .954 / .958 / .967; cascade tau
    .55 / .9 / .55. Asserted: every quick smoke check holds (each fails for a broken pipeline:
    with lr 0 progressive's order N - linear is +.001 [-.002, .004], under its .005; with
    shuffled labels every check fails); every arm has a row per seed; each tau is below 1; the
    saved record re-derives the same claims (what launch.reproduce --from_results does)."""
    from core import results

    report = experiment.run(str(tmp_path), quick=True)
    record = report.results
    assert [c.n for c in report.claims] == [3] * 5
    assert [c.holds for c in report.claims] == [True] * 5, [str(c) for c in report.claims]
    arms = {(r["arm"], r["seed"]) for r in record["rows"]}
    for arm in ("linear", "progressive", "joint_all", "mlp@N", "cascade"):
        assert {(arm, s) for s in (0, 1, 2)} <= arms, arm
    taus = [r["tau"] for r in record["rows"] if r["arm"] == "cascade"]
    assert all(t < 1 for t in taus)
    path = results.save(record, str(tmp_path / "results"))
    again = experiment.claims_from_results(results.load("tpc", "quick", str(tmp_path / "results")))
    assert [c.to_dict() for c in again] == [c.to_dict() for c in report.claims], path
    assert len(report.figures) == 1 and report.figures[0].endswith(".png")
