"""The tables and figure of an ODPV results record, from the record alone:
`python -m methods.od_verify.report [results.json]` prints the README's tables."""

import os
import sys

import numpy as np

BOUNDS = ("iou_x0", "pgd", "odpv", "odpv_t0", "scalar")


def _seeds(record) -> list[dict]:
    return [r for r in record["rows"] if r["arm"] == "odpv"]


def _cell(values) -> str:
    values = np.asarray(values, float)
    spread = f" ± {values.std(ddof=1):.3f}" if len(values) > 1 else ""
    return f"{values.mean():.3f}{spread}"


def eps_values(record) -> list[str]:
    return list(_seeds(record)[0]["records"])


def bounds_table(record: dict) -> str:
    """Per eps: mean IoU at x0, PGD's IoU, ODPV's certified bound (T=1, T=0), RCP_N's (its
    subset, with ODPV's on the same objects), the scalar bound; the safe rates at each tau."""
    rows = _seeds(record)
    taus = sorted({k.split("/tau")[1] for k in rows[0] if k.startswith("safe/")})
    head = [
        "eps",
        "IoU at x0",
        "PGD",
        "ODPV T=1",
        "ODPV T=0",
        "scalar",
        "RCP_N (subset)",
        "ODPV (same subset)",
        *[f"safe at {t} (ODPV)" for t in taus],
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in eps_values(record):
        cells = [_cell([r[f"bound/{b}/{e}"] for r in rows]) for b in BOUNDS]
        cells += [
            _cell([r[f"bound/rcp/{e}"] for r in rows]),
            _cell([r[f"bound/odpv_on_rcp_set/{e}"] for r in rows]),
        ]
        cells += [_cell([r[f"safe/{e}/tau{t}"] for r in rows]) for t in taus]
        lines.append(f"| {e}/255 | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cost_table(record: dict) -> str:
    rows = _seeds(record)
    keys = [
        ("samples/odpv/32", "ODPV Part 1 samples, 32x32"),
        ("samples/odpv/64", "ODPV Part 1 samples, 64x64"),
        ("samples/rcp/32", "RCP_N samples, 32x32"),
        ("samples/rcp/64", "RCP_N samples, 64x64"),
        ("time/odpv", "ODPV seconds (RCP subset, both taus)"),
        ("time/rcp", "RCP_N seconds (same)"),
        ("paper/samples", "paper setting: samples"),
        ("paper/seconds", "paper setting: seconds per object"),
        ("paper/bound", "paper setting: mean bound"),
    ]
    lines = ["| quantity | mean ± sd over seeds |", "|---|---|"]
    lines += [f"| {label} | {_cell([r[k] for r in rows])} |" for k, label in keys if k in rows[0]]
    return "\n".join(lines)


def plot(record: dict, out_dir: str) -> list[str]:
    """od_verify.png: per object (all seeds), each verifier's certified bound against PGD's IoU
    (a sound bound lies on or below the diagonal), one panel per eps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    eps = eps_values(record)
    fig, axes = plt.subplots(1, len(eps), figsize=(4 * len(eps), 4), squeeze=False)
    for ax, e in zip(axes[0], eps, strict=True):
        objs = [o for r in _seeds(record) for rec in r["records"][e] for o in rec["objects"]]
        pgd = np.array([o["pgd"] for o in objs])
        for name, marker in (("odpv", "o"), ("scalar", "x"), ("rcp", "s")):
            pairs = [(o["pgd"], o[name]) for o in objs if name in o]
            x, y = np.array(pairs).T
            ax.scatter(x, y, s=12, marker=marker, alpha=0.6, label=name)
        ax.plot([0, 1], [0, 1], "k--", lw=0.8)
        ax.set(
            title=f"eps = {e}/255 ({len(pgd)} objects)",
            xlabel="PGD IoU (upper bound)",
            ylabel="certified IoU lower bound",
            xlim=(0, 1),
            ylim=(0, 1),
        )
        ax.legend(loc="upper left")
    fig.tight_layout()
    path = os.path.join(out_dir, "od_verify.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def main(argv: list[str]) -> None:
    import json

    path = argv[1] if len(argv) > 1 else "methods/od_verify/results/full.json"
    if not os.path.exists(path):
        raise SystemExit(f"od_verify: no results file {path}; run the experiment first")
    with open(path) as f:
        record = json.load(f)
    print(bounds_table(record), "\n")
    print(cost_table(record))


if __name__ == "__main__":
    main(sys.argv)
