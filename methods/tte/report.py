"""The table and figure of a TTE results record, from the record alone:
`python -m methods.tte.report [results.json]` prints the README's per-family table (test P@1 at
each arm's validation-chosen learning rate, mean ± standard deviation over seeds)."""

import json
import os
import sys

import numpy as np

from core import experiment_runner
from methods.tte import tasks

COLUMNS = (*tasks.FAMILIES, "compositional", "mean")


def _cell(values) -> str:
    values = np.asarray(values, float)
    spread = f" ± {values.std(ddof=1):.3f}" if len(values) > 1 else ""
    return f"{values.mean():.3f}{spread}"


def per_seed(record: dict) -> dict:
    """{arm: {column: [test P@1 per seed]}} at each arm's chosen point, plus its lr and, for the
    reasoner's traces, their exact-match rate."""
    chosen = experiment_runner.choices(record)
    out = {}
    for arm, sel in chosen.items():
        cols = {c: experiment_runner.reported(record, arm, f"test/p1/{c}", chosen) for c in COLUMNS}
        arm_rows = {c: list(v.values()) for c, v in cols.items()}
        arm_rows["lr"] = sel.point.get("lr")
        rows = [r for r in record["rows"] if r["arm"] == arm and "test/trace_exact" in r]
        if rows:
            arm_rows["trace_exact"] = [
                r["test/trace_exact"] for r in rows if r["lr"] == sel.point["lr"]
            ]
        out[arm] = arm_rows
    return out


def table(record: dict) -> str:
    data = per_seed(record)
    head = ["arm", "lr", *COLUMNS, "trace exact"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, d in data.items():
        lr = "-" if d["lr"] is None else f"{d['lr']:g}"
        exact = _cell(d["trace_exact"]) if d.get("trace_exact") else "-"
        lines.append(
            f"| {arm} | {lr} | " + " | ".join(_cell(d[c]) for c in COLUMNS) + f" | {exact} |"
        )
    return "\n".join(lines)


def plot(record: dict, workdir: str) -> list[str]:
    """A grouped bar chart: test P@1 per family and arm (mean over seeds, standard deviation)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = per_seed(record)
    arms = list(data)
    fig, ax = plt.subplots(figsize=(12, 4))
    width = 0.8 / len(arms)
    x = np.arange(len(COLUMNS))
    for i, arm in enumerate(arms):
        means = [np.mean(data[arm][c]) for c in COLUMNS]
        stds = [np.std(data[arm][c], ddof=1) if len(data[arm][c]) > 1 else 0 for c in COLUMNS]
        ax.bar(x + i * width, means, width, yerr=stds, label=arm, capsize=2)
    ax.set_xticks(x + 0.4 - width / 2, COLUMNS)
    ax.set_ylabel("test Precision@1 (1,000 candidates)")
    ax.set_ylim(0, 1)
    ax.legend(ncol=5, fontsize=8, loc="upper left")
    ax.set_title("Think-Then-Embed on digits retrieval: arms by family (3 seeds)")
    fig.tight_layout()
    path = os.path.join(workdir, "tte.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def main(argv) -> None:
    from core import results

    if len(argv) > 1:
        with open(argv[1]) as f:
            record = json.load(f)
    else:
        record = results.load("tte", "full")
    print(table(record))


if __name__ == "__main__":
    main(sys.argv)
