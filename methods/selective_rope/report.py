"""The README's tables and the figure of a selective_rope results record, as the experiment
runner writes it (`experiment.adopt` brings the committed, older record to that shape): arms
"model/position", an lr grid each, rows with "test/len{T}/<metric>" per length."""

import re

import numpy as np

from core import experiment_runner as runner
from core import stats

HEADLINE = "last_quarter"


def lengths(record: dict) -> tuple[int, list[int]]:
    """(the training length, every tested length, training length first): the rows'
    "train_length" (the re-test's rows, validated at 4x) or else the length of the record's
    selection metric ("validation/len{T0}/..."), and the rows' test metrics."""
    trained = {r["train_length"] for r in record["rows"] if "train_length" in r}
    if len(trained) > 1:
        raise ValueError(f"selective_rope: rows trained at several lengths {sorted(trained)}")
    T0 = trained.pop() if trained else _validation_length(record)
    tested = {
        int(m[1]) for r in record["rows"] for k in r if (m := re.fullmatch(r"test/len(\d+)/.*", k))
    }
    return T0, [T0, *sorted(tested - {T0})]


def _validation_length(record: dict) -> int:
    return int(re.fullmatch(r"validation/len(\d+)/.*", record["config"]["select_on"])[1])


def reported(record, chosen, arm: str, T: int, metric: str = HEADLINE) -> dict:
    """{seed: test metric at length T} of the arm's validation-chosen lr."""
    return runner.reported(record, arm, f"test/len{T}/{metric}", chosen)


def _chosen_rows(record, arm: str, lr: float) -> list[dict]:
    rows = (r for r in record["rows"] if r["arm"] == arm and r["lr"] == lr)
    return sorted(rows, key=lambda r: r["seed"])


def table(record: dict) -> str:
    """Each arm's validation means per lr and its chosen lr; the chosen runs' test accuracy per
    length, mean [95 % bootstrap interval over seeds]; per-seed values."""
    cfg = record["config"]
    chosen = runner.choices(record)
    T0, all_T = lengths(record)
    seeds = cfg["seeds"]
    fmt = lambda iv: f"{iv.mean:.3f} [{iv.low:.3f}, {iv.high:.3f}]"  # noqa: E731
    width = max(len(a["grid"]["lr"]) for a in cfg["arms"].values())
    names = {arm: arm.replace("/", " / ") for arm in chosen}
    Tv = _validation_length(record)
    lines = [
        f"Validation (last quarter at T={Tv}, mean over seeds {seeds}) per lr; the choice in bold:",
        "",
        "| model / position | " + " | ".join(f"lr {i + 1}" for i in range(width)) + " |",
        "|---|" + "---|" * width,
    ]
    for arm, sel in chosen.items():
        cells = [
            (f"**{lr:g}: {mean:.3f}**" if lr == sel.point["lr"] else f"{lr:g}: {mean:.3f}")
            for (lr,), mean in sel.means.items()
        ]
        lines.append(f"| {names[arm]} | {' | '.join(cells)} |")
    head = " | ".join(f"T={T}" + (" (train)" if T == T0 else "") for T in all_T)
    lines += [
        "",
        "Test, last-quarter accuracy of the chosen lr, mean [95 % bootstrap interval] over "
        f"seeds {seeds}:",
        "",
        f"| model / position | lr | params | {head} |",
        "|---|---|---|" + "---|" * len(all_T),
    ]
    for arm, sel in chosen.items():
        cells = [fmt(stats.interval(reported(record, chosen, arm, T))) for T in all_T]
        params = next(r["params"] for r in record["rows"] if r["arm"] == arm)
        lines.append(f"| {names[arm]} | {sel.point['lr']:g} | {params:,} | {' | '.join(cells)} |")
    # The re-test's rows: the validation-chosen checkpoint's step, and the flip error of the
    # last step's parameters (the chosen checkpoint's are not kept).
    steps = any("checkpoint_step" in r for r in record["rows"])
    lines += [
        "",
        "Per seed (chosen lr): last quarter (whole-sequence parity), flip error (rad)"
        + (", the chosen checkpoint's step (flip error: of the last step):" if steps else ":"),
        "",
        f"| model / position | seed | {head} | flip error |" + (" checkpoint |" if steps else ""),
        "|---|---|" + "---|" * len(all_T) + "---|" + ("---|" if steps else ""),
    ]
    for arm, sel in chosen.items():
        for r in _chosen_rows(record, arm, sel.point["lr"]):
            cells = [
                f"{r[f'test/len{T}/{HEADLINE}']:.3f} ({r[f'test/len{T}/final']:.3f})" for T in all_T
            ]
            flip = r.get("flip_error", r.get("final_flip_error"))
            flip = "-" if flip is None else f"{flip:.3f}"
            step = f" {r['checkpoint_step']} |" if steps else ""
            lines.append(f"| {names[arm]} | {r['seed']} | {' | '.join(cells)} | {flip} |{step}")
    edges = [
        f"{e['arm']}: lr={e['value']:g} ({e['side']})" + (f", {e['open']}" if e["open"] else "")
        for e in runner.edges(record)
    ]
    if edges:
        lines += ["", f"Choices on a grid edge: {'; '.join(edges)}."]
    diverged = [r for r in record["rows"] if r["diverged"]]
    if diverged:
        runs = ", ".join("{arm} lr={lr:g} seed={seed}".format(**r) for r in diverged)
        lines += ["", f"Diverged (scored 0.5; a re-test run: its best evaluation before): {runs}."]
    return "\n".join(lines)


def plot(record: dict, path: str) -> None:
    """Test accuracy (last quarter) against length, one panel per model, per-seed points and
    the mean with its 95 % interval for each position encoding."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    seeds = record["config"]["seeds"]
    chosen = runner.choices(record)
    T0, all_T = lengths(record)
    models = list(dict.fromkeys(arm.split("/")[0] for arm in chosen))
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 3.6), squeeze=False)
    colors = {"selective": "C0", "rope": "C1", "none": "C2"}
    for ax, kind in zip(axes[0], models, strict=True):
        for arm in (a for a in chosen if a.split("/")[0] == kind):
            pos = arm.split("/")[1]
            by_T = [reported(record, chosen, arm, T) for T in all_T]
            for seed in seeds:
                ax.scatter(all_T, [v[seed] for v in by_T], color=colors[pos], s=12)
            ivs = [stats.interval(v) for v in by_T]
            mean = np.array([iv.mean for iv in ivs])
            err = np.array([[iv.mean - iv.low for iv in ivs], [iv.high - iv.mean for iv in ivs]])
            lr = chosen[arm].point["lr"]
            ax.errorbar(
                all_T,
                mean,
                yerr=err,
                color=colors[pos],
                marker="o",
                capsize=3,
                label=f"{pos} (lr {lr:g})",
            )
        ax.axhline(0.5, color="gray", lw=0.8, ls="--")
        ax.axvline(T0, color="gray", lw=0.8, ls=":")
        ax.set(xscale="log", xlabel="test length (trained at dotted line)", ylim=(0.4, 1.02))
        ax.minorticks_off()
        ax.set_xticks(all_T, [str(T) for T in all_T])
        ax.set_ylabel("test accuracy, last quarter of positions")
        ax.set_title(f"1-layer {kind}: prefix parity, {len(seeds)} seeds, 95 % intervals")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
