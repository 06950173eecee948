"""DEQL through core.train (one closed-form fit per step, Gram matrix over the mesh) and its
experiment's fold runner: selection on validation only, the per-point cache, the per-user test
rows, the quick run's smoke checks (the claims, folds and v1: test_deql_folds.py)."""

import dataclasses
import os

import jax
import numpy as np
import pytest

import methods
from configs import deql as deql_config
from core import train
from core.errors import ConfigError
from core.state import TrainState
from methods import deql
from methods.deql import crossval, data, experiment, solvers


def test_train_step_on_8_devices_equals_the_direct_solve(tmp_path):
    config = deql_config.get_config("mesh=cpu,size=smoke")  # data=8: the psum Gram path
    result = train.run(config, methods.make(config), str(tmp_path))
    split = deql.load_split(config.data)
    X = split.train.toarray().astype(np.float64)
    hp = deql.Hyper(**config.model.to_dict())
    W = deql.fit_host(X.T @ X, hp)
    W_state = np.asarray(result.state.params["W"])
    assert W_state.shape == W.shape and W_state.dtype == np.float32
    # The state holds the float64 solve rounded to float32: relative 2^-24 of the largest entry.
    np.testing.assert_allclose(W_state, W, rtol=0, atol=1e-6 * np.abs(W).max())
    loss = [row["loss"] for row in result.history if "loss" in row][0]
    residual = np.sum((X - X @ W) ** 2) / np.sum(X**2)
    assert abs(loss - residual) < 1e-5  # float32 metric of a float64 quantity
    final = result.history[-1]
    assert set(final) == {"step", "eval/recall@20", "eval/recall@50", "eval/ndcg@100"}
    assert final["eval/recall@20"] == pytest.approx(
        deql.evaluate_W(W, split.val_in, split.val_out)["recall@20"], abs=1e-6
    )


@pytest.mark.parametrize("model", ["ease", "edlae"])
def test_step_without_a_mesh_fits_the_other_models(model):
    config = deql_config.get_config(f"mesh=cpu,size=smoke,model={model}")
    method = methods.make(config)
    batch = next(method.dataset("train", shard=(0, 1), seed=0))
    variables = method.init(jax.random.PRNGKey(0), batch)
    state = TrainState(step=0, rng=None, params=variables["params"], opt_state=(), extra={})
    new, metrics = method.step(state, batch, rng=None)  # no mesh in context: one matmul
    X = batch["x"].astype(np.float64)
    W = deql.fit_host(X.T @ X, deql.Hyper(**config.model.to_dict()))
    np.testing.assert_allclose(new.params["W"], W, rtol=0, atol=1e-6 * np.abs(W).max())
    assert np.all(np.diag(W) == 0)  # EASE and EDLAE constrain the diagonal
    assert 0 < float(metrics["loss"]) < 1


def test_config_errors_are_one_line():
    with pytest.raises(ConfigError, match="model='mf'"):
        deql_config.get_config("model=mf")
    config = deql_config.get_config("size=smoke")
    config.model.b, config.model.lam = 0.0, 0.0
    with pytest.raises(ConfigError, match="b=0 with lam=0"):
        methods.make(config)
    config = deql_config.get_config("size=smoke")
    config.train.batch_size = 16
    method = methods.make(config)
    with pytest.raises(ConfigError, match="train.batch_size=16 is below the 44 train users"):
        method.dataset("train", shard=(0, 1), seed=0)


ARMS = {a.name: a for a in experiment.ARMS}
SMALL_GRIDS = {
    "EASE": {"lam": (1.0, 10.0, 100.0)},
    "EDLAE": {"p": (0.25,), "lam": (1.0, 10.0)},
    "DEQL(plain) released": {"b": (0.5, 0.9), "p": (0.5,)},
    "DEQL(L2) released": {"b": (0.5, 1.0), "p": (0.5,), "lam": (1.0, 10.0)},
    "DEQL(plain) wide": {"b": (0.5, 1.0), "p": (0.5,)},
    "DEQL(L2) wide": {"b": (0.25, 1.0, 2.0), "p": (0.5,), "lam": (1.0, 10.0)},
}
SMALL_ARMS = tuple(dataclasses.replace(ARMS[m], grid=g) for m, g in SMALL_GRIDS.items())
WHERE = {"fold": 0, "folds": 5, "n_val": 15, "seed": 0, "split": "users"}


def small_split(X):
    return data.fold_split(X, fold=0, folds=5, n_val=15, seed=0)


def test_hyperparameters_are_chosen_on_validation_never_on_test():
    X = deql.synthetic_interactions(120, 50, seed=1)
    split = small_split(X)
    before = crossval.score_split(SMALL_ARMS, split, WHERE)
    scrambled = split._replace(test_out=split.test_in)  # the test users' held-out items replaced
    after = crossval.score_split(SMALL_ARMS, scrambled, WHERE)
    assert [r["model"] for r in after] == list(experiment.MODELS)
    for a, b in zip(after, before, strict=True):
        chosen = {k: v for k, v in a.items() if k.startswith("chosen_")}
        assert chosen == {k: v for k, v in b.items() if k.startswith("chosen_")}
        assert a["val_recall@20"] == b["val_recall@20"]
        assert a["test_recall@20"] != b["test_recall@20"]  # the scrambling reached the test


def test_test_rows_hold_every_test_users_metrics_keyed_by_user_id():
    X = deql.synthetic_interactions(120, 50, seed=1)
    split = small_split(X)
    rows = crossval.score_split(SMALL_ARMS, split, WHERE, popularity=True)
    assert [r["model"] for r in rows] == [*experiment.MODELS, experiment.POPULARITY]
    for row in rows:
        assert row["users"] == split.test_users.tolist()  # every test user has held-out items
        for m in experiment.METRICS:
            assert len(row[f"user_{m}"]) == len(row["users"])
            assert row[f"test_{m}"] == pytest.approx(np.mean(row[f"user_{m}"]), abs=1e-12)
    W_II = deql.fit_host(*_gram_and_hyper(split, rows[-2]))
    want = deql.evaluate_W(W_II, split.test_in, split.test_out)
    assert rows[-2]["test_recall@20"] == pytest.approx(want["recall@20"], abs=1e-9)


def _gram_and_hyper(split, row):
    X_UI = split.train.toarray().astype(np.float64)
    arm = ARMS[row["model"]]
    point = {a: row[f"chosen_{a}"] for a in SMALL_GRIDS[row["model"]]}
    return X_UI.T @ X_UI, experiment.hyper(arm, point)


def test_cached_scores_are_read_back_and_keyed_by_the_solvers_code(tmp_path, monkeypatch):
    """A rerun (e.g. after a grid is widened, or an interrupted run) fits nothing already
    scored under the same solvers; other solver code refits."""
    X = deql.synthetic_interactions(120, 50, seed=1)
    split, root = small_split(X), str(tmp_path / "cache")
    first = crossval.score_split(SMALL_ARMS, split, WHERE, root, code="solvers-v1")

    def refuse(*args):
        raise AssertionError("refitted a cached point")

    monkeypatch.setattr(crossval, "fit_host", refuse)
    again = crossval.score_split(SMALL_ARMS, split, WHERE, root, code="solvers-v1")
    assert [{k: v for k, v in r.items() if k != "fit_seconds"} for r in again] == [
        {k: v for k, v in r.items() if k != "fit_seconds"} for r in first
    ]
    with pytest.raises(AssertionError, match="refitted"):
        crossval.score_split(SMALL_ARMS, split, WHERE, root, code="solvers-v2")


def test_workers_share_the_validation_points_out(tmp_path, monkeypatch):
    """Two workers' shares cover every validation point once; `measure` then fits only the
    chosen points' test scores."""
    X = deql.synthetic_interactions(120, 50, seed=1)
    split, root = small_split(X), str(tmp_path / "cache")
    for worker in (0, 1):
        assert crossval.score_split(SMALL_ARMS, split, WHERE, root, share=(worker, 2)) == []
    fits = {  # distinct solver settings: two arms' equal points share one cache entry
        experiment.hyper(a, dict(zip(a.grid, pt, strict=True)))
        for a in SMALL_ARMS
        for pt in crossval.points(a.grid)
    }
    assert len(os.listdir(root)) == len(fits) == 18
    fits = []
    real_fit = crossval.fit_host
    monkeypatch.setattr(crossval, "fit_host", lambda *a: fits.append(1) or real_fit(*a))
    rows = crossval.score_split(SMALL_ARMS, split, WHERE, root)
    chosen = {_gram_and_hyper(split, row)[1] for row in rows}
    assert len(fits) == len(chosen)  # one test fit per chosen setting, no validation fit


@pytest.mark.parametrize("b, p", [(0.25, 0.05), (1.0, 0.5), (4.0, 0.75)])
def test_wide_deql_l2_lam_is_on_edlae_scale_and_the_released_one_on_deqls(b, p):
    """H0 / alpha0 must be EDLAE's K + p/(1-p) diag(K) + lam I for the wide grid's lam; the
    released grid's L2const is added to H0's diagonal as is (the official models/model.py)."""
    hp = experiment.hyper(ARMS["DEQL(L2) wide"], {"b": b, "p": p, "lam": 300.0})
    co = solvers._coefficients(hp.a, hp.b, hp.p)
    assert hp.lam / co["alpha0"] == pytest.approx(300.0, rel=1e-12)  # float rounding only
    assert co["d0"] / co["alpha0"] == pytest.approx(p / (1 - p), rel=1e-12)
    assert not hp.zero_diag
    released = experiment.hyper(ARMS["DEQL(L2) released"], {"b": b, "p": p, "lam": 70.0})
    assert (released.lam, released.zero_diag) == (70.0, True)
    plain = experiment.hyper(ARMS["DEQL(plain) released"], {"b": b, "p": p})
    assert (plain.lam, plain.zero_diag) == (0.0, False)


def test_popularity_row_ranks_every_user_by_the_train_counts():
    X = deql.synthetic_interactions(120, 50, seed=1)
    split = small_split(X)
    rows = crossval.score_split(SMALL_ARMS, split, WHERE, popularity=True)
    counts_I = np.asarray(split.train.sum(0)).ravel()
    fold_in, held_out = split.test_in.toarray() > 0, split.test_out.toarray() > 0
    recalls = []
    for seen_I, out_I in zip(fold_in, held_out, strict=True):
        if out_I.any():  # top 20 unseen items by count, ties to the lower index (as top_k)
            order = [i for i in np.argsort(-counts_I, kind="stable") if not seen_I[i]]
            recalls.append(out_I[order[:20]].sum() / min(20, out_I.sum()))
    # float32 ranking of integer scores: exact; per user equal up to float32 rounding
    np.testing.assert_allclose(rows[-1]["user_recall@20"], recalls, atol=1e-6)


def smoke_record(lead: float) -> dict:
    """Two folds of 20 users: popularity at 0.2 + a per-user jitter, every arm `lead` above."""
    rng = np.random.default_rng(0)
    base = {u: 0.2 + 0.1 * rng.random() for u in range(40)}
    rows = []
    for m in (*experiment.MODELS, experiment.POPULARITY):
        for fold in (0, 1):
            users = list(range(20 * fold, 20 * fold + 20))
            lift = lead if m in experiment.MODELS else 0.0
            values = [base[u] + lift for u in users]
            rows.append({"fold": fold, "model": m, "users": users, "user_recall@20": values})
    arms = {m: {} for m in experiment.MODELS}
    return {"run": "quick", "config": {"quick": True, "arms": arms}, "rows": rows}


@pytest.mark.parametrize(("lead", "holds"), [(0.2, True), (0.0, False), (-0.15, False)])
def test_quick_smoke_checks_need_every_model_well_above_popularity(lead, holds):
    """0.2: a working fit; 0: a fit that lost the co-occurrences; -0.15: W = 0 or -W."""
    checks = experiment.claims_from_results(smoke_record(lead))
    assert [c.text.split(" learned")[0] for c in checks] == [
        f"smoke: {m}" for m in experiment.MODELS
    ]
    assert [c.holds for c in checks] == [holds] * len(experiment.MODELS)
    assert {c.n for c in checks} == {40}  # paired over users, not folds


def test_quick_experiment_on_movielens_100k(tmp_path):
    """Quick run (folds 0 and 1 of the 5-fold partition, 150 validation users each, two grid
    points per arm; ~25 s idle): every arm's test Recall@20 above the popularity ranking's by
    > 0.05, each on a paired bootstrap over the ~377 tested users, and the rows must be the
    grid's validation choices."""
    try:
        data.ml100k_path()
    except data.DataError as e:
        if os.environ.get("DEQL_DATA_REQUIRED"):
            raise
        pytest.skip(f"ML-100k unavailable: {e}")
    report = experiment.run(str(tmp_path), quick=True)
    record = report.results
    tested = sum(f["test_users"] for f in record["folds"])
    assert tested in (377, 378) and [c.n for c in report.claims] == [tested] * 6
    assert all(c.holds for c in report.claims)
    assert len(record["rows"]) == 2 * (len(experiment.MODELS) + 1)  # + popularity per fold
    for row in record["rows"]:
        for name in experiment.METRICS:
            assert 0 < row[f"test_{name}"] < 1
        if row["model"] == experiment.POPULARITY:
            continue
        grid = {a.name: a.grid for a in experiment.QUICK.arms}[row["model"]]
        assert all(row[f"chosen_{a}"] in values for a, values in grid.items())
        assert row["grid_size"] == 2  # the same budget for every arm
    assert [c.to_dict() for c in experiment.claims_from_results(record)] == [
        c.to_dict() for c in report.claims
    ]
    assert os.path.getsize(report.figures[0]) > 1000
