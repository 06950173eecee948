"""The scorecard of one benchmark run: scores.json (every number of `scoring.score`), report.md
(tables a reader can check against the paper's: per task, overall, position bias, breakdowns)
and accuracy.png (per-task accuracy with its interval and the task's chance level)."""

import json
import os

from core.errors import ConfigError


def _pct(value: float) -> str:
    return f"{100.0 * value:.1f}"


def _interval(row: dict) -> str:
    return f"{_pct(row['accuracy'])} [{_pct(row['low'])}, {_pct(row['high'])}]"


def task_table(scores: dict) -> str:
    """The per-task table (markdown), micro and macro rows last; also what the CLI prints."""
    level = _pct(scores.get("level", 0.95)).rstrip("0").rstrip(".")
    lines = [
        f"| task | n | accuracy % [{level} % interval] | chance % | invalid % |",
        "|---|---:|---|---:|---:|",
    ]
    for task, row in scores["tasks"].items():
        lines.append(
            f"| {task} | {row['n']} | {_interval(row)} | {_pct(row['chance'])} "
            f"| {_pct(row['invalid_rate'])} |"
        )
    invalid = _pct(scores["invalid_rate"])
    lines.append(
        f"| overall (micro) | {scores['n']} | {_interval(scores['micro'])} "
        f"| {_pct(scores['chance_micro'])} | {invalid} |"
    )
    lines.append(
        f"| mean of tasks (macro) | {scores['n']} | {_interval(scores['macro'])} "
        f"| {_pct(scores['chance_macro'])} | |"
    )
    return "\n".join(lines)


def _position_table(scores: dict) -> str:
    letters = sorted({letter for row in scores["position_bias"].values() for letter in row})
    head = "| task | " + " | ".join(f"correct {x}: n, acc %" for x in letters)
    head += " | predicted " + " / ".join(letters) + " % |"
    lines = [head, "|---|" + "---|" * (len(letters) + 1)]
    for task, row in scores["position_bias"].items():
        cells = [f"{row[x]['n']}, {_pct(row[x]['accuracy'])}" if x in row else "" for x in letters]
        predicted = scores["predicted_letters"].get(task, {})
        shown = set(row) | set(predicted)  # a letter the task never offers stays blank
        shares = " / ".join(_pct(predicted.get(x, 0.0)) if x in shown else "" for x in letters)
        lines.append(f"| {task} | " + " | ".join(cells) + f" | {shares} |")
    return "\n".join(lines)


def _breakdown_tables(scores: dict) -> list[str]:
    parts = []
    for field, by_task in scores["by"].items():
        if not by_task:
            continue
        lines = [f"### by {field}", "", f"| task | {field} | n | accuracy % [interval] |"]
        lines.append("|---|---|---:|---|")
        for task, by_value in by_task.items():
            for value, row in by_value.items():
                lines.append(f"| {task} | {value} | {row['n']} | {_interval(row)} |")
        parts.append("\n".join(lines))
    return parts


def report_markdown(scores: dict, *, title: str) -> str:
    return "\n\n".join(
        [
            f"# {title}",
            f"{scores['n']} questions. Intervals: percentile bootstrap, {scores.get('n_boot')} "
            "resamples (macro resampled within each task). Invalid = no option could be read "
            "from the answer (scored wrong).",
            task_table(scores),
            "## Position bias",
            "Accuracy by the position (letter) of the correct option, and the share of questions "
            "answered with each letter. A model that prefers a position scores high on that "
            "letter's row and low elsewhere; shuffled options spread the answers evenly, so its "
            "overall accuracy falls to chance.",
            _position_table(scores),
            "## Breakdowns",
            *_breakdown_tables(scores),
        ]
    )


def plot_accuracy(scores: dict, path: str, *, title: str) -> None:
    """Bars of per-task accuracy, bootstrap-interval whiskers, a chance marker per task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(scores["tasks"])
    rows = [scores["tasks"][t] for t in tasks]
    accuracy = [100.0 * r["accuracy"] for r in rows]
    whiskers = [
        [100.0 * (r["accuracy"] - r["low"]) for r in rows],
        [100.0 * (r["high"] - r["accuracy"]) for r in rows],
    ]
    x = range(len(tasks))
    fig, ax = plt.subplots(figsize=(1.2 * len(tasks) + 2.5, 3.8))
    ax.bar(x, accuracy, yerr=whiskers, capsize=4, color="#4c72b0", label="accuracy")
    ax.scatter(
        x,
        [100.0 * r["chance"] for r in rows],
        marker="_",
        s=900,
        color="#c44e52",
        zorder=3,
        label="chance",
    )
    ax.set_xticks(list(x), [f"{t}\n(n={r['n']})" for t, r in zip(tasks, rows, strict=True)])
    ax.set_ylim(0, 100)
    ax.set_ylabel("accuracy (%)")
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(scores: dict, out_dir: str, *, title: str = "Fetal-Gauge") -> dict[str, str]:
    """Write scores.json, report.md and accuracy.png into `out_dir`; their paths by name."""
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"fetal_gauge: out={out_dir!r} cannot be created ({error})") from None
    paths = {
        "scores": os.path.join(out_dir, "scores.json"),
        "report": os.path.join(out_dir, "report.md"),
        "plot": os.path.join(out_dir, "accuracy.png"),
    }
    with open(paths["scores"], "w") as f:
        json.dump(scores, f, indent=1)
    with open(paths["report"], "w") as f:
        f.write(report_markdown(scores, title=title) + "\n")
    plot_accuracy(scores, paths["plot"], title=title)
    return paths
