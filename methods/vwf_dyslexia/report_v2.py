"""The re-test's tables and figure (record "full_v2", `experiment_v2.py`): read from the record
alone, trained nothing; not in a run's code key (`experiment_v2.EXPERIMENT.sources`).

    python -m methods.vwf_dyslexia.experiment_v2 --from_results   # these tables, the figure
"""

import os

import numpy as np

from core import experiment_runner as runner
from methods.vwf_dyslexia import retest, tasks

ARM = "vlm"


def percents(record: dict) -> list[float]:
    """The lesion sizes k (% of the candidate units) the record's runs scored."""
    return list(record["config"]["run_config"][ARM]["exp"]["percents"])


def _by_seed(record: dict, metric: str, chosen) -> dict:
    return runner.reported(record, ARM, metric, chosen)


def _cell(values: dict) -> str:
    v = list(values.values())
    return f"{np.mean(v):.3f} [{min(v):.3f}, {max(v):.3f}]"


def table(record: dict) -> str:
    """The width chosen on "val"; intact test accuracy per task and seed; selectivity per k (mean
    [min, max] over seeds): the unit lesion of the VWF top k, random masks, their difference, and
    the official hook on the VWF top k."""
    chosen = runner.choices(record)
    sel = chosen[ARM]
    seeds = record["config"]["seeds"]
    cells = [
        f"**{d_ff}: {m:.3f}**" if d_ff == sel.point["d_ff"] else f"{d_ff}: {m:.3f}"
        for (d_ff,), m in sel.means.items()
    ]
    lines = [
        f"Validation mean accuracy of the 7 tasks per d_ff (chosen in bold): {', '.join(cells)}"
    ]
    lines += ["", "| task | " + " | ".join(f"seed {s}" for s in seeds) + " |",
              "|---|" + "---|" * len(seeds)]  # fmt: skip
    for task in tasks.DIETS["v2"]:
        acc = _by_seed(record, f"test/intact/{task}", chosen)
        lines.append(f"| {task} | " + " | ".join(f"{acc[s]:.3f}" for s in seeds) + " |")
    head = "| k % | VWF (unit lesion) | random | VWF - random | official hook, VWF |"
    lines += ["", "Selectivity (lexical drop - mean non-reading drop), mean [min, max] over seeds:",
              "", head, "|---|---|---|---|---|"]  # fmt: skip
    for k in percents(record):
        metrics = ("selectivity/vwf", "selectivity/random", "selectivity/vwf_minus_random",
                   "official/selectivity/vwf")  # fmt: skip
        row = [_cell(_by_seed(record, f"test/{m}/{k:g}", chosen)) for m in metrics]
        lines.append(f"| {k:g} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def plot(record: dict, folder: str) -> list[str]:
    """vwf_dyslexia_v2.png: (left) selectivity against k, each seed a dot, the mean a line, for
    the VWF unit lesion, random masks and the official hook; (right) lexical decision after the
    VWF unit lesion against k, with the paper's 65 % threshold."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chosen = runner.choices(record)
    ks = percents(record)
    rows = [
        r for r in record["rows"] if r[record["config"]["arm_key"]] == ARM
        and all(r[axis] == v for axis, v in chosen[ARM].point.items())
    ]  # fmt: skip
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    kinds = {"VWF, unit lesion": "selectivity/vwf", "random masks (mean)": "selectivity/random",
             "VWF, official hook": "official/selectivity/vwf"}  # fmt: skip
    for i, (label, metric) in enumerate(kinds.items()):
        values = np.array([[r[f"test/{metric}/{k:g}"] for k in ks] for r in rows])
        for seed_values in values:
            left.plot(ks, seed_values, ".", color=f"C{i}", alpha=0.6)
        left.plot(ks, values.mean(0), "-", color=f"C{i}", label=label)
    left.axhline(0, color="gray", lw=0.8)
    left.set(xscale="log", xlabel="k (% of candidate units)", ylabel="selectivity")
    left.set_title(f"d_ff {chosen[ARM].point['d_ff']}, {len(rows)} seeds")
    left.legend(fontsize=8)
    for r in rows:
        lexical = [r["detail"]["accuracy"][retest.name("vwf", k)]["lexical"] for k in ks]
        right.plot(ks, lexical, "o-", alpha=0.7, label=f"seed {r['seed']}")
    right.axhline(retest.THRESHOLD, color="gray", ls="--", lw=0.8, label="65 %")
    right.set(xscale="log", xlabel="k (% of candidate units)", ylabel="lexical decision, lesioned")
    right.set_title("VWF unit lesion")
    right.legend(fontsize=8)
    for ax in (left, right):
        ax.set_xticks(ks, [f"{k:g}" for k in ks])
        ax.set_xticks([], minor=True)
    fig.tight_layout()
    path = os.path.join(folder, "vwf_dyslexia_v2.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]
