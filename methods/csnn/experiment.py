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
The reduced run (`--quick`, QUICK) is the barbell alone, CSNN and GCN on one seed, with the
barbell claims at QUICK_BARBELL_RATIO: a smoke check of the mechanism in ~30 s, not the paper's
Minesweeper numbers.
"""

import dataclasses
import os
import sys

import jax
import numpy as np

import methods
from configs import csnn as csnn_config
from core import cache, results, train
from core.claims import Claim, Report
from methods.csnn import tasks

# "Clearly beats": the paper's gap is 9 points; we ask for 2 points on the mean over splits.
MINE_MARGIN = 0.02
# The paper: CSNN 100 % at every depth 2-8, GCN failing from depth 4; we ask CSNN >= 0.9 at the
# deepest depth run and GCN at least 0.2 below it.
TREE_KEEP = 0.9
TREE_GAP = 0.2
# A run reported in our plan: CSNN 1.7e-4 against GCN 5.6e-3 (x33) and the constant 1.4e-2.
BARBELL_RATIO = 10.0
# The reduced run (QUICK: barbell seed 0, 800 steps) asserts GCN's MSE / CSNN's >= this. Measured
# at 800 steps, lr 3e-3, 32 graphs a step: CSNN 7.4e-4, 5.8e-3, 5.6e-4, 1.0e-3, 7.3e-3 on seeds
# 0-4 (some seeds are still on a plateau near half the constant's 1.39e-2); GCN 1.52e-2, 1.57e-2,
# 1.61e-2 on seeds 0-2, above the constant predictor: ratios 2.1-29, 20 on seed 0.
QUICK_BARBELL_RATIO = 1.5


@dataclasses.dataclass(frozen=True)
class Setting:
    mine_splits: tuple[int, ...]
    mine_steps: int
    mine_side: int
    mine_models: tuple[str, ...]  # "kind" or "csnn:<ablation>"
    mine_extra_splits: tuple[int, ...]  # the ablations
    mine_extra_models: tuple[str, ...]
    tree_depths: tuple[int, ...]
    tree_steps: int
    tree_models: tuple[str, ...]
    barbell_seeds: tuple[int, ...]
    barbell_steps: int
    barbell_models: tuple[str, ...]
    barbell_batch: int | None = None  # graphs a step; None: configs/csnn.py's
    barbell_lr: float | None = None  # None: configs/csnn.py's


ABLATED = ("csnn:source_equals_target", "csnn:not_conformal", "csnn:single_operator")
FULL = Setting(
    mine_splits=tuple(range(10)),
    mine_steps=500,
    mine_side=100,
    mine_models=("csnn", "gcn", "sage", "nsd"),
    mine_extra_splits=(0, 1, 2, 3),
    mine_extra_models=ABLATED,
    tree_depths=(2, 3, 4),
    tree_steps=3000,
    tree_models=("csnn", "gcn", "nsd"),
    barbell_seeds=(0, 1),
    barbell_steps=3000,
    barbell_models=("csnn", "gcn", "nsd", "csnn:source_equals_target", "csnn:single_operator"),
)
# The barbell, where GCN fails by construction (a node cannot hear the other clique without its
# own clique flooding the bridge), at a higher learning rate and half the graphs a step: CSNN
# leaves its plateau near the constant predictor's MSE within 500-700 steps. Not Minesweeper:
# on the full graph 150 steps of CSNN and GCN took 185 s (most of it CSNN's 0.45 s steps), and
# on a 40 x 40 grid (800 train nodes) CSNN and GCN tie after 200 steps (measured test AUROC .886
# vs .893 and .908 vs .901 on two splits).
QUICK = Setting(
    mine_splits=(),
    mine_steps=0,
    mine_side=100,
    mine_models=(),
    mine_extra_splits=(),
    mine_extra_models=(),
    tree_depths=(),
    tree_steps=0,
    tree_models=(),
    barbell_seeds=(0,),
    barbell_steps=800,
    barbell_models=("csnn", "gcn"),
    barbell_batch=32,
    barbell_lr=3e-3,
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


def train_and_evaluate(config, run_dir: str) -> list[dict]:
    """The run's evaluation rows ({"step", "eval/..."}), on one device."""
    result = train.run(config, methods.make(config), run_dir, devices=jax.devices()[:1])
    return [row for row in result.history if any(k.startswith("eval/") for k in row)]


def eval_rows(config, workdir: str, code: str, label: str) -> list[dict]:
    """`train_and_evaluate` through `core.cache`, keyed by the config and the code hash: a
    rerun (or a second process on other parts, `python -m methods.csnn.experiment
    --parts=...`) reads a finished run back; an edited config or source is a new run."""
    return cache.cached_run(train_and_evaluate, config, code, workdir, f"csnn/{label}")


def code_hash() -> str:
    return results.code_version("csnn")["source_hash"]


def minesweeper_run(model: str, split: int, setting: Setting, workdir: str, code: str) -> dict:
    config = config_for(
        "minesweeper", model, setting.mine_steps, split=split, side=setting.mine_side
    )
    rows = eval_rows(config, workdir, code, f"minesweeper {model} split {split}")
    best = max(rows, key=lambda r: r["eval/val_auroc"])
    return {"val": best["eval/val_auroc"], "test": best["eval/test_auroc"], "step": best["step"]}


def tree_run(model: str, depth: int, s: Setting, workdir: str, code: str) -> float:
    config = config_for("tree", model, s.tree_steps, depth=depth)
    rows = eval_rows(config, workdir, code, f"tree {model} depth {depth}")
    return rows[-1]["eval/test_accuracy"]


def barbell_run(model: str, seed: int, s: Setting, workdir: str, code: str) -> float:
    config = config_for("barbell", model, s.barbell_steps)
    config.seed = seed
    if s.barbell_batch is not None:
        config.train.batch_size = s.barbell_batch
    if s.barbell_lr is not None:
        config.optim.lr = s.barbell_lr
    rows = eval_rows(config, workdir, code, f"barbell {model} seed {seed}")
    return rows[-1]["eval/test_mse"]


def minesweeper_logged(model: str, split: int, s: Setting, workdir: str, code: str) -> dict:
    result = dict(minesweeper_run(model, split, s, workdir, code), split=split)
    print(f"minesweeper split {split} {model}: {result}", flush=True)
    return result


def parse_runs(spec: str) -> list[tuple[str, int]]:
    """`csnn@4,csnn:not_conformal@1` -> [("csnn", 4), ("csnn:not_conformal", 1)]."""
    runs = []
    for item in spec.split(","):
        model, _, split = item.partition("@")
        kind, _, ablation = model.partition(":")
        known = kind in csnn_config.KINDS and (not ablation or ablation in csnn_config.ABLATIONS)
        if not known or not split.isdigit():
            raise ValueError(f"--runs item {item!r} is not <model>@<split>, e.g. csnn@4")
        runs.append((model, int(split)))
    return runs


def mean(values) -> float:
    return float(np.mean(values)) if len(values) else float("nan")


PARTS = ("minesweeper", "minesweeper_extra", "tree", "barbell")


def measure(workdir: str, s: Setting, parts=PARTS) -> tuple[dict, dict, dict]:
    """(minesweeper, tree, barbell) results of the runs in `parts`."""
    code = code_hash()
    mine = {m: [] for m in (*s.mine_models, *s.mine_extra_models)}
    grid = {
        "minesweeper": (s.mine_splits, s.mine_models),
        "minesweeper_extra": (s.mine_extra_splits, s.mine_extra_models),
    }
    for splits, models in (grid[part] for part in grid if part in parts):
        for split in splits:
            for m in models:
                mine[m].append(minesweeper_logged(m, split, s, workdir, code))
    tree = {m: {} for m in s.tree_models}
    for depth in s.tree_depths if "tree" in parts else ():
        for m in s.tree_models:
            tree[m][depth] = tree_run(m, depth, s, workdir, code)
            print(f"tree depth {depth} {m}: {tree[m][depth]:.3f}", flush=True)
    barbell = {m: [] for m in s.barbell_models}
    for seed in s.barbell_seeds if "barbell" in parts else ():
        for m in s.barbell_models:
            barbell[m].append(barbell_run(m, seed, s, workdir, code))
            print(f"barbell seed {seed} {m}: {barbell[m][-1]:.3g}", flush=True)
    return mine, tree, barbell


def minus_csnn_by_split(mine: dict, model: str) -> dict[int, float]:
    """{split: test AUROC of `model` minus CSNN's on that split}, paired by split, not order."""
    csnn = {r["split"]: r["test"] for r in mine.get("csnn", [])}
    return {r["split"]: r["test"] - csnn[r["split"]] for r in mine.get(model, [])}


def paired_minus_csnn(mine: dict) -> dict:
    """Per model: its test AUROC minus CSNN's on the same splits, mean and standard error over
    the splits it ran (pairing removes the split-to-split spread, which is larger than the
    differences between CSNN and its ablations)."""
    out = {}
    for m in mine:
        diffs = list(minus_csnn_by_split(mine, m).values()) if m != "csnn" else []
        if not diffs:
            continue
        se = float(np.std(diffs, ddof=1) / np.sqrt(len(diffs))) if len(diffs) > 1 else None
        out[m] = {"mean": mean(diffs), "se": se, "splits": len(diffs)}
    return out


def run(workdir: str, quick: bool = False) -> Report:
    s = QUICK if quick else FULL
    mine, tree, barbell = measure(workdir, s)
    table = {
        "minesweeper_test_auroc": {m: mean([r["test"] for r in v]) for m, v in mine.items()},
        "minesweeper_split0_test_auroc": {
            m: r["test"] for m, v in mine.items() for r in v if r["split"] == 0
        },
        "minesweeper_minus_csnn_paired": paired_minus_csnn(mine),
        "minesweeper_csnn_minus_gcn_by_split": [
            -d for d in minus_csnn_by_split(mine, "gcn").values()
        ],
        "tree_accuracy": tree,
        "barbell_test_mse": {m: mean(v) for m, v in barbell.items()},
    }
    figure = os.path.join(workdir, "csnn_results.png")
    plot(table, figure)
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


def claims(table: dict, s: Setting, quick: bool) -> list[Claim]:
    out = []
    if s.mine_splits:
        mine = table["minesweeper_test_auroc"]
        out.append(
            Claim(
                "CSNN beats GCN clearly on Minesweeper (test AUROC, mean over splits)",
                "auroc_csnn - auroc_gcn",
                mine["csnn"] - mine["gcn"],
                ">=",
                MINE_MARGIN,
            )
        )
        out.append(
            Claim(
                "CSNN beats GCN on every Minesweeper split",
                "min over splits of auroc_csnn - auroc_gcn",
                min(table["minesweeper_csnn_minus_gcn_by_split"]),
                ">",
                0.0,
            )
        )
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
        out.append(
            Claim(
                "CSNN's barbell test MSE is below the constant predictor's",
                "mse_csnn / mse_constant",
                mse["csnn"] / tasks.barbell_constant_mse(),
                "<",
                1.0,
            )
        )
        ratio = QUICK_BARBELL_RATIO if quick else BARBELL_RATIO
        out.append(
            Claim(
                f"CSNN's barbell test MSE is at least {ratio:g}x below GCN's",
                "mse_gcn / mse_csnn",
                mse["gcn"] / mse["csnn"],
                ">=",
                ratio,
            )
        )
        if "csnn:source_equals_target" in mse:
            out.append(
                Claim(
                    f"Separate source and target maps matter: CSNN's barbell MSE is at least "
                    f"{BARBELL_RATIO:g}x below the S = T ablation's",
                    "mse_(S=T) / mse_csnn",
                    mse["csnn:source_equals_target"] / mse["csnn"],
                    ">=",
                    BARBELL_RATIO,
                )
            )
    return out


def plot(table: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mine = table["minesweeper_test_auroc"]
    has_tree = any(table["tree_accuracy"].values())
    has_barbell = bool(table["barbell_test_mse"])
    panels = 2 * bool(mine) + has_tree + has_barbell
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4), squeeze=False)
    axes = list(axes[0])
    if mine:
        ax = axes.pop(0)
        ax.barh(list(mine), list(mine.values()), color="tab:blue")
        ax.set_xlim(min(mine.values()) - 0.05, 1.0)
        ax.set_xlabel("Minesweeper test AUROC, mean over the splits each model ran")
        ax = axes.pop(0)
        paired = table["minesweeper_minus_csnn_paired"]
        labels = [f"{m} ({v['splits']} splits)" for m, v in paired.items()]
        errors = [v["se"] or 0.0 for v in paired.values()]
        ax.barh(labels, [v["mean"] for v in paired.values()], xerr=errors, color="tab:green")
        ax.axvline(0.0, color="k", lw=0.8)
        ax.set_xlabel("Minesweeper test AUROC minus CSNN's, same splits (mean +/- SE)")
    if has_tree:
        ax = axes.pop(0)
        for m, by_depth in table["tree_accuracy"].items():
            depths = sorted(by_depth)
            ax.plot(depths, [by_depth[d] for d in depths], marker="o", label=m)
        ax.set_xticks(sorted({d for v in table["tree_accuracy"].values() for d in v}))
        ax.set_xlabel("tree depth")
        ax.set_ylabel("Tree-NeighborsMatch test accuracy")
        ax.set_ylim(0, 1.05)
        ax.legend()
    if has_barbell:
        ax = axes.pop(0)
        mse = table["barbell_test_mse"]
        ax.barh(list(mse), list(mse.values()), color="tab:orange")
        ax.axvline(tasks.barbell_constant_mse(), color="k", ls="--", label="constant")
        ax.set_xscale("log")
        ax.set_xlabel("barbell test MSE (normalised)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    # Some of FULL's runs in this process, e.g. `--parts=tree,barbell` beside another process
    # running `--parts=minesweeper` on the same workdir (small graphs leave a core idle); then
    # `launch.reproduce --methods=csnn` with that workdir reads every run back from its cache.
    # `--runs=nsd@5,csnn:single_operator@2` runs chosen Minesweeper (model, split) pairs
    # instead, to share out the grid between processes by hand.
    args = dict(a.removeprefix("--").split("=", 1) for a in sys.argv[1:])
    if "runs" in args:
        for model, split in parse_runs(args["runs"]):
            minesweeper_logged(model, split, FULL, args["workdir"], code_hash())
    else:
        measure(args["workdir"], FULL, tuple(args.get("parts", ",".join(PARTS)).split(",")))
