"""The tables and figure of ALI-CFM's results record.

    python -m methods.ali_cfm.report [results.json]   # the README's tables, from the records alone

`table(record)`: per data set and method, W1 (data units, mean ± standard deviation over seeds),
G's own W1 for ALI-CFM, and the flow's curvature energy. `plot(records, workdir)` (a full live
run, whose trained stages are in `workdir`): the flows' trajectories on the 2-D sets of every
part, seed 0, over the observed marginals (rotating GMMs: the runs that held out marginal 3).
"""

import json
import os
import sys

import jax
import numpy as np

from core import cache, checkpoint, experiment_runner, results
from methods.ali_cfm import batches, evaluation, nets, runs

COLUMNS = {"W1": "test/w1", "W1 of G": "test/w1_interp", "energy": "test/energy"}
# (record, data set, the held-out marginal drawn): the rows of the trajectory figure.
FIGURE_ROWS = (
    ("full", "rotating_gmm", 3),
    ("full_gmm1", "rotating_gmm1", 3),
    ("full", "knot", -1),
    ("full_knot", "knot_val", -1),
)
FIGURE_PATHS = 48  # trajectories drawn per panel


def _cell(values) -> str:
    values = np.asarray(values, float)
    spread = f" ± {values.std(ddof=1):.3g}" if len(values) > 1 else ""
    return f"{values.mean():.3g}{spread}"


def table(record: dict) -> str:
    """One row per arm at its chosen point (a grid arm: the setting validation chose, and its
    validation W1 beside the test columns)."""
    chosen = experiment_runner.choices(record)
    grids = any(sel.point for sel in chosen.values())
    columns = {**COLUMNS, "validation W1": "validation/w1"} if grids else COLUMNS
    head = ["data set", "method", *(["chosen"] if grids else []), *columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, sel in chosen.items():
        rows = [
            r
            for r in record["rows"]
            if r["arm"] == arm and all(r.get(k) == v for k, v in sel.point.items())
        ]
        cells = [", ".join(f"{k} {v:g}" for k, v in sel.point.items())] if grids else []
        for metric in columns.values():
            have = [r[metric] for r in rows if metric in r]
            cells.append(_cell(have) if have else "-")
        dataset, method = arm.split("/")
        lines.append(f"| {dataset} | {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _stage_params(experiment, arm, point: dict, workdir: str, held: int):
    """The last stage's u_theta of `arm` at `point`, seed 0 (None when that run is not in
    `workdir`)."""
    from methods import ali_cfm

    config = experiment.config_of(arm, point, 0, False)
    code = experiment_runner.code_key(experiment)
    roles = runs.ARMS[arm.settings["method"]]
    stage = os.path.join(workdir, "runs", cache.key(config, code), f"held{held}", roles[-1])
    if not os.path.isdir(stage):
        return None, None
    c = runs.stage_config(config, roles[-1], held, "")
    split = batches.split_marginals(ali_cfm.data_of(c), held)
    dim, width = split.train.samples[0].shape[1], c.ali.width
    init = lambda k: {"v": nets.init_velocity(k, dim, width)}
    params = checkpoint.run_params(stage, init, what=f"{arm.name} stage")
    return jax.tree.map(np.asarray, params["v"]), split


def _panel(ax, experiment, record, dataset: str, method: str, held: int, workdir: str):
    from methods.ali_cfm.experiment import NAMES

    arm = next(a for a in experiment.arms if a.name == f"{dataset}/{method}")
    point = experiment_runner.choices(record)[arm.name].point
    v, split = _stage_params(experiment, arm, point, workdir, held)
    if v is None:
        ax.set_title(f"{arm.name}: not run here")
        return
    for x_ND in split.train.samples:
        x_ND = split.train.denormalise(x_ND)
        ax.scatter(x_ND[:, 0], x_ND[:, 1], s=1, c="0.75")
    if split.held_samples is not None:
        x_ND = split.train.denormalise(split.held_samples)
        ax.scatter(x_ND[:, 0], x_ND[:, 1], s=1, c="tab:red", label="held out")
        ax.legend(loc="lower right", fontsize=7)
    path_TND = evaluation.flow_paths(v, split, n=FIGURE_PATHS, seed=0)
    ax.plot(path_TND[:, :, 0], path_TND[:, :, 1], lw=0.7, c="tab:blue", alpha=0.8)
    chosen = ", ".join(f"{k} {v:g}" for k, v in point.items())
    ax.set_title(f"{dataset}: {NAMES[method]}" + (f" ({chosen})" if chosen else ""), fontsize=9)
    ax.set_aspect("equal")


def plot(records: list[dict], workdir: str) -> list[str]:
    """Trajectories per method on the 2-D sets (seed 0, each arm at its chosen setting), over
    every observed marginal; a row per `FIGURE_ROWS` entry whose record is in `records`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from methods.ali_cfm.experiment import EVERY_PART, EXPERIMENT, PLAN

    by_run = {r["run"]: r for r in records}
    parts = {e.run_name(False): e for e in (EXPERIMENT, *EVERY_PART.values())}
    rows = [row for row in FIGURE_ROWS if row[0] in by_run]
    methods = PLAN["rotating_gmm"]
    fig, axes = plt.subplots(
        len(rows), len(methods), figsize=(4 * len(methods), 4 * len(rows)), squeeze=False
    )
    for (run, dataset, held), ax_row in zip(rows, axes, strict=True):
        for method, ax in zip(methods, ax_row, strict=True):
            _panel(ax, parts[run], by_run[run], dataset, method, held, workdir)
    fig.suptitle("ALI-CFM and baselines: flow trajectories from q_0 (seed 0)")
    fig.tight_layout()
    path = os.path.join(workdir, "ali_cfm.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


def main(argv) -> None:
    if len(argv) > 1:
        with open(argv[1]) as f:
            record = json.load(f)
        print(table(record))
        return
    from methods.ali_cfm.experiment import RESULT_RUNS

    for run in RESULT_RUNS:
        print(f"{run}:\n{table(results.load('ali_cfm', run))}\n")


if __name__ == "__main__":
    main(sys.argv)
