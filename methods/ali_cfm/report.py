"""The tables and figure of ALI-CFM's results record.

    python -m methods.ali_cfm.report [results.json]   # the README's table, from the record alone

`table(record)`: per data set and method, W1 (data units, mean ± standard deviation over seeds),
G's own W1 for ALI-CFM, and the flow's curvature energy. `plot(record, workdir)` (a full live
run, whose trained stages are in `workdir`): the flows' trajectories on the two 2-D sets, seed 0,
over the observed marginals (rotating GMM: the run that held out marginal 3).
"""

import json
import os
import sys

import jax
import numpy as np

from core import cache, checkpoint, experiment_runner, results
from methods.ali_cfm import batches, evaluation, nets, runs

COLUMNS = {"W1": "test/w1", "W1 of G": "test/w1_interp", "energy": "test/energy"}
FIGURE_SETS = {"rotating_gmm": 3, "knot": -1}  # data set -> the held-out marginal drawn
FIGURE_PATHS = 48  # trajectories drawn per panel


def _cell(values) -> str:
    values = np.asarray(values, float)
    spread = f" ± {values.std(ddof=1):.3g}" if len(values) > 1 else ""
    return f"{values.mean():.3g}{spread}"


def table(record: dict) -> str:
    head = ["data set", "method", *COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    chosen = experiment_runner.choices(record)
    for arm in chosen:
        rows = [r for r in record["rows"] if r["arm"] == arm]
        cells = []
        for metric in COLUMNS.values():
            have = [r[metric] for r in rows if metric in r]
            cells.append(_cell(have) if have else "-")
        dataset, method = arm.split("/")
        lines.append(f"| {dataset} | {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _stage_params(experiment, arm, workdir: str, held: int):
    """The last stage's u_theta of `arm` at seed 0 (None when that run is not in `workdir`)."""
    from methods import ali_cfm

    config = experiment.config_of(arm, {}, 0, False)
    code = results.source_hash(experiment.sources or results.run_sources(experiment.slug))
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


def plot(record: dict, workdir: str) -> list[str]:
    """Trajectories per method on the 2-D sets (seed 0), over every observed marginal."""
    del record
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from methods.ali_cfm.experiment import EXPERIMENT, NAMES, PLAN

    methods = PLAN["rotating_gmm"]
    fig, axes = plt.subplots(len(FIGURE_SETS), len(methods), figsize=(4 * len(methods), 8))
    for row, (dataset, held) in enumerate(FIGURE_SETS.items()):
        for col, method in enumerate(methods):
            ax = axes[row, col]
            arm = next(a for a in EXPERIMENT.arms if a.name == f"{dataset}/{method}")
            v, split = _stage_params(EXPERIMENT, arm, workdir, held)
            if v is None:
                ax.set_title(f"{arm.name}: not run here")
                continue
            for x_ND in split.train.samples:
                x_ND = split.train.denormalise(x_ND)
                ax.scatter(x_ND[:, 0], x_ND[:, 1], s=1, c="0.75")
            if split.held_samples is not None:
                x_ND = split.train.denormalise(split.held_samples)
                ax.scatter(x_ND[:, 0], x_ND[:, 1], s=1, c="tab:red", label="held out")
                ax.legend(loc="lower right", fontsize=7)
            path_TND = evaluation.flow_paths(v, split, n=FIGURE_PATHS, seed=0)
            ax.plot(path_TND[:, :, 0], path_TND[:, :, 1], lw=0.7, c="tab:blue", alpha=0.8)
            ax.set_title(f"{dataset}: {NAMES[method]}")
            ax.set_aspect("equal")
    fig.suptitle("ALI-CFM and baselines: flow trajectories from q_0 (seed 0)")
    fig.tight_layout()
    path = os.path.join(workdir, "ali_cfm.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def main(argv) -> None:
    if len(argv) > 1:
        with open(argv[1]) as f:
            record = json.load(f)
    else:
        record = results.load("ali_cfm", "full")
    print(table(record))


if __name__ == "__main__":
    main(sys.argv)
