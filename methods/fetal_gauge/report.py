"""Tables and the figure of a Fetal-Gauge results record (experiment.py's), from the record alone:
`python -m methods.fetal_gauge.report [results.json]` prints the README's tables."""

import json
import os
import sys

import numpy as np

from core import experiment_runner, results
from methods.fetal_gauge.vocab import TASKS

COLUMNS = (*TASKS, "VG_small", "VG_medium", "VG_large", "clinical/micro", "phantom/micro")


def chosen_rows(record: dict) -> dict[str, list[dict]]:
    """arm -> its rows at the point chosen on validation (every seed)."""
    chosen = experiment_runner.choices(record)
    key = record["config"]["arm_key"]
    out = {}
    for arm, sel in chosen.items():
        out[arm] = [
            r
            for r in record["rows"]
            if r[key] == arm and all(r.get(a) == v for a, v in sel.point.items())
        ]
    return out


def _cell(rows: list[dict], metric: str) -> str:
    values = [r[metric] for r in rows if metric in r]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{np.mean(values):.3f} ± {np.std(values, ddof=1) / np.sqrt(len(values)):.3f}"


def table(record: dict, split: str = "test") -> str:
    """Markdown: per arm (at its chosen point) the mean ± standard error over seeds of micro,
    macro, each task, VG by box bin and each style."""
    names = ("micro", "macro", "invalid_rate", *COLUMNS)
    head = "| arm | " + " | ".join(names) + " |"
    lines = [head, "|" + "---|" * (len(names) + 1)]
    for arm, rows in chosen_rows(record).items():
        cells = [_cell(rows, f"{split}/{n}") for n in names]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    chance = [_cell(next(iter(chosen_rows(record).values())), f"{split}/{t}/chance") for t in TASKS]
    lines.append("| chance | - | - | - | " + " | ".join(chance) + " |" + " - |" * 5)
    return "\n".join(lines)


def grid_table(record: dict) -> str:
    """Markdown: the trained arm's validation micro accuracy per learning rate and seed."""
    rows = [r for r in record["rows"] if r[record["config"]["arm_key"]] == "vlm/trained"]
    lrs = sorted({r["lr"] for r in rows})
    seeds = record["config"]["seeds"]
    lines = [
        "| lr | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |",
        "|---" * (len(seeds) + 2) + "|",
    ]
    for lr in lrs:
        values = {r["seed"]: r["validation/micro"] for r in rows if r["lr"] == lr}
        cells = [f"{values[s]:.3f}" if s in values else "-" for s in seeds]
        lines.append(
            f"| {lr:g} | " + " | ".join(cells) + f" | {np.mean(list(values.values())):.3f} |"
        )
    return "\n".join(lines)


def plot(record: dict, workdir: str) -> list[str]:
    """One figure: test accuracy per task, VG box bin and style, per arm (mean and standard
    error over seeds), with per-task chance marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows_by_arm = {a: r for a, r in chosen_rows(record).items() if a != "stub/oracle"}
    fig, ax = plt.subplots(figsize=(13, 4))
    width = 0.8 / len(rows_by_arm)
    x = np.arange(len(COLUMNS))
    for i, (arm, rows) in enumerate(rows_by_arm.items()):
        values = np.array([[r.get(f"test/{c}", np.nan) for c in COLUMNS] for r in rows])
        mean = np.nanmean(values, 0)
        err = np.nanstd(values, 0, ddof=1) / np.sqrt(len(rows)) if len(rows) > 1 else None
        ax.bar(x + (i - len(rows_by_arm) / 2 + 0.5) * width, mean, width, yerr=err, label=arm)
    first = next(iter(rows_by_arm.values()))[0]
    for j, task in enumerate(TASKS):
        c = first[f"test/{task}/chance"]
        ax.hlines(c, j - 0.45, j + 0.45, colors="k", linestyles="dashed", lw=1)
    ax.set_xticks(x, COLUMNS, rotation=20)
    ax.set(ylabel="test accuracy", ylim=(0, 1.02), title="Fetal-Gauge on generated phantoms")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    path = os.path.join(workdir, "fetal_gauge_accuracy.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        with open(argv[0]) as f:
            record = json.load(f)
    else:
        record = results.load("fetal_gauge", "full")
    print(table(record))
    print()
    print(grid_table(record))


if __name__ == "__main__":
    main()
