"""The claims, figure and summary of a vwf_dyslexia results record (`experiment.measure`): they
only read the record's rows ("intact", "vwf/<k>", "vwf_per_layer/<k>", "random/<k>/<draw>",
"scale/<s>", "layer/<l>", "all"; per-task accuracy per seed) and its settings. The claims and
their margins are stated in experiment.py's docstring."""

import os

import numpy as np

from core.claims import IntervalClaim
from methods.vwf_dyslexia import tasks

NON_READING = ("shapes", "sentence")
NOT_REACHED = 32.0  # the "smallest k" recorded when no k of the grid crosses the threshold


def name(kind: str, value, draw: int | None = None) -> str:
    """A mask's row name: "vwf/4", "random/0.5/3", "scale/-2" (numbers as %g: 4 == 4.0)."""
    return f"{kind}/{value:g}" + ("" if draw is None else f"/{draw}")


# ----------------------------------------------------------------------------- claims


def _row(record, seed, mask) -> dict:
    (row,) = [r for r in record["rows"] if r["seed"] == seed and r["mask"] == mask]
    return row


def drops(record: dict, mask: str) -> dict:
    """{seed: {task: intact - lesioned accuracy}} for one mask name."""
    out = {}
    for seed in record["config"]["settings"]["seeds"]:
        intact, lesioned = _row(record, seed, "intact"), _row(record, seed, mask)
        out[seed] = {t: intact[t] - lesioned[t] for t in tasks.TASKS}
    return out


def selectivity(drop: dict) -> float:
    return drop["lexical"] - float(np.mean([drop[t] for t in NON_READING]))


def per_seed(record: dict, mask: str, fn) -> dict:
    return {seed: fn(d) for seed, d in drops(record, mask).items()}


def random_mean(record: dict, percent, fn) -> dict:
    """{seed: mean over the random draws of fn(drop)} at k = percent."""
    draws = record["config"]["settings"]["random_masks"]
    per_draw = [per_seed(record, name("random", percent, d), fn) for d in range(draws)]
    return {seed: float(np.mean([p[seed] for p in per_draw])) for seed in per_draw[0]}


def smallest_k(record: dict, threshold: float) -> dict:
    """{seed: the smallest k whose VWF lesion puts lexical decision below threshold}."""
    s = record["config"]["settings"]
    out = {}
    for seed in s["seeds"]:
        below = [
            k for k in s["percents"] if _row(record, seed, name("vwf", k))["lexical"] < threshold
        ]
        out[seed] = min(below) if below else NOT_REACHED
    return out


# The quick run's smoke checks: at 300 steps no task is learned (every yes/no task sits at the
# share of one answer in the held-out set, 0.42-0.58, and letters at 0), so what it can check is
# that the pipeline works: training taught the answer format, the localiser finds a contrast, and
# a lesion reaches the forward pass. Thresholds come from what a broken pipeline gives.
YES_NO = ("lexical", "shapes", "sentence")
# An untrained model's argmax over the vocabulary is almost never exactly <yes> or <no> (~0);
# any yes/no answer scores the share of that answer, 0.42-0.58 on the 64-example quick set.
ANSWERED = 0.25
# Welch t of 24 word images against 72 others: the largest of ~512 units with no word
# preference is ~3.3 (df ~ 40); twice that needs a real contrast.
WORD_T = 6.0
# A lesion that does not reach the forward pass changes no answer (exactly 0); one changed
# answer in a 64-example task moves its accuracy by 1/64 = 0.016.
LESION_CHANGE = 0.01


def quick_checks(record: dict) -> list[IntervalClaim]:
    seeds = record["config"]["settings"]["seeds"]
    answered = {x: float(np.mean([_row(record, x, "intact")[t] for t in YES_NO])) for x in seeds}
    t_max = {x: record["per_seed"][str(x)]["t_max"] for x in seeds}
    change = {
        x: float(sum(abs(_row(record, x, "all")[t] - _row(record, x, "intact")[t]) for t in YES_NO))
        for x in seeds
    }
    return [
        IntervalClaim.at_least(
            f"smoke: training taught the answer format: the intact model's accuracy on the yes/no "
            f"tasks (lexical, shapes, sentence; mean) is above {ANSWERED:g} (untrained: ~0)",
            "yes/no accuracy, intact (mean of 3 tasks)",
            answered,
            ANSWERED,
        ),
        IntervalClaim.at_least(
            f"smoke: the localiser finds word-selective units: the largest word-selectivity t "
            f"is above {WORD_T:g} (units with no word preference: ~3.3)",
            "localiser: max t",
            t_max,
            WORD_T,
        ),
        IntervalClaim.at_least(
            f"smoke: silencing every decoder MLP unit changes yes/no accuracy (sum of |all - "
            f"intact| over lexical, shapes, sentence) by > {LESION_CHANGE:g} (a no-op lesion: 0)",
            "yes/no accuracy change, all MLP silenced",
            change,
            LESION_CHANGE,
        ),
    ]


def claims_of_study(record: dict) -> list[IntervalClaim]:
    """The first study's claims (its quick run: the smoke checks); the re-test's record
    ("full_v2") has its own, `experiment_v2.claims_from_results`."""
    s = record["config"]["settings"]
    k = s["claim_percent"]
    if record["run"] == "quick":
        return quick_checks(record)
    vwf_sel = per_seed(record, name("vwf", k), selectivity)
    k_min = smallest_k(record, s["threshold"])
    top = max(s["percents"])
    random_at_kmin = {}
    for seed, kk in k_min.items():
        kk = kk if kk != NOT_REACHED else top
        draws = [
            _row(record, seed, name("random", kk, d))["lexical"] for d in range(s["random_masks"])
        ]
        random_at_kmin[seed] = float(np.mean(draws))
    other_scales = [v for v in s["scales"] if v != 0]
    scale_sel = {v: per_seed(record, name("scale", v), selectivity) for v in s["scales"]}
    best_other = {seed: max(scale_sel[v][seed] for v in other_scales) for seed in scale_sel[0]}
    return [
        IntervalClaim.at_least(
            f"zeroing the top {k:g} % VWF units drops lexical decision more than the "
            f"non-reading tasks (shapes, sentence; mean) by > {s['selectivity_margin']:g}",
            f"selectivity, vwf {k:g} %",
            vwf_sel,
            s["selectivity_margin"],
        ),
        IntervalClaim.beats(
            f"the VWF lesion's selectivity exceeds {s['random_masks']} layer-matched random "
            f"masks' (mean) by > {s['random_margin']:g} at k = {k:g} %",
            f"selectivity: vwf - random ({k:g} %)",
            vwf_sel,
            random_mean(record, k, selectivity),
            s["random_margin"],
        ),
        IntervalClaim.at_most(
            f"VWF lesions bring lexical decision below {s['threshold']:.0%} within the grid "
            f"(smallest k, %; {NOT_REACHED:g} = never)",
            "smallest k with lexical < threshold",
            k_min,
            top + 0.5,
        ),
        IntervalClaim.at_least(
            f"random masks of that size keep lexical decision above {s['threshold']:.0%} (mean)",
            "lexical accuracy, random at the smallest VWF k",
            random_at_kmin,
            s["threshold"],
        ),
        IntervalClaim.beats(
            f"only s = 0 is selective: selectivity at s = 0 exceeds the largest at s in "
            f"{other_scales} by > {s['scale_margin']:g} (k = {k:g} %)",
            "selectivity: s=0 - max other s",
            scale_sel[0],
            best_other,
            s["scale_margin"],
        ),
    ]


# ----------------------------------------------------------------------------- figure


def curves(record: dict, kind: str, task: str) -> np.ndarray:
    """[seeds, k] accuracy of `kind` ("vwf", "vwf_per_layer", or "random": the draws' mean)."""
    s = record["config"]["settings"]
    out = []
    for seed in s["seeds"]:
        if kind == "random":
            row = [
                np.mean(
                    [
                        _row(record, seed, name("random", k, d))[task]
                        for d in range(s["random_masks"])
                    ]
                )
                for k in s["percents"]
            ]
        else:
            row = [_row(record, seed, name(kind, k))[task] for k in s["percents"]]
        out.append(row)
    return np.array(out)


def plot(record: dict, workdir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = record["config"]["settings"]
    panels = len(tasks.TASKS) + bool(s["scales"])
    fig, axes = plt.subplots(1, panels, figsize=(3.2 * panels, 3.4))
    for ax, task in zip(axes, tasks.TASKS, strict=False):
        intact = np.mean([_row(record, seed, "intact")[task] for seed in s["seeds"]])
        ax.axhline(intact, color="grey", lw=1, label="intact")
        for kind, color, style in (("vwf", "C3", "o-"), ("random", "C0", "s--"),
                                   ("vwf_per_layer", "C1", "^:")):  # fmt: skip
            c = curves(record, kind, task)
            ax.plot(s["percents"], c.mean(0), style, color=color, label=kind.replace("_", " "))
            ax.fill_between(s["percents"], c.min(0), c.max(0), color=color, alpha=0.12, lw=0)
        if task == "lexical":
            ax.axhline(s["threshold"], color="k", ls=":", lw=1)
        ax.set(xscale="log", xlabel="k (% of decoder MLP units)", title=task, ylim=(-0.02, 1.02))
        ax.set_xticks(s["percents"], [f"{k:g}" for k in s["percents"]])
        ax.minorticks_off()
    axes[0].set_ylabel("accuracy (held-out set)")
    axes[0].legend(fontsize=7)
    if s["scales"]:
        ax = axes[-1]
        k = s["claim_percent"]
        for task, color in zip(tasks.TASKS, ("C3", "C2", "C0", "C4"), strict=True):
            acc = [
                [_row(record, x, name("scale", v))[task] for v in s["scales"]] for x in s["seeds"]
            ]
            ax.plot(s["scales"], np.mean(acc, 0), "o-", color=color, label=task)
        ax.set(
            xlabel=f"scale s on the top {k:g} % VWF units", title="scale sweep", ylim=(-0.02, 1.02)
        )
        ax.axvline(1.0, color="grey", lw=1)
        ax.legend(fontsize=7)
    fig.suptitle(
        f"accuracy vs lesion size: VWF units, random layer-matched units (mean of "
        f"{s['random_masks']} draws), per-layer VWF; mean over seeds, band = range",
        fontsize=9,
    )
    fig.tight_layout()
    path = os.path.join(workdir, "vwf_dyslexia_lesions.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]


def summary(record: dict) -> dict:
    """Means over seeds of what the claims do not show: intact accuracy, font readouts,
    localiser overlaps."""
    s = record["config"]["settings"]
    seeds = [str(x) for x in s["seeds"]]
    intact = {
        t: float(np.mean([_row(record, x, "intact")[t] for x in s["seeds"]])) for t in tasks.TASKS
    }
    fonts = {
        f: {
            m: float(np.mean([record["per_seed"][x]["fonts"][f][m] for x in seeds]))
            for m in ("intact", "vwf")
        }
        for f in record["per_seed"][seeds[0]]["fonts"]
    }
    masks = {r["mask"] for r in record["rows"]}
    whole = sorted(m for m in masks if m.startswith("layer/") or m == "all")
    silenced = {
        m: {t: float(np.mean([_row(record, x, m)[t] for x in s["seeds"]])) for t in tasks.TASKS}
        for m in whole
    }
    return {"intact": intact, "fonts": fonts, "whole_mlp_lesions": silenced}
