"""CSNN's claims at CPU scale: Minesweeper, Tree-NeighborsMatch and the barbell, against GCN,
SAGE and an NSD-style sheaf, with CSNN's ablations. Every run goes through `core.train` with
`configs/csnn.py` (same model width d C for every kind, same optimiser and budget per task).

- Minesweeper: per split, the test AUROC at the step of best validation AUROC (evaluated every
  `eval_every` steps: early stopping on validation, as the official runs).
- Tree-NeighborsMatch: test accuracy on fresh trees at each depth (depth + 1 layers).
- Barbell: test MSE on fresh graphs against the exact constant-predictor MSE.

Claims:
- Minesweeper: CSNN's mean test AUROC exceeds GCN's by MINE_MARGIN (the paper: 99.07 vs 89.75).
- Tree: CSNN keeps its accuracy at the deepest depth (>= TREE_KEEP) where GCN falls below it.
- Barbell: CSNN's MSE is below the constant predictor's and BARBELL_RATIO times below GCN's.
The ablations (source = target, no conformal scale, a single operator) are reported beside.
"""

import dataclasses
import os

import jax
import numpy as np

import methods
from configs import csnn as csnn_config
from core import train
from core.claims import Claim, Report

# "Clearly beats": the paper's gap is 9 points; we ask for 2 points on the mean over splits.
MINE_MARGIN = 0.02
# The paper: CSNN 100 % at every depth 2-8, GCN failing from depth 4; we ask CSNN >= 0.9 at the
# deepest depth run and GCN at least 0.2 below it.
TREE_KEEP = 0.9
TREE_GAP = 0.2
# The notes' measured run: CSNN 1.7e-4 against GCN 5.6e-3 (x33) and the constant 1.4e-2.
BARBELL_RATIO = 10.0
# The suite's reduced Minesweeper run asserts CSNN - GCN >= this (see QUICK).
QUICK_MARGIN = 0.02


@dataclasses.dataclass(frozen=True)
class Setting:
    mine_splits: tuple[int, ...]
    mine_steps: int
    mine_side: int
    mine_models: tuple[str, ...]  # "kind" or "csnn:<ablation>"
    tree_depths: tuple[int, ...]
    tree_steps: int
    tree_models: tuple[str, ...]
    barbell_seeds: tuple[int, ...]
    barbell_steps: int
    barbell_models: tuple[str, ...]


ABLATED = ("csnn:source_equals_target", "csnn:not_conformal", "csnn:single_operator")
FULL = Setting(
    mine_splits=(0, 1, 2),
    mine_steps=600,
    mine_side=100,
    mine_models=("csnn", "gcn", "sage", "nsd", *ABLATED),
    tree_depths=(2, 3, 4, 5),
    tree_steps=2000,
    tree_models=("csnn", "gcn", "sage", "nsd"),
    barbell_seeds=(0, 1, 2),
    barbell_steps=3000,
    barbell_models=("csnn", "gcn", "sage", "nsd", *ABLATED),
)
QUICK = Setting(
    mine_splits=(0,),
    mine_steps=200,
    mine_side=30,
    mine_models=("csnn", "gcn"),
    tree_depths=(),
    tree_steps=0,
    tree_models=(),
    barbell_seeds=(),
    barbell_steps=0,
    barbell_models=(),
)


def config_for(task: str, model: str, steps: int, **options):
    kind, _, ablation = model.partition(":")
    arg = f"task={task},model={kind},ablation={ablation or 'none'}"
    arg += "".join(f",{k}={v}" for k, v in options.items() if k != "side")
    config = csnn_config.get_config(arg)
    if "side" in options:
        config.data.side = options["side"]
        config.train.batch_size = options["side"] ** 2
    config.train.steps = steps
    config.train.eval_every = min(config.train.eval_every, steps)
    config.train.log_every = config.train.eval_every
    return config


def train_eval_rows(config, workdir: str) -> list[dict]:
    """The run's evaluation rows ({"step", "eval/..."}), on one device."""
    result = train.run(config, methods.make(config), workdir, devices=jax.devices()[:1])
    return [row for row in result.history if any(k.startswith("eval/") for k in row)]


def minesweeper_run(model: str, split: int, setting: Setting, workdir: str) -> dict:
    config = config_for(
        "minesweeper", model, setting.mine_steps, split=split, side=setting.mine_side
    )
    rows = train_eval_rows(config, workdir)
    best = max(rows, key=lambda r: r["eval/val_auroc"])
    return {"val": best["eval/val_auroc"], "test": best["eval/test_auroc"], "step": best["step"]}


def final_value(model: str, task: str, steps: int, key: str, workdir: str, **options) -> float:
    config = config_for(task, model, steps, **options)
    return train_eval_rows(config, workdir)[-1][key]


def mean(values) -> float:
    return float(np.mean(values)) if len(values) else float("nan")


def run(workdir: str, quick: bool = False) -> Report:
    s = QUICK if quick else FULL
    mine = {m: [] for m in s.mine_models}
    for split in s.mine_splits:
        for m in s.mine_models:
            mine[m].append(minesweeper_run(m, split, s, os.path.join(workdir, f"mine-{m}-{split}")))
            print(f"minesweeper split {split} {m}: {mine[m][-1]}", flush=True)
    tree = {m: {} for m in s.tree_models}
    for depth in s.tree_depths:
        for m in s.tree_models:
            path = os.path.join(workdir, f"tree-{m}-{depth}")
            tree[m][depth] = final_value(m, "tree", s.tree_steps, "eval/test_accuracy", path,
                                         depth=depth)  # fmt: skip
            print(f"tree depth {depth} {m}: {tree[m][depth]:.3f}", flush=True)
    barbell = {m: [] for m in s.barbell_models}
    for seed in s.barbell_seeds:
        for m in s.barbell_models:
            path = os.path.join(workdir, f"barbell-{m}-{seed}")
            barbell[m].append(_barbell(m, seed, s, path))
            print(f"barbell seed {seed} {m}: {barbell[m][-1]:.3g}", flush=True)
    table = {
        "minesweeper_test_auroc": {m: mean([r["test"] for r in v]) for m, v in mine.items()},
        "tree_accuracy": tree,
        "barbell_test_mse": {m: mean(v) for m, v in barbell.items()},
    }
    figure = os.path.join(workdir, "csnn_results.png")
    plot(table, figure, quick)
    return Report(
        method="csnn",
        claims=claims(table, s, quick),
        metrics={
            "setting": dataclasses.asdict(s),
            "minesweeper": mine,
            "barbell": barbell,
            "table": table,
        },  # fmt: skip
        command="python -m launch.reproduce --methods=csnn" + (" --quick" if quick else ""),
        figures=[figure],
    )


def _barbell(model: str, seed: int, s: Setting, workdir: str) -> float:
    config = config_for("barbell", model, s.barbell_steps)
    config.seed = seed
    return train_eval_rows(config, workdir)[-1]["eval/test_mse"]


def claims(table: dict, s: Setting, quick: bool) -> list[Claim]:
    mine = table["minesweeper_test_auroc"]
    out = [
        Claim(
            "CSNN beats GCN clearly on Minesweeper (test AUROC, mean over splits)",
            "auroc_csnn - auroc_gcn",
            mine["csnn"] - mine["gcn"],
            ">=",
            QUICK_MARGIN if quick else MINE_MARGIN,
        )
    ]
    if s.tree_depths:
        deepest = max(s.tree_depths)
        acc = table["tree_accuracy"]
        out.append(
            Claim(
                f"CSNN keeps its Tree-NeighborsMatch accuracy at depth {deepest}",
                f"accuracy_csnn(depth {deepest})",
                acc["csnn"][deepest],
                ">=",
                TREE_KEEP,
            )
        )
        out.append(
            Claim(
                f"GCN degrades with depth where CSNN does not (depth {deepest})",
                f"accuracy_csnn - accuracy_gcn (depth {deepest})",
                acc["csnn"][deepest] - acc["gcn"][deepest],
                ">=",
                TREE_GAP,
            )
        )
    if s.barbell_seeds:
        mse = table["barbell_test_mse"]
        from methods.csnn import data

        out.append(
            Claim(
                "CSNN's barbell test MSE is below the constant predictor's",
                "mse_csnn / mse_constant",
                mse["csnn"] / data.constant_baseline_mse(6, 3, normalise=True),
                "<",
                1.0,
            )
        )
        out.append(
            Claim(
                f"CSNN's barbell test MSE is at least {BARBELL_RATIO:g}x below GCN's",
                "mse_gcn / mse_csnn",
                mse["gcn"] / mse["csnn"],
                ">=",
                BARBELL_RATIO,
            )
        )
    return out


def plot(table: dict, path: str, quick: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 1 if quick else 3
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4), squeeze=False)
    mine = table["minesweeper_test_auroc"]
    ax = axes[0, 0]
    ax.barh(list(mine), list(mine.values()), color="tab:blue")
    ax.set_xlim(min(mine.values()) - 0.05, 1.0)
    ax.set_xlabel("Minesweeper test AUROC (mean over splits)")
    if not quick:
        ax = axes[0, 1]
        for m, by_depth in table["tree_accuracy"].items():
            depths = sorted(by_depth)
            ax.plot(depths, [by_depth[d] for d in depths], marker="o", label=m)
        ax.set_xlabel("tree depth")
        ax.set_ylabel("Tree-NeighborsMatch test accuracy")
        ax.set_ylim(0, 1.05)
        ax.legend()
        ax = axes[0, 2]
        mse = table["barbell_test_mse"]
        ax.barh(list(mse), list(mse.values()), color="tab:orange")
        from methods.csnn import data

        ax.axvline(data.constant_baseline_mse(6, 3, True), color="k", ls="--", label="constant")
        ax.set_xscale("log")
        ax.set_xlabel("barbell test MSE (normalised)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
