"""RLCR's tables and figure from a results record alone (`experiment.measure` writes it): the
mean over seeds [bootstrap interval] of every readout's numbers, the voting and Bayes tables, and
the reliability diagrams. Like experiment.py, left out of the run cache's code key
(`core.results.run_sources`): editing a table or the figure retrains nothing.

A row is {"seed", "arm", "family", "format", "mean_q", "<readout>/<score>", "votes/<scheme>",
"bayes/<score>"} (`experiment.flat_row`); the warm start's rows have the arm START.
"""

import numpy as np

from core import results, stats
from methods.rlcr import calibration, runs

# The warm start's rows: measured from the rlcr run's params after its warm-start steps (both
# arms run the same warm start: tested), so it costs no training run of its own.
START = "start"
READOUTS = ("verbalized", "verbalized_mean", "answer_prob", "probe", "ideal")
SCORES = ("accuracy", "ece", "brier", "auroc")
VOTES = ("single", "majority", "weighted", "max_confidence")


def line(rows: list[dict]) -> str:
    """One policy's headline numbers, family after family (printed as each run finishes)."""
    return " | ".join(
        f"{r['family']} acc {r['verbalized/accuracy']:.3f} ece {r['verbalized/ece']:.3f} "
        f"brier {r['verbalized/brier']:.3f} auroc {r['verbalized/auroc']:.3f}"
        for r in rows
    )


def arms_in(record: dict) -> list[str]:
    """The warm start, then the record's arms in its setting's order: those its rows hold."""
    present = {r["arm"] for r in record["rows"]}
    return [arm for arm in (START, *record["config"]["arms"]) if arm in present]


def families_in(record: dict) -> list[str]:
    present = {r["family"] for r in record["rows"]}
    return [f.name for f in runs.FAMILIES if f.name in present]


def table(record: dict) -> dict:
    """Means over seeds: {arm: {family: {key: mean}}} for every number the rows hold."""
    out = {}
    for arm in arms_in(record):
        out[arm] = {}
        for family in families_in(record):
            rows = [r for r in record["rows"] if r["arm"] == arm and r["family"] == family]
            keys = [k for k in rows[0] if k not in ("seed", "arm", "family")]
            out[arm][family] = {k: float(np.nanmean([r[k] for r in rows])) for k in keys}
    return out


def _cell(record, arm, family, key) -> str:
    by_seed = results.by_seed(record["rows"], key, arm=arm, family=family)
    iv = stats.interval(by_seed, what=key)
    return f"{iv.mean:.3f} [{iv.low:.3f}, {iv.high:.3f}]"


def notes(record: dict) -> str:
    """The measured table: mean over seeds [bootstrap interval] of each readout's numbers."""
    n = len(record["config"]["seeds"])
    lines = [
        f"Mean over {n} seeds [95 % bootstrap interval]; greedy answers. ECE / Brier / AUROC of "
        "each confidence against the correctness of the greedy answer; ideal = the exact "
        "posterior of that answer.",
        "",
        "| arm | family | confidence | accuracy | ECE | Brier | AUROC |",
        "|---|---|---|---|---|---|---|",
    ]
    t = table(record)
    for arm in t:
        for family, entry in t[arm].items():
            for readout in READOUTS:
                if f"{readout}/ece" not in entry:
                    continue
                cells = [_cell(record, arm, family, f"{readout}/{s}") for s in SCORES]
                lines.append(f"| {arm} | {family} | {readout} | {' | '.join(cells)} |")
    voted = [(a, f) for a in t for f in t[a] if "votes/majority" in t[a][f]]
    lines.append("")
    if voted:
        lines += [
            "| arm | family | single | majority | weighted | max-conf. |",
            "|---|---|---|---|---|---|",
        ]
        for arm, family in voted:
            cells = [_cell(record, arm, family, f"votes/{k}") for k in VOTES]
            lines.append(f"| {arm} | {family} | {' | '.join(cells)} |")
        lines.append("")
    lines += ["| family | Bayes acc | Bayes Brier |", "|---|---|---|"]
    for family, entry in t[START].items():  # the same questions for every arm
        lines.append(f"| {family} | {entry['bayes/accuracy']:.3f} | {entry['bayes/brier']:.3f} |")
    return "\n".join(lines)


PANELS = (
    ("rlcr", "verbalized", "RLCR: stated confidence"),
    ("rlvr", "verbalized", "RLVR: stated confidence"),
    ("rlvr", "answer_prob", "RLVR: answer-token probability"),
    ("rlvr", "probe", "RLVR + post-hoc probe"),
)


def pooled_bins(record: dict, arm: str, family: str, readout: str):
    """Reliability bins pooled over seeds (count-weighted)."""
    count = np.zeros(calibration.NUM_BINS)
    conf_sum, acc_sum = np.zeros_like(count), np.zeros_like(count)
    for seed in record["config"]["seeds"]:
        bins = record["bins"][f"{arm}/{seed}/{family}"][readout]
        c = np.asarray(bins["count"])
        count += c
        conf_sum += np.nan_to_num(np.asarray(bins["confidence"], float)) * c
        acc_sum += np.nan_to_num(np.asarray(bins["accuracy"], float)) * c
    with np.errstate(invalid="ignore", divide="ignore"):
        return conf_sum / count, acc_sum / count, count


def plot(record: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    t = table(record)
    families = families_in(record)
    # The panels of what was measured: every arm measures the same families.
    panels = [p for p in PANELS if p[0] in t and f"{p[1]}/ece" in t[p[0]][families[0]]]
    if not panels:  # the quick run: RLCR and the warm start it started from
        panels = [("rlcr", "verbalized", "RLCR: stated confidence")]
        panels.append((START, "verbalized", "warm start: stated confidence"))
    fig, axes = plt.subplots(
        len(families),
        len(panels),
        figsize=(3.2 * len(panels), 3.2 * len(families)),
        squeeze=False,
    )
    centres = (np.arange(calibration.NUM_BINS) + 0.5) / calibration.NUM_BINS
    for row, family in enumerate(families):
        for col, (arm, readout, title) in enumerate(panels):
            ax = axes[row, col]
            mean_conf, acc, count = pooled_bins(record, arm, family, readout)
            keep = count > 0
            ax.bar(
                centres[keep], acc[keep], width=0.09, color="tab:blue", alpha=0.8, label="accuracy"
            )
            ax.plot(
                mean_conf[keep],
                acc[keep],
                "o",
                color="tab:red",
                ms=3,
                label="(confidence, accuracy)",
            )
            ax.plot([0, 1], [0, 1], "k--", lw=0.8)
            s = t[arm][family]
            ax.set_title(
                f"{title}\n{family}: ECE {s[f'{readout}/ece']:.3f}, "
                f"AUROC {s[f'{readout}/auroc']:.2f}",
                fontsize=8,
            )
            ax.set_xlim(0, 1)
            ax.set_ylim(0, 1)
            ax.set_xlabel("confidence", fontsize=8)
            if col == 0:
                ax.set_ylabel("accuracy in bin", fontsize=8)
    axes[0, 0].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
