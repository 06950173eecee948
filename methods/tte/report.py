"""The tables and figure of TTE's results records, from the records alone:
`python -m methods.tte.report [results.json]` prints the README's per-family table (test P@1 at
each arm's validation-chosen learning rate, mean ± standard deviation over seeds) of the image
part, and of the plain-text part when its record exists (or the given file is one)."""

import json
import os
import sys

import numpy as np

from core import experiment_runner
from methods.tte import tasks

COLUMNS = (*tasks.FAMILIES, "compositional", "mean")
METRICS = {c: f"test/p1/{c}" for c in COLUMNS}
TEXT_METRICS = {  # the plain-text part: unseen pairs per family, then both groups' means
    **{f"{f} unseen": f"test/unseen/p1/{f}" for f in tasks.TEXT_FAMILIES},
    "unseen mean": "test/unseen/p1/mean",
    "seen mean": "test/seen/p1/mean",
}


def _cell(values) -> str:
    values = np.asarray(values, float)
    spread = f" ± {values.std(ddof=1):.3f}" if len(values) > 1 else ""
    return f"{values.mean():.3f}{spread}"


def _is_text(record: dict) -> bool:
    return record["run"].endswith("_text")


def per_seed(record: dict) -> dict:
    """{arm: {column: [test P@1 per seed]}} at each arm's chosen point, plus its lr and the
    reasoner's trace quality where it has one: the exact-match rate of TTE_s's traces, the
    accuracy of SmolLM2's answers on the test pairs."""
    metrics = TEXT_METRICS if _is_text(record) else METRICS
    extra = "lm_accuracy/test" if _is_text(record) else "test/trace_exact"
    chosen = experiment_runner.choices(record)
    out = {}
    for arm, sel in chosen.items():
        cols = {c: experiment_runner.reported(record, arm, m, chosen) for c, m in metrics.items()}
        arm_rows = {c: list(v.values()) for c, v in cols.items()}
        arm_rows["lr"] = sel.point.get("lr")
        rows = [r for r in record["rows"] if r["arm"] == arm and extra in r]
        if rows:
            arm_rows["trace"] = [r[extra] for r in rows if r["lr"] == sel.point["lr"]]
        out[arm] = arm_rows
    return out


def table(record: dict) -> str:
    data = per_seed(record)
    columns = list(TEXT_METRICS if _is_text(record) else METRICS)
    last = "LM accuracy (test pairs)" if _is_text(record) else "trace exact"
    head = ["arm", "lr", *columns, last]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, d in data.items():
        lr = "-" if d["lr"] is None else f"{d['lr']:g}"
        trace = _cell(d["trace"]) if d.get("trace") else "-"
        lines.append(
            f"| {arm} | {lr} | " + " | ".join(_cell(d[c]) for c in columns) + f" | {trace} |"
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
        print(table(record))
        return
    print(table(results.load("tte", "full")))
    if os.path.exists(results.path("tte", "full_text")):
        print()
        print(table(results.load("tte", "full_text")))


if __name__ == "__main__":
    main(sys.argv)
