"""NAB's tables and figure from a results record alone (`experiment.measure` writes it): the
choices made on the development objects, PSNR / SSIM per reported object, the paired differences
over objects, and the reconstructions of the first reported industrial object. Like
experiment.py, left out of a fit's code key (`fit.FIT_SOURCES`): editing a table refits nothing.

    python -m methods.nab.report  # the README's tables from the committed results/full.json
"""

import numpy as np

from core import results, stats
from methods.nab import metrics


def by_object(record: dict, metric: str, **where) -> dict:
    """{object seed: metric} of the reported fits that match `where` (method, phantom, views)."""
    return results.by_seed(record["rows"], metric, key="object", stage="reported", **where)


def table(record: dict) -> str:
    """The README's tables: the choices, PSNR / SSIM per reported object, and the paired
    differences as means with 95 % bootstrap intervals over objects."""
    s = record["config"]
    lines = ["Chosen on the development objects (held-out-view SNR, dB):", ""]
    lines += ["| encoding | chosen | val SNR | edges | ground truth would choose |"]
    lines += ["|---|---|---|---|---|"]
    for encoding, c in record["chosen"].items():
        point = ", ".join(f"{a}={v}" for a, v in c["point"].items())
        truth = ", ".join(f"{a}={v}" for a, v in c["truth_best"].items())
        edges = ", ".join(f"{a} ({e})" for a, e in c["edges"].items()) or "none"
        lines.append(f"| {encoding} | {point} | {c['val_snr_db']:.2f} | {edges} | {truth} |")
    reported = [r for r in record["rows"] if r["stage"] == "reported"]
    order = ("fbp", "sart", "rff", "nab", *s["ablations"])  # the columns, where fitted
    methods_ = [m for m in order if any(r["method"] == m for r in reported)]
    lines += ["", "PSNR (dB) / SSIM per reported object:", ""]
    lines += ["| phantom | object | views | " + " | ".join(methods_) + " |"]
    lines += ["|---|---|---|" + "---|" * len(methods_)]
    cells = {(r["phantom"], r["object"], r["views"], r["method"]): r for r in reported}
    for phantom, seed, views in dict.fromkeys((k[0], k[1], k[2]) for k in cells):
        row = [cells.get((phantom, seed, views, m)) for m in methods_]
        text = [f"{r['psnr']:.2f} / {r['ssim']:.3f}" if r else "" for r in row]
        lines.append(f"| {phantom} | {seed} | {views} | " + " | ".join(text) + " |")
    lines += ["", "Paired differences over objects, mean [95 % bootstrap interval]:", ""]
    lines += ["| phantom | views | difference | PSNR (dB) | SSIM |", "|---|---|---|---|---|"]
    for phantom in s["reported"]:
        for views in s["views"] if phantom == "industrial" else (max(s["views"]),):
            for other in [m for m in methods_ if m != "nab"]:
                where = dict(phantom=phantom, views=views)
                if not by_object(record, "psnr", method=other, **where):
                    continue
                ivs = [
                    stats.paired_interval(
                        by_object(record, k, method="nab", **where),
                        by_object(record, k, method=other, **where),
                    )
                    for k in ("psnr", "ssim")
                ]
                text = " | ".join(f"{iv.mean:+.3g} [{iv.low:+.3g}, {iv.high:+.3g}]" for iv in ivs)
                lines.append(f"| {phantom} | {views} | nab - {other} | {text} |")
    return "\n".join(lines)


def plot(images: dict, record: dict, truth_NN, path: str) -> None:
    """Ground truth, FBP, SART, RFF and NAB on the first reported industrial object."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    s = record["config"]
    where = dict(phantom="industrial", views=max(s["views"]))
    seed = s["reported"]["industrial"][0]
    panels = [m for m in ("fbp", "sart", "rff", "nab") if m in images]
    fig, axes = plt.subplots(1, len(panels) + 1, figsize=(3 * (len(panels) + 1), 3.6))
    for ax, name in zip(axes[1:], panels, strict=True):
        q = {k: by_object(record, k, method=name, **where)[seed] for k in ("psnr", "ssim")}
        ax.imshow(metrics.prepare(np.asarray(images[name])), cmap="gray", vmin=0, vmax=1)
        ax.set_title(f"{name.upper()}\n{q['psnr']:.1f} dB, SSIM {q['ssim']:.3f}", fontsize=9)
    axes[0].imshow(truth_NN, cmap="gray", vmin=0, vmax=1)
    axes[0].set_title(f"industrial object {seed}\n{where['views']} views", fontsize=9)
    for ax in axes:
        ax.axis("off")
    fig.tight_layout(rect=(0, 0, 1, 0.97))  # keep the two-line titles inside the figure
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":  # the README's tables from the committed results
    print(table(results.load("nab", "full")))
