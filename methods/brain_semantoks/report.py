"""The table and figure of a Brain-Semantoks results record, from the record alone:
`python -m methods.brain_semantoks.report [results.json]` prints the README's table."""

import os
import sys

import numpy as np

COLUMNS = ("test/id/a", "test/id/b", "test/id/mean", "test/ood/a", "test/ood/b", "test/ood/mean")
SCALING = {"subjects_500": 500, "subjects_1000": 1000, "ssl": 2000, "subjects_4000": 4000}
COLLAPSE = ("proj_std", "effective_rank", "token_cosine")


def arms_in(record: dict) -> list[str]:
    return list(dict.fromkeys(r["arm"] for r in record["rows"]))


def _values(record, arm, metric) -> np.ndarray:
    return np.array([r[metric] for r in record["rows"] if r["arm"] == arm and metric in r], float)


def _cell(values) -> str:
    if not len(values):
        return "-"
    spread = f" ± {values.std(ddof=1):.3f}" if len(values) > 1 else ""
    return f"{values.mean():.3f}{spread}"


def table(record: dict) -> str:
    """Markdown: per arm, test balanced accuracy on phenotypes A and B and their mean, in
    distribution and on the shifted site (mean ± standard deviation over seeds)."""
    lines = ["| arm | A | B | mean | OOD A | OOD B | OOD mean |", "|---|---|---|---|---|---|---|"]
    for arm in arms_in(record):
        cells = " | ".join(_cell(_values(record, arm, m)) for m in COLUMNS)
        lines.append(f"| {arm} | {cells} |")
    return "\n".join(lines)


def plot(record: dict, out_dir: str) -> list[str]:
    """brain_semantoks.png: probe accuracy against pretraining subjects (in distribution and on
    the shifted site, each seed a dot), and the collapse diagnostics over training for the TTR
    arms (seed 0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = arms_in(record)
    fig, axes = plt.subplots(1, 1 + len(COLLAPSE), figsize=(17, 3.8))
    scaling = [a for a in SCALING if a in arms]
    for metric, label in (("test/id/mean", "in distribution"), ("test/ood/mean", "shifted site")):
        xs = [SCALING[a] for a in scaling]
        means = [_values(record, a, metric).mean() for a in scaling]
        axes[0].plot(xs, means, "o-", label=label)
        for x, a in zip(xs, scaling, strict=True):
            v = _values(record, a, metric)
            axes[0].plot([x] * len(v), v, "k.", ms=3)
    for base, style in (("random_init", ":"), ("fc", "--")):
        if base in arms:
            axes[0].axhline(_values(record, base, "test/id/mean").mean(), ls=style, c="gray",
                            label=f"{base} (in distribution)")  # fmt: skip
    axes[0].set_xscale("log")
    axes[0].set_xlabel("pretraining subjects")
    axes[0].set_ylabel("balanced accuracy (mean of A, B)")
    axes[0].legend(fontsize=7)
    for ax, key in zip(axes[1:], COLLAPSE, strict=True):
        for arm in ("ssl", "no_ttr", "always_ttr"):
            row = next((r for r in record["rows"] if r["arm"] == arm and r["seed"] == 0), None)
            if row and f"collapse/{key}" in row:
                ax.plot(row["collapse/step"], row[f"collapse/{key}"], label=arm)
        ax.set_xlabel("step")
        ax.set_title(f"teacher {key.replace('_', ' ')}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(out_dir, "brain_semantoks.png")
    os.makedirs(out_dir, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def main(argv) -> None:
    import json

    path = argv[1] if len(argv) > 1 else "methods/brain_semantoks/results/full.json"
    with open(path) as f:
        print(table(json.load(f)))


if __name__ == "__main__":
    main(sys.argv)
