"""DEQL's cross-validation over users: every (fold, arm, grid point) fitted and scored on the
fold's validation users, the chosen point scored per test user; the results record.

    record = measure(workdir, experiment.FULL)           # every fold, cached per point
    python -m methods.deql.crossval --workdir=W --worker=0 --workers=2   # fill the cache

Every validation score and every chosen point's test scores go through `core.cache` keyed by
the point's config (fold, users, hyperparameters) and the solvers' code (SCORE_SOURCES, not
this file or the grids): a widened grid fits only its new points, an interrupted run resumes,
and several worker processes can share a grid out (`fill`: point i goes to worker i mod n)
before one `measure` reads every score back.
"""

import argparse
import dataclasses
import functools
import itertools
import os
import time

import numpy as np

from core import cache, results, selection
from core.errors import ConfigError
from methods.deql import data, evaluate_users, experiment, fit_host, metrics

# The per-point numbers depend on these files only (not on the grids or claims), so editing a
# grid keeps every point already fitted.
SCORE_SOURCES = tuple(f"methods/deql/{f}.py" for f in ("__init__", "data", "solvers", "metrics"))


def points(grid: dict) -> list[tuple]:
    return list(itertools.product(*grid.values()))  # the order `selection.select` uses


def _scored(compute, key: dict, cache_root: str | None, code: str):
    if cache_root is None:
        return compute()
    return cache.cached(compute, config=key, code=code, root=cache_root)


def score_split(arms, split, where: dict, cache_root=None, code="", popularity=False, share=None):
    """One split's rows: per arm the validation-chosen point, its edges and its per-test-user
    metrics (+ the popularity ranking's with `popularity`). `share=(worker, workers)`: only
    that worker's share of the validation points is scored (into the cache), nothing returned."""
    train_UI = split.train.toarray().astype(np.float64)
    K_II = train_UI.T @ train_UI
    where = {**where, "items": int(K_II.shape[0])}
    fresh = {}  # the best point fitted here (not read from the cache), with its W

    def validation(point: tuple, hp) -> dict:
        start = time.perf_counter()
        W_II = fit_host(K_II, hp)
        val = metrics.evaluate(W_II, split.val_in, split.val_out, k=20)["recall"]
        if val > fresh.get("val", -np.inf):  # strict: ties keep the first, as `select` does
            fresh.update(point=point, W=W_II, val=val)
        return {"val": val, "seconds": time.perf_counter() - start}

    def test(point: tuple, hp) -> dict:
        # The chosen W if this call fitted it, else one more fit (its score came from the cache).
        W_II = fresh["W"] if fresh.get("point") == point else fit_host(K_II, hp)
        return _per_user(W_II, split)

    rows, task = [], 0
    for arm in arms:
        scored = {}
        fresh.clear()
        for point in points(arm.grid):
            task += 1
            if share and (task - 1) % share[1] != share[0]:
                continue
            hp = experiment.hyper(arm, dict(zip(arm.grid, point, strict=True)))
            key = {**where, "hyper": hp._asdict(), "score": experiment.VALIDATION}
            scored[point] = _scored(functools.partial(validation, point, hp), key, cache_root, code)
        if share:
            continue
        by_point = {pt: {0: v["val"]} for pt, v in scored.items()}  # one "seed": this fold
        chosen = selection.select(
            arm.grid, selection.ValidationScores(experiment.VALIDATION, by_point)
        )
        point = tuple(chosen.point.values())
        hp = experiment.hyper(arm, chosen.point)
        key = {**where, "hyper": hp._asdict(), "score": "chosen point, per test user"}
        tested = _scored(functools.partial(test, point, hp), key, cache_root, code)
        rows.append(
            {
                "fold": where["fold"],
                "model": arm.name,
                **{f"chosen_{axis}": value for axis, value in chosen.point.items()},
                "solver_lam": hp.lam,
                "zero_diag": hp.zero_diag,
                "val_recall@20": chosen.mean,
                **tested,
                "edges": {a: e for a, e in chosen.edges.items() if e},
                "grid_size": len(scored),
                "fit_seconds": sum(v["seconds"] for v in scored.values()),
            }
        )
    if popularity and not share:  # W_ij = item j's train count: every user ranks items by it
        counts_I = train_UI.sum(0)
        tested = _per_user(np.tile(counts_I, (len(counts_I), 1)), split)
        rows.append({"fold": where["fold"], "model": experiment.POPULARITY, **tested, "edges": {}})
    return rows


def _per_user(W_II, split) -> dict:
    """The test users' metrics: each metric's mean, and per user ("users": ids, rows of the
    full matrix; "user_<metric>": values) for the users with held-out items."""
    per = evaluate_users(W_II, split.test_in, split.test_out)
    valid_U = ~np.isnan(per["recall@20"])
    out = {f"test_{m}": float(np.mean(v[valid_U])) for m, v in per.items()}
    out["users"] = split.test_users[valid_U].tolist()
    out.update({f"user_{m}": v[valid_U].tolist() for m, v in per.items()})
    return out


def fold_where(s, fold: int) -> dict:
    """A fold's cache-key fields: which users it holds out (the partition and the draw)."""
    return {"fold": fold, "folds": s.folds, "n_val": s.n_val, "seed": s.seed, "split": "users"}


def split_of(s, X, fold: int):
    """Fold `fold` of setting `s`: the split `measure` and `fill` score."""
    return data.fold_split(X, fold=fold, folds=s.folds, n_val=s.n_val, seed=s.seed)


def measure(workdir: str, s) -> dict:
    """Every fold of setting `s` as a results record (cached per point under workdir/cache);
    its "edges" list every choice on a grid edge with why it may stay (None: it may not)."""
    code = results.source_hash(SCORE_SOURCES)
    X = data.load_ml100k().matrix
    start = time.perf_counter()
    root = os.path.join(workdir, "cache")
    rows, folds = [], []
    for fold in s.run_folds:
        split = split_of(s, X, fold)
        rows += score_split(s.arms, split, fold_where(s, fold), root, code, s.popularity)
        folds.append(
            {
                "fold": fold,
                "items": len(split.items),
                "train_users": split.train.shape[0],
                "val_users": len(split.val_users),
                "test_users": len(split.test_users),
                "dropped_interactions": split.dropped,  # held-out items no train user has
            }
        )
    return results.record(
        "deql",
        "quick" if s.quick else "full",
        config=settings_json(s),
        rows=rows,
        folds=folds,
        dataset={"users": int(X.shape[0]), "items": int(X.shape[1]), "nnz": int(X.nnz)},
        edges=edges(rows, s.arms),
        seconds=time.perf_counter() - start,
    )


def settings_json(s) -> dict:
    arms = {
        a.name: {
            "grid": {axis: list(v) for axis, v in a.grid.items()},
            "open_edges": [[axis, side, why] for (axis, side), why in a.open_edges.items()],
            "settings": dict(a.settings),
        }
        for a in s.arms
    }
    keep = ("quick", "folds", "run_folds", "n_val", "seed", "popularity")
    return {**{k: getattr(s, k) for k in keep}, "arms": arms}


def edges(rows: list[dict], arms) -> list[dict]:
    """Every choice on its grid's edge: {fold, model, axis, value, side, open}, `open` the
    arm's reason it may stay there, or None (the grid is unfinished)."""
    reasons = {a.name: a.open_edges for a in arms}
    out = []
    for r in (r for r in rows if r["model"] in reasons):
        for axis, side in r["edges"].items():
            why = reasons[r["model"]].get((axis, side))
            value = r[f"chosen_{axis}"]
            out.append(
                dict(fold=r["fold"], model=r["model"], axis=axis, value=value, side=side, open=why)
            )
    return out


def fill(workdir: str, s, worker: int, workers: int) -> None:
    """This worker's share of every fold's validation points, into workdir/cache."""
    if not 0 <= worker < workers:
        raise ConfigError(f"worker={worker}: must be in [0, workers={workers})")
    code = results.source_hash(SCORE_SOURCES)
    X = data.load_ml100k().matrix
    root = os.path.join(workdir, "cache")
    for fold in s.run_folds:
        start = time.perf_counter()
        split = split_of(s, X, fold)
        score_split(s.arms, split, fold_where(s, fold), root, code, share=(worker, workers))
        print(f"worker {worker}: fold {fold} in {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Fill DEQL's per-point cache (one worker).")
    parser.add_argument("--workdir", required=True, help="launch.reproduce's <out>/workdirs/deql")
    parser.add_argument("--worker", type=int, required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--folds", default="", help="e.g. 4,3: these folds, in this order")
    args = parser.parse_args()
    setting = experiment.QUICK if args.quick else experiment.FULL
    if args.folds:  # a late worker can start where the others are not
        folds = tuple(int(f) for f in args.folds.split(","))
        if not set(folds) <= set(setting.run_folds):
            raise ConfigError(f"--folds={args.folds}: not among the run's {setting.run_folds}")
        setting = dataclasses.replace(setting, run_folds=folds)
    fill(args.workdir, setting, args.worker, args.workers)
