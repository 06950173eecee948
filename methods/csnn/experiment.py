"""CSNN's claims at CPU scale on the experiment protocol (issue 26): Minesweeper against GCN and
SAGE tuned by one rule, Tree-NeighborsMatch under two protocols, the barbell. Every run goes
through `core.train` with `configs/csnn.py` and `core.cache.cached_run` (keyed by its config
and the code hash); every run is a row of one `core.results` record, and the claims, tables
and figure are derived from that record alone (`report.py`; `claims_from_results` here is where
`launch.reproduce` reads them), so `launch.reproduce --methods=csnn --from_results` re-derives
them from `results/full.json`. Each run's numbers are `methods.csnn`'s evaluation streams:
`eval/val_auroc` and `eval/test_auroc` (Minesweeper), `eval/train/accuracy` and
`eval/test/accuracy` (the tree), `eval/test/mse` (the barbell).

- Minesweeper: every model (CSNN, GCN, SAGE) gets the same grid (MINE_GRID: normalisation x
  learning rate), the same steps and the same rule: each grid point runs on the selection
  splits, `core.selection.select` takes the point of best mean validation AUROC (rule max; in
  the full run `require_interior` refuses a choice on the learning rate's edge), and the
  chosen point then runs on the other claim splits. A run's test AUROC is read at its step of
  best validation AUROC (early stopping); test numbers choose nothing.
- Tree-NeighborsMatch, two protocols side by side (configs/csnn.py): "fresh" (ours: undirected
  edges, fresh trees every step, accuracy on fresh trees at the end) and "benchmark" (Alon &
  Yahav's code: edges from child to parent, a fixed training set, LayerNorm, a plateau
  schedule; the number is the best training accuracy over the evaluations, as their
  `Experiment.run` returns, with the held-out accuracy at that evaluation beside it).
- Barbell: test MSE on fresh graphs against the exact constant-predictor MSE.

Claims (report.py; IntervalClaims: 95 % bootstrap intervals over splits or seeds, paired by key):
- Minesweeper: CSNN beats GCN by MINE_MARGIN and beats SAGE (test AUROC, paired by split).
- Tree, per protocol, at tree_claim_depth: CSNN's accuracy is at least TREE_KEEP and (from
  TREE_GAP_FROM, the depth where GCN is expected to fail) beats GCN's by TREE_GAP (paired by
  seed).
- Barbell: CSNN's MSE is below the constant predictor's, and BARBELL_DECADES decades (10x)
  below GCN's and the S = T ablation's (log10 ratios paired by seed).
The quick run (`--quick`, QUICK) is the barbell alone, CSNN and GCN on three seeds, with the
GCN claim at QUICK_BARBELL_DECADES: a smoke check of the mechanism, not the paper's numbers.

    python -m methods.csnn.experiment --workdir=W --parts=minesweeper --models=csnn  # a share
    python -m methods.csnn.experiment   # the README's tables from results/full.json
"""

import dataclasses
import itertools
import sys

import jax

import methods
from configs import csnn as csnn_config
from core import cache, results, selection, train
from core.claims import IntervalClaim, Report
from core.errors import ConfigError

MINE_VALIDATION = "val/auroc"
# "layernorm" is the official Minesweeper script's pair, LayerNorm after every layer and input
# dropout 0.2, which the pre-protocol run dropped for CSNN alone (chosen on its validation).
NORMS = {"none": dict(layer_norm=False, input_dropout=0.0),
         "layernorm": dict(layer_norm=True, input_dropout=0.2)}  # fmt: skip
# lr: the first full run (2026-12-02) chose 4e-3, the edge of {1e-3, 2e-3, 4e-3} (CSNN, no norm:
# validation AUROC .940 / .947 / .949), then 8e-3 (.952), so the grid grew twice, for every model.
MINE_GRID = {"norm": tuple(NORMS), "lr": (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2)}


@dataclasses.dataclass(frozen=True)
class Setting:
    mine_models: tuple[str, ...]  # "kind" or "csnn:<ablation>"; each gets the whole grid
    mine_grid: dict  # axis -> values, axes in grid order
    mine_select_splits: tuple[int, ...]  # their validation AUROC chooses each model's point
    mine_splits: tuple[int, ...]  # the claims' splits (test AUROC at the chosen point)
    mine_steps: int
    mine_ablations: tuple[str, ...]  # CSNN ablations at CSNN's chosen point, on mine_splits
    tree_protocols: tuple[str, ...]
    tree_depths: tuple[int, ...]
    tree_models: tuple[str, ...]
    tree_seeds: tuple[int, ...]
    tree_steps: int
    barbell_models: tuple[str, ...]
    barbell_seeds: tuple[int, ...]
    barbell_steps: int
    barbell_batch: int | None = None  # graphs a step; None: configs/csnn.py's
    barbell_lr: float | None = None  # None: configs/csnn.py's
    tree_claim_depth: int | None = None
    require_interior: bool = True  # refuse a Minesweeper choice on the grid's edge


ABLATED = ("csnn:source_equals_target", "csnn:not_conformal", "csnn:single_operator")
# Sized for ~60-90 min of an idle 2-core machine in two processes (README, "protocol (pending
# rerun)"): Minesweeper 3 splits (the grid on split 0) at 300 steps, the tree at depth 3 only,
# no NSD-style model and no Minesweeper ablations (their pre-protocol numbers stand beside).
FULL = Setting(
    mine_models=("csnn", "gcn", "sage"),
    mine_grid=MINE_GRID,
    mine_select_splits=(0,),
    mine_splits=(0, 1, 2),
    mine_steps=300,
    mine_ablations=(),
    tree_protocols=("fresh", "benchmark"),
    tree_depths=(3,),
    tree_models=("csnn", "gcn"),
    tree_seeds=(0, 1, 2),
    tree_steps=3000,
    tree_claim_depth=3,
    barbell_models=("csnn", "gcn", "csnn:source_equals_target", "csnn:single_operator"),
    barbell_seeds=(0, 1, 2),
    barbell_steps=3000,
)
# The barbell, where GCN fails by construction (a node cannot hear the other clique without its
# own clique flooding the bridge), at a higher learning rate and half the graphs a step: CSNN
# leaves its plateau near the constant predictor's MSE within 500-700 steps. Not Minesweeper:
# on the full graph 150 steps of CSNN and GCN took 185 s (most of it CSNN's 0.45 s steps), and
# on a 40 x 40 grid (800 train nodes) CSNN and GCN tie after 200 steps (measured test AUROC .886
# vs .893 and .908 vs .901 on two splits).
QUICK = Setting(
    mine_models=(),
    mine_grid=MINE_GRID,
    mine_select_splits=(),
    mine_splits=(),
    mine_steps=0,
    mine_ablations=(),
    tree_protocols=(),
    tree_depths=(),
    tree_models=(),
    tree_seeds=(),
    tree_steps=0,
    barbell_models=("csnn", "gcn"),
    barbell_seeds=(0, 1, 2),
    barbell_steps=800,
    barbell_batch=32,
    barbell_lr=3e-3,
    require_interior=False,
)


def config_for(task: str, model: str, steps: int, **options):
    kind, _, ablation = model.partition(":")
    arg = f"task={task},model={kind},ablation={ablation or 'none'}"
    arg += "".join(f",{k}={v}" for k, v in options.items())
    config = csnn_config.get_config(arg)
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
    """The run cache's code key: not this file, so that a widened grid refits only its new
    points (issue 26's first full run found the old key, over every csnn file, did not)."""
    return results.source_hash(results.run_sources("csnn"))


# --- the runs, each one results row --------------------------------------------------------------


def minesweeper_row(model: str, split: int, point: dict, s: Setting, workdir, code) -> dict:
    config = config_for("minesweeper", model, s.mine_steps, split=split)
    config.model.update(NORMS[point["norm"]])
    config.optim.lr = point["lr"]
    label = f"minesweeper {model} split {split} {point}"
    rows = eval_rows(config, workdir, code, label)
    best = max(rows, key=lambda r: r["eval/val_auroc"])  # early stopping on validation
    row = {"task": "minesweeper", "model": model, "split": split, **point}
    row |= {"val_auroc": best["eval/val_auroc"], "test_auroc": best["eval/test_auroc"]}
    print(f"{label}: val {row['val_auroc']:.4f} test {row['test_auroc']:.4f}", flush=True)
    return row | {"step": best["step"]}


def tree_row(model: str, protocol: str, depth: int, seed: int, s: Setting, workdir, code):
    config = config_for("tree", model, s.tree_steps, depth=depth, protocol=protocol)
    config.seed = seed
    label = f"tree {protocol} {model} depth {depth} seed {seed}"
    rows = eval_rows(config, workdir, code, label)
    row = {"task": "tree", "protocol": protocol, "model": model, "depth": depth, "seed": seed}
    if protocol == "benchmark":  # the best training accuracy, as the benchmark reports it
        best = max(rows, key=lambda r: r["eval/train/accuracy"])
        row |= {"accuracy": best["eval/train/accuracy"], "heldout": best["eval/test/accuracy"]}
    else:
        best = rows[-1]
        row["accuracy"] = best["eval/test/accuracy"]
    print(f"{label}: accuracy {row['accuracy']:.3f}", flush=True)
    return row | {"step": best["step"]}


def barbell_row(model: str, seed: int, s: Setting, workdir, code) -> dict:
    config = config_for("barbell", model, s.barbell_steps)
    config.seed = seed
    if s.barbell_batch is not None:
        config.train.batch_size = s.barbell_batch
    if s.barbell_lr is not None:
        config.optim.lr = s.barbell_lr
    label = f"barbell {model} seed {seed}"
    mse = eval_rows(config, workdir, code, label)[-1]["eval/test/mse"]
    print(f"{label}: {mse:.3g}", flush=True)
    return {"task": "barbell", "model": model, "seed": seed, "test_mse": mse}


def grid_points(grid: dict) -> list[dict]:
    """The grid's points as dicts, in `selection.select`'s order (the last axis fastest)."""
    return [dict(zip(grid, p, strict=True)) for p in itertools.product(*grid.values())]


def choose(rows: list[dict], model: str, s: Setting) -> selection.Selection:
    """The model's grid point of best mean validation AUROC over the selection splits."""
    keys = tuple(s.mine_grid)
    by_point = {}
    for r in rows:
        if (
            r["task"] == "minesweeper"
            and r["model"] == model
            and r["split"] in s.mine_select_splits
        ):
            by_point.setdefault(tuple(r[k] for k in keys), {})[r["split"]] = r["val_auroc"]
    scores = selection.ValidationScores(MINE_VALIDATION, by_point)
    return selection.select(s.mine_grid, scores, rule="max")


def minesweeper_rows(s: Setting, workdir, code, models=None) -> list[dict]:
    rows = []
    for model in s.mine_models if models is None else models:
        for point in grid_points(s.mine_grid):
            for split in s.mine_select_splits:
                rows.append(minesweeper_row(model, split, point, s, workdir, code))
        chosen = choose(rows, model, s).point
        rest = [sp for sp in s.mine_splits if sp not in s.mine_select_splits]
        ablations = s.mine_ablations if model == "csnn" else ()
        for split in rest:
            rows.append(minesweeper_row(model, split, chosen, s, workdir, code))
        for ablated in ablations:
            for split in s.mine_splits:
                rows.append(minesweeper_row(ablated, split, chosen, s, workdir, code))
    return rows


PARTS = ("minesweeper", "tree", "barbell")


def measure(workdir: str, s: Setting, parts=PARTS, models=None) -> list[dict]:
    """Every row of the runs in `parts` (`models`: only these Minesweeper models, to share the
    grid out between processes on one workdir)."""
    code = code_hash()
    rows = minesweeper_rows(s, workdir, code, models) if "minesweeper" in parts else []
    for protocol in s.tree_protocols if "tree" in parts else ():
        for depth in s.tree_depths:
            for seed in s.tree_seeds:
                for m in s.tree_models:
                    rows.append(tree_row(m, protocol, depth, seed, s, workdir, code))
    for seed in s.barbell_seeds if "barbell" in parts else ():
        for m in s.barbell_models:
            rows.append(barbell_row(m, seed, s, workdir, code))
    return rows


def setting_json(s: Setting) -> dict:
    out = dataclasses.asdict(s)
    out["mine_grid"] = {axis: list(values) for axis, values in s.mine_grid.items()}
    return out


def setting_from(record: dict) -> Setting:
    config = dict(record["config"])
    config["mine_grid"] = {axis: tuple(v) for axis, v in config["mine_grid"].items()}
    return Setting(**{k: tuple(v) if isinstance(v, list) else v for k, v in config.items()})


def claims_from_results(record: dict) -> list[IntervalClaim]:
    """The record's claims (`report.claims_from_results`), where `launch.reproduce` reads them."""
    from methods.csnn import report  # on use: report.py reads this module's setting

    return report.claims_from_results(record)


def run(workdir: str, quick: bool = False) -> Report:
    from methods.csnn import report  # on use, as in claims_from_results

    s = QUICK if quick else FULL
    record = results.record(
        "csnn",
        "quick" if quick else "full",
        config=setting_json(s),
        rows=measure(workdir, s),
    )
    return Report.from_record(  # claims_from_results also refuses an unfinished grid
        record,
        claims_from_results=report.claims_from_results,
        table=report.table,
        plots={"csnn_results.png": report.plot},
        workdir=workdir,
        quick=quick,
    )


def main(argv: list[str]) -> None:
    """`--workdir=W [--parts=minesweeper,tree,barbell] [--models=csnn,...]`: FULL's runs in
    those parts, into W's cache, beside another process on other parts (small graphs leave a
    core idle); `launch.reproduce --methods=csnn --out=...` with that workdir then reads every
    run back. Without arguments: the README's tables from the committed results."""
    args = dict(a.removeprefix("--").split("=", 1) for a in argv)
    if "workdir" not in args:
        from methods.csnn import report

        print(report.table(results.load("csnn", "full")))
        return
    parts = tuple(args.get("parts", ",".join(PARTS)).split(","))
    unknown = [p for p in parts if p not in PARTS]
    models = tuple(args["models"].split(",")) if "models" in args else None
    if unknown or (models and set(models) - set(FULL.mine_models)):
        raise ConfigError(f"--parts from {PARTS}, --models from {FULL.mine_models}; got {argv}")
    measure(args["workdir"], FULL, parts, models)


if __name__ == "__main__":
    main(sys.argv[1:])
