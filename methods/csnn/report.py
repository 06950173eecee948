"""What a CSNN record says (`experiment.py` runs it): its claims, the README's tables and the
figure, each a function of the record alone (a `core.results` record, or its JSON read back), so
`launch.reproduce --methods=csnn --from_results` re-derives them from `results/full.json`. Like
`experiment.py`, not in the run cache's code key (`core.results.run_sources`): editing a claim,
a table or the figure retrains nothing.
"""

import math

import numpy as np

from core import results, stats
from core.claims import IntervalClaim
from methods.csnn import tasks
from methods.csnn.experiment import choose, grid_points, setting_from

# Margins fixed on 2026-12-02, before any run on this protocol (issue 26); the numbers quoted
# beside them are the pre-protocol run's (README), not this protocol's.
# "Clearly beats": the paper's gap is 9 points; we ask 2 points of test AUROC, paired by split
# (pre-protocol: +.0293 +/- .0010 over 10 splits, GCN untuned).
MINE_MARGIN = 0.02
# The paper's direction over SAGE with no size attached (93.51 against 99.07; pre-protocol
# +.0018 +/- .0007): this one can fail, and may.
SAGE_MARGIN = 0.0
# The paper: CSNN 100 % at every depth 2-8 where GCN fails from depth 4 (under the benchmark's
# protocol). We ask CSNN >= 0.9 and GCN at least 0.2 below it at the claim depth, the gap only
# from TREE_GAP_FROM: the benchmark's GCN fits depth 3 (Alon & Yahav: 100 % training accuracy
# at r = 2, 3), so the paper's gap starts at 4; on fresh trees with undirected edges GCN was at
# chance at depth 3 (pre-protocol: .109, chance .125) where CSNN was at 1.000.
TREE_KEEP = 0.9
TREE_GAP = 0.2
TREE_GAP_FROM = {"fresh": 3, "benchmark": 4}
# A run reported in our plan: CSNN 1.7e-4 against GCN 5.6e-3 (x33). One decade = 10x.
BARBELL_DECADES = 1.0
# The quick run (barbell, 800 steps, seeds 0-2): GCN's MSE over CSNN's >= 1.5x. Measured at this
# setting before the protocol: CSNN 7.4e-4, 5.8e-3, 5.6e-4 on seeds 0-2 (seed 1 still on a
# plateau near half the constant's 1.39e-2), GCN 1.52e-2, 1.57e-2, 1.61e-2: ratios 20, 2.7, 29.
QUICK_BARBELL_DECADES = math.log10(1.5)


def chosen_points(record: dict) -> dict:
    """Each Minesweeper model's validation choice, re-derived from the record's rows; in the
    full run a ConfigError when a choice sits on the grid's edge (the grid is not finished)."""
    s = setting_from(record)
    out = {}
    for model in s.mine_models:
        chosen = choose(record["rows"], model, s)
        if s.require_interior:
            chosen.require_interior()
        out[model] = chosen.point
    return out


# --- claims, from the record -----------------------------------------------------------------


def mine_by_split(record: dict, model: str, point: dict) -> dict:
    """{split: test AUROC} of `model` at `point` on the claims' splits."""
    splits = setting_from(record).mine_splits
    rows = [r for r in record["rows"] if r["task"] == "minesweeper" and r["split"] in splits]
    return results.by_seed(rows, "test_auroc", key="split", model=model, **point)


def tree_by_seed(record: dict, protocol: str, model: str, depth: int) -> dict:
    return results.by_seed(
        record["rows"], "accuracy", task="tree", protocol=protocol, model=model, depth=depth
    )


def log_mse_by_seed(record: dict, model: str) -> dict:
    mse = results.by_seed(record["rows"], "test_mse", task="barbell", model=model)
    return {seed: math.log10(v) for seed, v in mse.items()}


def claims_from_results(record: dict) -> list[IntervalClaim]:
    s = setting_from(record)
    quick = record["run"] == "quick"
    out = []
    if s.mine_splits:
        chosen = chosen_points(record)
        csnn = mine_by_split(record, "csnn", chosen["csnn"])
        for other, margin in (("gcn", MINE_MARGIN), ("sage", SAGE_MARGIN)):
            out.append(
                IntervalClaim.beats(
                    f"CSNN beats {other.upper()} on Minesweeper by more than {margin:g} (test "
                    f"AUROC, each at its validation-chosen point, paired by split)",
                    f"auroc: csnn - {other}",
                    csnn,
                    mine_by_split(record, other, chosen[other]),
                    margin,
                )
            )
    depth = s.tree_claim_depth
    for protocol in s.tree_protocols if depth is not None else ():
        what = "training accuracy" if protocol == "benchmark" else "accuracy on fresh trees"
        csnn = tree_by_seed(record, protocol, "csnn", depth)
        out.append(
            IntervalClaim.at_least(
                f"CSNN solves Tree-NeighborsMatch at depth {depth} ({protocol} protocol: "
                f"{what} >= {TREE_KEEP:g})",
                f"tree {protocol} depth {depth}: accuracy csnn",
                csnn,
                TREE_KEEP,
            )
        )
        if depth < TREE_GAP_FROM[protocol]:
            continue
        out.append(
            IntervalClaim.beats(
                f"GCN degrades where CSNN does not: CSNN - GCN > {TREE_GAP:g} at depth {depth} "
                f"({protocol} protocol, {what}, paired by seed)",
                f"tree {protocol} depth {depth}: accuracy csnn - gcn",
                csnn,
                tree_by_seed(record, protocol, "gcn", depth),
                TREE_GAP,
            )
        )
    if s.barbell_seeds:
        mse = results.by_seed(record["rows"], "test_mse", task="barbell", model="csnn")
        constant = tasks.barbell_constant_mse()
        out.append(
            IntervalClaim.at_most(
                "CSNN's barbell test MSE is below the constant predictor's",
                "barbell: mse_csnn / mse_constant",
                {seed: v / constant for seed, v in mse.items()},
                1.0,
            )
        )
        decades = QUICK_BARBELL_DECADES if quick else BARBELL_DECADES
        others = [("gcn", "GCN's"), ("csnn:source_equals_target", "the S = T ablation's")]
        for other, name in others:
            if other not in s.barbell_models:
                continue
            out.append(
                IntervalClaim.beats(
                    f"CSNN's barbell test MSE is at least {10**decades:.3g}x below {name} "
                    f"(log10 ratio, paired by seed)",
                    f"barbell: log10(mse_{other} / mse_csnn)",
                    log_mse_by_seed(record, other),
                    log_mse_by_seed(record, "csnn"),
                    decades,
                )
            )
    return out


# --- the README's tables and the figure ---------------------------------------------------------


def _fmt(iv: stats.Interval, digits: int = 4) -> str:
    return f"{iv.mean:.{digits}f} [{iv.low:.{digits}f}, {iv.high:.{digits}f}]"


def table(record: dict) -> str:
    s = setting_from(record)
    rows = record["rows"]
    lines = []
    if s.mine_splits:
        chosen = chosen_points(record)
        lines += ["Minesweeper test AUROC at each model's validation-chosen point, per split:", ""]
        lines += ["| model | chosen | " + " | ".join(f"split {sp}" for sp in s.mine_splits)]
        lines[-1] += " | mean [95 % interval] |"
        lines += ["|---|---|" + "---|" * (len(s.mine_splits) + 1)]
        models = (*s.mine_models, *s.mine_ablations)
        for m in models:
            point = chosen["csnn" if m.startswith("csnn:") else m]
            by_split = mine_by_split(record, m, point)
            cells = [f"{by_split[sp]:.4f}" for sp in s.mine_splits]
            where = ", ".join(f"{k} {v:g}" if isinstance(v, float) else v for k, v in point.items())
            iv = stats.interval(by_split, what=m) if len(by_split) >= stats.MIN_SAMPLES else None
            lines.append(f"| {m} | {where} | {' | '.join(cells)} | {_fmt(iv) if iv else ''} |")
        lines += ["", "Validation AUROC of every grid point, mean over the selection splits:", ""]
        points = grid_points(s.mine_grid)
        lines += ["| model | " + " | ".join(f"{p['norm']}, lr {p['lr']:g}" for p in points) + " |"]
        lines += ["|---|" + "---|" * len(points)]
        for m in s.mine_models:
            means = choose(rows, m, s).means
            lines.append(f"| {m} | " + " | ".join(f"{v:.4f}" for v in means.values()) + " |")
    if s.tree_protocols and s.tree_depths:
        lines += ["", "Tree-NeighborsMatch accuracy, mean [95 % interval] over seeds:", ""]
        lines += ["| protocol | depth | " + " | ".join(s.tree_models) + " |"]
        lines += ["|---|---|" + "---|" * len(s.tree_models)]
        for protocol in s.tree_protocols:
            for depth in s.tree_depths:
                cells = [
                    _fmt(stats.interval(tree_by_seed(record, protocol, m, depth), what=m), 3)
                    for m in s.tree_models
                ]
                lines.append(f"| {protocol} | {depth} | {' | '.join(cells)} |")
    if s.barbell_seeds:
        lines += ["", "Barbell test MSE (normalised; the constant predictor's is "
                  f"{tasks.barbell_constant_mse():.3g}):", ""]  # fmt: skip
        lines += ["| model | " + " | ".join(f"seed {x}" for x in s.barbell_seeds) + " |"]
        lines += ["|---|" + "---|" * len(s.barbell_seeds)]
        for m in s.barbell_models:
            mse = results.by_seed(rows, "test_mse", task="barbell", model=m)
            lines.append(f"| {m} | " + " | ".join(f"{mse[x]:.3g}" for x in s.barbell_seeds) + " |")
    return "\n".join(lines)


def plot(record: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = setting_from(record)
    ran = {"mine": s.mine_splits, "tree": s.tree_depths, "barbell": s.barbell_seeds}
    panels = [p for p, keys in ran.items() if keys]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        if panel == "mine":
            chosen = chosen_points(record)
            for m in s.mine_models:
                by_split = mine_by_split(record, m, chosen[m])
                ax.plot(list(by_split), list(by_split.values()), "o-", label=m)
            ax.set_xticks(list(s.mine_splits))
            ax.set_xlabel("Minesweeper split")
            ax.set_ylabel("test AUROC (validation-chosen point)")
        elif panel == "tree":
            for protocol in s.tree_protocols:
                for m in s.tree_models:
                    y = [np.mean(list(tree_by_seed(record, protocol, m, d).values()))
                         for d in s.tree_depths]  # fmt: skip
                    ax.plot(s.tree_depths, y, "o-", label=f"{m} ({protocol})")
            ax.set_xticks(list(s.tree_depths))
            ax.set_xlabel("tree depth")
            ax.set_ylabel("accuracy (benchmark: training)")
            ax.set_ylim(0, 1.05)
        else:
            for m in s.barbell_models:
                mse = results.by_seed(record["rows"], "test_mse", task="barbell", model=m)
                ax.plot(list(mse), list(mse.values()), "o", label=m)
            ax.axhline(tasks.barbell_constant_mse(), color="k", ls="--", label="constant")
            ax.set_yscale("log")
            ax.set_xticks(list(s.barbell_seeds))
            ax.set_xlabel("seed")
            ax.set_ylabel("barbell test MSE")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
