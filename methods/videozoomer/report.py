"""The ablation table, the figure and example episodes of a VideoZoomer results record, from the
record alone: `python -m methods.videozoomer.report [results.json]` prints the README's table."""

import os
import sys

import numpy as np

KINDS = ("needle", "count", "order")
COLUMNS = (
    *(f"test/{k}/accuracy" for k in KINDS),
    "test/accuracy",
    "test/zooms",
    "test/zoomed",
    "test/frames",
)


def arms_in(record: dict) -> list[str]:
    return list(dict.fromkeys(r["arm"] for r in record["rows"]))


def _cell(rows, metric) -> str:
    values = np.array([r[metric] for r in rows if metric in r], float)
    if not len(values):
        return "-"
    spread = f" ± {values.std(ddof=1):.2f}" if len(values) > 1 else ""
    return f"{values.mean():.2f}{spread}"


def table(record: dict) -> str:
    """Markdown: per arm, accuracy per question kind and overall, zooms per episode, the share of
    episodes with a zoom, frames seen (mean ± standard deviation over seeds)."""
    head = "| arm | needle | count | order | all | zooms | zoomed | frames |"
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for arm in arms_in(record):
        rows = [r for r in record["rows"] if r["arm"] == arm]
        lines.append(f"| {arm} | " + " | ".join(_cell(rows, m) for m in COLUMNS) + " |")
    return "\n".join(lines)


def examples(record: dict, arm: str = "full", seed: int = 0) -> list[str]:
    row = next(r for r in record["rows"] if r["arm"] == arm and r["seed"] == seed)
    return list(row.get("examples", []))


def plot(record: dict, out_dir: str) -> list[str]:
    """videozoomer.png: accuracy per question kind for every arm (mean over seeds, each seed a
    dot), and accuracy against frames seen per episode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = arms_in(record)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.2))
    width = 0.8 / len(KINDS)
    for k, kind in enumerate(KINDS):
        metric = f"test/{kind}/accuracy"
        per_arm = [[r[metric] for r in record["rows"] if r["arm"] == a] for a in arms]
        x = np.arange(len(arms)) + (k - 1) * width
        left.bar(x, [np.mean(v) for v in per_arm], width, label=kind)
        for xi, values in zip(x, per_arm, strict=True):
            left.plot([xi] * len(values), values, "k.", ms=3)
    left.set_xticks(np.arange(len(arms)), arms, rotation=30, ha="right")
    left.set_ylabel("held-out accuracy")
    left.legend()
    for arm in arms:
        rows = [r for r in record["rows"] if r["arm"] == arm]
        frames = [r["test/frames"] for r in rows]
        right.scatter(frames, [r["test/accuracy"] for r in rows], label=arm, s=18)
    right.set_xlabel("frames seen per episode")
    right.set_ylabel("accuracy (all kinds)")
    right.legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(out_dir, "videozoomer.png")
    os.makedirs(out_dir, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def main(argv) -> None:
    import json

    path = argv[1] if len(argv) > 1 else "methods/videozoomer/results/full.json"
    with open(path) as f:
        record = json.load(f)
    print(table(record))
    print()
    print("\n".join(examples(record)))


if __name__ == "__main__":
    main(sys.argv)
