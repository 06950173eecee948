"""The pilot that sized the claims' margins, run before the full run and never on a test user.

    python -m methods.deql.pilot --workdir=/tmp/deql_pilot      # writes results/pilot.json

It uses fold 0's non-test users only (fold 0's test users are removed from the matrix before
anything is drawn): from those 754, PILOT_VAL users choose each arm's point (the full run's
grids and selection, `crossval.score_split`), PILOT_EVAL other users are scored per user, and
the rest are fitted. For each claim's pair of arms it gives the per-user SD of the paired
Recall@20 difference, the standard error that SD gives over the full run's users (SE =
SD / sqrt(users)), the largest margin that the effect v1 measured for that pair (+0.018 for
DEQL(L2) - DEQL(plain)) clears with power POWER, effect - margin >= (z_0.975 + z_POWER) SE (the
claim holds when its 95 % interval's low end clears the margin), and the power of the margin
set in `experiment.CLAIMS` at that effect.
"""

import argparse
import os
import time

import numpy as np
from scipy import stats as scipy_stats

from core import results
from methods.deql import crossval, data, experiment

PILOT_SEED = 47  # the pilot's own draw of users
PILOT_VAL, PILOT_EVAL = 150, 150
# v1's test Recall@20 differences (results/full_v1.json), one per claim of experiment.CLAIMS:
# DEQL(L2) - DEQL(plain) for both grids, DEQL(L2) - EDLAE, DEQL(L2) - EASE.
V1_EFFECTS = (0.018, 0.018, 0.004, 0.0014)
POWER = 0.9


def pilot_split(X, s=experiment.FULL):
    """A strong split of fold 0's non-test users (ids mapped back to rows of X)."""
    test0 = data.user_folds(X, folds=s.folds, seed=s.seed)[0]
    keep = np.setdiff1d(np.arange(X.shape[0]), test0)
    split = data.strong_split(X[keep], n_val=PILOT_VAL, n_test=PILOT_EVAL, seed=PILOT_SEED)
    return split._replace(val_users=keep[split.val_users], test_users=keep[split.test_users])


def measure(workdir: str) -> dict:
    X = data.load_ml100k().matrix
    split = pilot_split(X)
    where = {"fold": "pilot", "seed": PILOT_SEED, "n_val": PILOT_VAL, "n_test": PILOT_EVAL}
    code = results.source_hash(crossval.SCORE_SOURCES)
    start = time.perf_counter()
    rows = crossval.score_split(experiment.ARMS, split, where, os.path.join(workdir, "cache"), code)
    return results.record(
        "deql",
        "pilot",
        config={
            "pilot_seed": PILOT_SEED,
            "pilot_val": PILOT_VAL,
            "pilot_eval": PILOT_EVAL,
            **crossval.settings_json(experiment.FULL),
        },
        rows=rows,
        train_users=split.train.shape[0],
        edges=crossval.edges(rows, experiment.ARMS),
        seconds=time.perf_counter() - start,
    )


def margin_for(se: float, effect: float, power: float = POWER) -> float:
    """The largest margin that `effect` clears with `power` (one-sided 2.5 % test)."""
    return effect - (scipy_stats.norm.ppf(0.975) + scipy_stats.norm.ppf(power)) * se


def power_at(effect: float, margin: float, se: float) -> float:
    return float(scipy_stats.norm.cdf((effect - margin) / se - scipy_stats.norm.ppf(0.975)))


def spread(record: dict, users: int = 942) -> list[dict]:
    """Per claim pair: the pilot's mean and per-user SD of the Recall@20 difference, the SE
    at `users` users, the margin with POWER at v1's effect and the set margin's power there."""
    out = []
    for c, effect in zip(experiment.CLAIMS, V1_EFFECTS, strict=True):
        a, b = (experiment.by_user(record, m) for m in (c.arm, c.baseline))
        diff = np.array([a[u] - b[u] for u in a])
        sd = float(diff.std(ddof=1))
        se = sd / np.sqrt(users)
        out.append(
            {
                "pair": f"{c.arm} - {c.baseline}",
                "n": len(diff),
                "mean": float(diff.mean()),
                "sd": sd,
                "se_full": se,
                "v1_effect": effect,
                "margin": c.margin,
                "margin_power": margin_for(se, effect),
                "power_at_margin": power_at(effect, c.margin, se),
            }
        )
    return out


def summary(record: dict) -> str:
    lines = [
        "| pair | pilot users | pilot mean | per-user SD | SE at 942 | v1 effect | margin with "
        "power 0.9 there | set margin | its power there |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in spread(record):
        lines.append(
            f"| {r['pair']} | {r['n']} | {r['mean']:+.4f} | {r['sd']:.4f} | {r['se_full']:.4f} "
            f"| {r['v1_effect']:+.4f} | {r['margin_power']:+.4f} | {r['margin']:g} "
            f"| {r['power_at_margin']:.2f} |"
        )
    lines += ["", "| arm | pilot choice | validation Recall@20 | pilot-eval Recall@20 |"]
    lines += ["|---|---|---|---|"]
    for row in record["rows"]:
        axes = record["config"]["arms"][row["model"]]["grid"]
        point = ", ".join(f"{a}={row[f'chosen_{a}']:g}" for a in axes)
        edge = f" (edge: {row['edges']})" if row["edges"] else ""
        lines.append(
            f"| {row['model']} | {point}{edge} | {row['val_recall@20']:.4f} "
            f"| {row['test_recall@20']:.4f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="DEQL's pilot (no test user is read).")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--from_results", action="store_true", help="read results/pilot.json")
    args = parser.parse_args()
    if args.from_results:
        record = results.load("deql", "pilot")
    else:
        record = measure(args.workdir)
        print(f"saved {results.save(record)} ({record['seconds']:.0f} s)")
    print(summary(record))
