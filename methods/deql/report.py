"""DEQL's tables and figure from a results record, the grid-edge check, and v1's claims.

    python -m methods.deql.report            # the README's v2 tables, then v1's claims

`claims_v1(record)` re-derives the first run's three claims from `results/full_v1.json` (10
seeded user splits, paired by split), as that run's code did: v1 stays checkable beside v2.
"""

import numpy as np

from core import results, stats
from core.claims import IntervalClaim
from core.errors import ConfigError
from methods.deql import experiment

# v1's claims (commit f96114d, experiment.py:59-69): (better, worse, margin, statement).
CLAIMS_V1 = (
    ("DEQL(L2)", "DEQL(plain)", 0.01, "DEQL without L2 (plain) is poor"),
    ("DEQL(L2)", "EDLAE", 0.0, "DEQL(L2) with b > 0 beats EDLAE (b = 0)"),
    ("DEQL(L2)", "EASE", 0.0, "DEQL(L2) beats EASE"),
)
# Comparisons no claim makes (counted apart from the claims: table rows only).
EXPLORATORY = (
    ("DEQL(L2) wide", "EDLAE"),
    ("DEQL(L2) wide", "EASE"),
    ("EDLAE", "EASE"),
    ("DEQL(L2) released", "DEQL(L2) wide"),
    ("DEQL(plain) released", "DEQL(plain) wide"),
)


def claims_v1(record: dict) -> list[IntervalClaim]:
    """v1's claims from its per-split record: test Recall@20, paired by split."""
    split = lambda m: results.by_seed(record["rows"], "test_recall@20", key="split", model=m)
    return [
        IntervalClaim.beats(
            f"{text}: {better} - {worse} > {margin:g} (test Recall@20, paired by split)",
            f"recall@20: {better} - {worse}",
            split(better),
            split(worse),
            margin,
        )
        for better, worse, margin, text in CLAIMS_V1
    ]


def require_finished(record: dict) -> None:
    """One line naming every choice on a grid edge that no open edge allows."""
    left = [
        f"{e['model']} fold {e['fold']}: {e['axis']}={e['value']:g} ({e['side']})"
        for e in record["edges"]
        if e["open"] is None
    ]
    if left:
        raise ConfigError(f"deql: grid not finished, widen it: {'; '.join(left)}")


def _fmt(iv) -> str:
    return f"{iv.mean:.4f} [{iv.low:.4f}, {iv.high:.4f}]"


def _arms(record: dict) -> list[str]:
    models = list(record["config"]["arms"])
    return models + [experiment.POPULARITY] * any(
        r["model"] == experiment.POPULARITY for r in record["rows"]
    )


def table(record: dict) -> str:
    """The README's tables: each arm's test metrics and the paired differences (claims' pairs,
    then exploratory ones), each a mean over test users with its 95 % bootstrap interval over
    users; then each fold's choices and test Recall@20, and the edge choices."""
    by_user = experiment.by_user
    folds = sorted({r["fold"] for r in record["rows"]})
    n = len(by_user(record, next(iter(record["config"]["arms"]))))
    metrics = experiment.METRICS
    lines = [
        f"Test metrics over {n} test users ({len(folds)} folds), mean [95 % bootstrap interval "
        "over users]:",
        "",
        "| arm | Recall@20 | Recall@50 | NDCG@100 | grid points |",
        "|---|---|---|---|---|",
    ]
    for m in _arms(record):
        cells = [_fmt(stats.interval(by_user(record, m, k), what=m)) for k in metrics]
        size = next((r.get("grid_size", "") for r in record["rows"] if r["model"] == m), "")
        lines.append(f"| {m} | {' | '.join(cells)} | {size} |")
    pairs = [(c.arm, c.baseline, "claim") for c in experiment.CLAIMS]
    pairs += [(a, b, "exploratory") for a, b in EXPLORATORY]
    lines += ["", "Paired differences (same users), mean [95 % bootstrap interval over users]:"]
    lines += [
        "",
        "| difference | kind | Recall@20 | Recall@50 | NDCG@100 |",
        "|---|---|---|---|---|",
    ]
    for a, b, kind in pairs:
        if not {a, b} <= set(record["config"]["arms"]):
            continue
        cells = [
            _fmt(stats.paired_interval(by_user(record, a, k), by_user(record, b, k)))
            for k in metrics
        ]
        lines.append(f"| {a} - {b} | {kind} | {' | '.join(cells)} |")
    lines += ["", "Validation-chosen points per fold (lam: EDLAE's scale for the wide DEQL(L2), "]
    lines[-1] += "DEQL's own for the released one):"
    lines += ["", "| arm | " + " | ".join(f"fold {f}" for f in folds) + " |"]
    lines += ["|---|" + "---|" * len(folds)]
    for m, spec in record["config"]["arms"].items():
        rows = sorted((r for r in record["rows"] if r["model"] == m), key=lambda r: r["fold"])
        cells = [", ".join(f"{a}={r[f'chosen_{a}']:g}" for a in spec["grid"]) for r in rows]
        lines.append(f"| {m} | {' | '.join(cells)} |")
    lines += ["", "Test Recall@20 per fold (mean over the fold's test users):", ""]
    lines += ["| arm | " + " | ".join(f"fold {f}" for f in folds) + " |"]
    lines += ["|---|" + "---|" * len(folds)]
    for m in _arms(record):
        per_fold = _per_fold(record, m)
        lines.append(f"| {m} | {' | '.join(f'{per_fold[f]:.4f}' for f in folds)} |")
    if record["config"]["quick"]:
        lines += ["", "Quick grids are two points wide: their edges are not checked."]
    elif record["edges"]:
        lines += ["", "Choices on a grid edge:"]
        for e in record["edges"]:
            why = e["open"] or "NOT ALLOWED: widen the grid"
            where = f"{e['model']} fold {e['fold']}: {e['axis']}={e['value']:g} ({e['side']})"
            lines.append(f"- {where}: {why}")
    return "\n".join(lines)


def _per_fold(record: dict, model: str) -> dict:
    return {r["fold"]: r["test_recall@20"] for r in record["rows"] if r["model"] == model}


def plot(record: dict, path: str) -> None:
    """Test Recall@20 per fold and arm (each fold's mean over its ~188 test users)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    folds = sorted({r["fold"] for r in record["rows"]})
    x = np.arange(len(folds))
    models = _arms(record)
    for i, m in enumerate(models):
        y = _per_fold(record, m)
        shift = (i - (len(models) - 1) / 2) * 0.05
        ax.plot(x + shift, [y[f] for f in folds], "o-", label=m, alpha=0.85)
    ax.set_xticks(x, [f"fold {f}" for f in folds])
    ax.set_ylabel("test Recall@20 (validation-chosen)")
    ax.set_title("ML-100k, 5-fold CV over users (~188 test users per fold)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    print(table(results.load("deql", "full")))
    for claim in claims_v1(results.load("deql", "full_v1")):
        print(f"v1: {claim.text}: {claim.measured_text()} holds={claim.holds}")
