"""Tables and the figure of a Q&C results record (experiment.py's), from the record alone:
`python -m methods.quant_cache.report [results.json]` prints the README's table."""

import os
import sys

import numpy as np

from core import results

VARIANCE_SETTINGS = ("fp", "c2", "w4a4", "w4a4+c2", "w4a4+c2+vc", "w4a4+c2+tap+vc")


def setting_names(record: dict) -> list[str]:
    """The settings of the record, in the order they ran (the run config's list)."""
    configs = record["config"].get("run_config", {})
    listed = [c["quant_cache"]["settings"] for c in configs.values() if "quant_cache" in c]
    have = {k.removesuffix("/fd") for k in record["rows"][0] if k.endswith("/fd")}
    order = listed[0].split("/") if listed else sorted(have)
    return [name for name in order if name in have]


def _cell(rows, metric, fmt="{:.2f}"):
    values = np.array([r[metric] for r in rows if metric in r], float)
    if not len(values):
        return "-"
    per_seed = " / ".join(fmt.format(v) for v in values)
    return f"{fmt.format(values.mean())} ({per_seed})"


def table(record: dict) -> str:
    """Markdown: per setting, FD-digits (mean, then per seed), conditional accuracy, the
    variance gap to fp, and the BOPs speedup."""
    rows = record["rows"]
    lines = [
        "| setting | FD-digits, mean (seeds) | accuracy | mean abs var gap to fp | BOPs speedup |",
        "|---|---|---|---|---|",
    ]
    for name in setting_names(record):
        lines.append(
            f"| {name} | {_cell(rows, f'{name}/fd')} | "
            f"{_cell(rows, f'{name}/accuracy', '{:.3f}').split(' (')[0]} | "
            f"{_cell(rows, f'{name}/var_dev', '{:.4f}').split(' (')[0]} | "
            f"{rows[0][f'{name}/speedup']:.2f}x |"
        )
    return "\n".join(lines)


def _series(rows, prefix):
    n = 0
    while f"{prefix}/{n}" in rows[0]:
        n += 1
    return np.array([[r[f"{prefix}/{i}"] for i in range(n)] for r in rows])


def plot(record: dict, out_dir: str) -> list[str]:
    """quant_cache.png: per-step sample variance (fp, cache, W4A4, naive Q+C, +VC, TAP+VC;
    mean over seeds), the pool's mean pairwise cosine with and without cache, and their gap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = record["rows"]
    fig, (ax_var, ax_cos, ax_gap) = plt.subplots(1, 3, figsize=(14, 3.8))
    for name in VARIANCE_SETTINGS:
        if f"{name}/var/0" in rows[0]:
            ax_var.plot(_series(rows, f"{name}/var").mean(0), label=name)
    ax_var.set(xlabel="sampler step (0 = noise)", ylabel="sample variance")
    ax_var.set_title("per-step variance")
    ax_var.legend(fontsize=8)
    if "pool/cos_cached/0" in rows[0]:
        for kind in ("cached", "uncached"):
            ax_cos.plot(_series(rows, f"pool/cos_{kind}").mean(0), label=kind)
        ax_cos.set(xlabel="sampler step", ylabel="mean pairwise cosine")
        ax_cos.set_title("calibration pool similarity")
        ax_cos.legend(fontsize=8)
        gap = _series(rows, "pool/cos_cached") - _series(rows, "pool/cos_uncached")
        for seed_gap in gap:
            ax_gap.plot(seed_gap, color="gray", alpha=0.6)
        ax_gap.axhline(0, color="black", lw=0.8)
        ax_gap.set(xlabel="sampler step", ylabel="cached - uncached cosine")
        ax_gap.set_title("similarity gap (one line per seed)")
    fig.tight_layout()
    path = os.path.join(out_dir, "quant_cache.png")
    os.makedirs(out_dir, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def main(argv: list[str]) -> None:
    """Print the table of a record (default: the committed full run) and redraw its figure
    beside this module."""
    record = results.load("quant_cache", "full") if len(argv) < 2 else _read(argv[1])
    print(table(record))
    print(*plot(record, os.path.dirname(os.path.abspath(__file__))))


def _read(path: str) -> dict:
    import json

    with open(path) as f:
        return json.load(f)


if __name__ == "__main__":
    main(sys.argv)
