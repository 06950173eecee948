"""DEQL's v2 protocol (issue 47): 5-fold cross-validation over users (each user tested once),
the claims from a record alone and paired by user, the released grids, the pilot's margins,
and v1's claims re-derived from results/full_v1.json."""

import json

import numpy as np
import pytest

from core import results
from core.errors import ConfigError
from methods import deql
from methods.deql import crossval, data, experiment, pilot, report


def _ml100k():
    try:
        return data.load_ml100k().matrix
    except data.DataError as e:
        pytest.skip(f"ML-100k unavailable: {e}")


def test_folds_test_each_user_once_and_seeded_splits_do_not():
    X = deql.synthetic_interactions(200, 50, seed=2)
    eligible = np.flatnonzero(np.diff(X.indptr) >= 2)
    folds = [data.fold_split(X, fold=f, folds=5, n_val=20, seed=0).test_users for f in range(5)]
    data.require_tested_once(folds, eligible)
    seeded = [data.strong_split(X, n_val=20, n_test=20, seed=s).test_users for s in range(10)]
    with pytest.raises(data.DataError, match="tested more than once"):
        data.require_tested_once(seeded, eligible)
    with pytest.raises(data.DataError, match="never tested"):
        data.require_tested_once(folds[:4], eligible)


def test_deqls_folds_test_each_user_once():
    """The full run's folds (what `crossval.measure` scores) test each of the 942 users once;
    v1's 10 seeded splits (100 test users each, seeds 0-9) test some users several times."""
    X = _ml100k()
    s = experiment.FULL
    tested = [crossval.split_of(s, X, fold).test_users for fold in s.run_folds]
    data.require_tested_once(tested, np.arange(X.shape[0]))
    v1 = [data.strong_split(X, n_val=100, n_test=100, seed=k).test_users for k in range(10)]
    with pytest.raises(data.DataError, match="tested more than once"):
        data.require_tested_once(v1, np.arange(X.shape[0]))


def test_validation_users_are_disjoint_from_test_and_fitted_users():
    X = deql.synthetic_interactions(200, 50, seed=2)
    n = X.shape[0]
    for fold in range(5):
        s = data.fold_split(X, fold=fold, folds=5, n_val=30, seed=0)
        fitted = np.setdiff1d(np.arange(n), np.concatenate([s.val_users, s.test_users]))
        assert len(s.val_users) == 30 and not set(s.val_users) & set(s.test_users)
        # The fitted matrix is exactly the other users' rows (on the items they have).
        np.testing.assert_array_equal(s.train.toarray(), X[fitted][:, s.items].toarray())
        np.testing.assert_array_equal(
            (s.val_in + s.val_out).toarray(), X[s.val_users][:, s.items].toarray()
        )
    again = data.fold_split(X, fold=4, folds=5, n_val=30, seed=0)  # the last fold, seeded
    assert np.array_equal(again.val_users, s.val_users)
    assert (again.test_out != s.test_out).nnz == 0
    with pytest.raises(data.DataError, match="fold=5"):
        data.fold_split(X, fold=5, folds=5, n_val=30, seed=0)
    with pytest.raises(data.DataError, match="n_val=200"):
        data.fold_split(X, fold=0, folds=5, n_val=200, seed=0)


def test_the_pilot_never_reads_a_test_user_of_fold_0():
    X = _ml100k()
    split = pilot.pilot_split(X)
    test0 = crossval.split_of(experiment.FULL, X, 0).test_users
    held = np.concatenate([split.val_users, split.test_users])
    assert not set(held) & set(test0)
    assert split.train.shape[0] + len(held) + len(test0) == X.shape[0]  # test0 fitted neither


def test_released_grids_equal_the_official_lists():
    """github.com/coderaBruce/DEQL at 7d4a990, config/ML20M/strong_generalization/."""
    plain = {  # EDLAE_b_geq_0.yaml (a: [1.0])
        "b": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9],
        "p": [0.1, 0.25, 0.33, 0.5, 0.8, 0.9],
    }
    l2 = {  # EDLAE_b_geq_0_diag0_L2const.yaml (a: [1.0]); L2const is our "lam"
        "b": [0.1, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0],
        "p": [0.1, 0.25, 0.5, 0.75],
        "lam": [10.0, 70.0, 100.0, 300.0, 500.0],
    }
    arms = {a.name: a for a in experiment.ARMS}
    for name, want in (("DEQL(plain) released", plain), ("DEQL(L2) released", l2)):
        arm = arms[name]
        assert {axis: list(v) for axis, v in arm.grid.items()} == want
        assert set(arm.open_edges) == {(a, side) for a in want for side in ("low", "high")}
    assert arms["DEQL(L2) released"].settings == {
        "model": "deql",
        "lam_scale": "deql",
        "zero_diag": True,
    }


# ---------------------------------------------------------------------------------------------
# Claims from a record alone

EFFECTS = {  # each arm's lift over a per-user base: every claim holds by a clear gap
    "EASE": 0.0,
    "EDLAE": 0.0,
    "DEQL(plain) released": 0.0,
    "DEQL(L2) released": 0.03 + experiment.PLAIN_GAP,
    "DEQL(plain) wide": 0.0,
    "DEQL(L2) wide": 0.03 + experiment.PLAIN_GAP,
}


def full_record(effects: dict, users: int = 300, edges=()) -> dict:
    """A v2 full record: 5 folds of users/5 test users, per-user Recall@20 = base + the arm's
    effect + noise; through a JSON round trip, as `--from_results` reads it."""
    rng = np.random.default_rng(0)
    base = 0.3 + 0.2 * rng.random(users)
    rows = []
    for model, lift in effects.items():
        values = base + lift + 0.02 * rng.normal(size=users)
        for fold, part in enumerate(np.array_split(np.arange(users), 5)):
            per_user = {f"user_{m}": values[part].tolist() for m in experiment.METRICS}
            rows.append({"fold": fold, "model": model, "users": part.tolist(), **per_user})
    arms = {m: {"grid": {}, "open_edges": [], "settings": {}} for m in effects}
    record = {"run": "full", "config": {"quick": False, "arms": arms}, "rows": rows}
    return json.loads(json.dumps({**record, "edges": list(edges)}))


BREAKS = (  # (claim index, arm whose effect is moved, new effect): that claim alone must fail
    (0, "DEQL(plain) released", EFFECTS["DEQL(L2) released"]),
    (1, "DEQL(plain) wide", EFFECTS["DEQL(L2) wide"]),
    (2, "EDLAE", EFFECTS["DEQL(L2) released"]),
    (3, "EASE", EFFECTS["DEQL(L2) released"]),
)


def test_claims_hold_on_a_record_alone_and_each_can_fail():
    claims = experiment.claims_from_results(full_record(EFFECTS))
    assert len(claims) == len(experiment.CLAIMS) == 4
    assert all(c.holds for c in claims)
    assert [c.margin for c in claims] == [experiment.PLAIN_GAP] * 2 + [0.0] * 2
    for index, arm, effect in BREAKS:
        broken = experiment.claims_from_results(full_record({**EFFECTS, arm: effect}))
        assert [c.holds for c in broken] == [i != index for i in range(4)], (index, arm)


def test_the_bootstrap_is_over_users():
    """n is the number of users; shuffling one arm's per-user values across users keeps its
    mean but breaks the pairing, which widens the interval."""
    record = full_record(EFFECTS)
    claim = experiment.claims_from_results(record)[0]
    assert claim.n == 300
    rows = [r for r in record["rows"] if r["model"] == "DEQL(L2) released"]
    values = np.random.default_rng(1).permutation(sum((r["user_recall@20"] for r in rows), []))
    for i, row in enumerate(rows):
        row["user_recall@20"] = values[60 * i : 60 * i + 60].tolist()
    shuffled = experiment.claims_from_results(record)[0]
    assert shuffled.interval.mean == pytest.approx(claim.interval.mean, abs=1e-12)
    width = lambda c: c.interval.high - c.interval.low
    assert width(shuffled) > 2 * width(claim)


def test_a_user_tested_twice_or_an_unfinished_edge_is_refused():
    record = full_record(EFFECTS)
    record["rows"][1]["users"] = record["rows"][0]["users"]  # fold 1 re-tests fold 0's users
    with pytest.raises(ConfigError, match="tested in two folds"):
        experiment.claims_from_results(record)
    edge = {"fold": 3, "model": "EDLAE", "axis": "lam", "value": 1000.0, "side": "high"}
    with pytest.raises(ConfigError, match=r"grid not finished.*EDLAE fold 3: lam=1000 \(high\)"):
        experiment.claims_from_results(full_record(EFFECTS, edges=[{**edge, "open": None}]))
    allowed = full_record(EFFECTS, edges=[{**edge, "open": experiment.RELEASED}])
    assert all(c.holds for c in experiment.claims_from_results(allowed))


def test_the_margin_has_the_pilots_power():
    """PLAIN_GAP leaves v1's effect (+0.018) power >= 0.9 at the SE the pilot's per-user SD
    gives over 942 users (results/pilot.json: fold 0's non-test users only)."""
    spread = pilot.spread(results.load("deql", "pilot"))
    for row in spread[:2]:  # the two DEQL(L2) - DEQL(plain) claims
        assert row["margin_power"] >= experiment.PLAIN_GAP
        assert row["power_at_margin"] >= pilot.POWER


def test_v1_claims_rederive_from_full_v1_json():
    """v1 (10 seeded splits, paired by split): the README's "First run (v1)" table."""
    record = results.load("deql", "full_v1")
    claims = report.claims_v1(record)
    assert [c.text for c in experiment.claims_from_results(record)] == [c.text for c in claims]
    got = [(c.n, round(c.interval.mean, 4), round(c.interval.low, 4)) for c in claims]
    assert got == [(10, 0.018, 0.0096), (10, 0.004, -0.0004), (10, 0.0014, -0.0057)]
    assert [c.margin for c in claims] == [0.01, 0.0, 0.0]
    assert not any(c.holds for c in claims)
