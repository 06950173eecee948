"""Soft thinking's tables and figure from a results record alone (`experiment.measure` writes
it): the numbers reported beside the claims, the README's per-seed table and the pass@k figure.
Left out of the run cache's code key (`core.results.run_sources`): editing a table retrains
nothing.

    python -m methods.soft_thinking.report  # the README's table from results/full.json
"""

import numpy as np

from core import results, stats
from methods.soft_thinking.evaluation import PASS_K, STOCHASTIC


def decoders_in(rows) -> list[str]:
    return [name for name in ("greedy", *STOCHASTIC) if f"{name}/pass@1" in rows[0]]


def reported(record: dict) -> dict:
    """Numbers reported beside the claims (not asserted): per decoder and k, the mean over
    seeds; Gumbel - sampling and Dirichlet - sampling intervals."""
    rows = record["rows"]
    out = {}
    for name in decoders_in(rows):
        for k in PASS_K if name != "greedy" else (1,):
            out[f"{name}/pass@{k}"] = float(np.mean([r[f"{name}/pass@{k}"] for r in rows]))
    if not record["config"].get("quick"):
        for a in ("gumbel", "dirichlet"):
            for k in (1, 16):
                iv = stats.paired_interval(
                    results.by_seed(rows, f"{a}/pass@{k}"),
                    results.by_seed(rows, f"sample/pass@{k}"),
                    what=f"pass@{k}: {a} - sample",
                )
                out[f"pass@{k}: {a} - sample"] = iv.to_dict()
    return out


def per_seed_table(record: dict) -> str:
    """The README's per-seed table (markdown) from a results record."""
    rows = sorted(record["rows"], key=lambda r: r["seed"])
    metrics = [("steps", "chosen steps"), ("validation/greedy", "validation greedy accuracy")]
    for name in ("greedy", *STOCHASTIC):
        metrics.append((f"{name}/pass@1", f"{name} pass@1"))
    for name in STOCHASTIC:
        metrics.append((f"{name}/pass@16", f"{name} pass@16"))
    for name in ("greedy", *STOCHASTIC):
        metrics.append((f"{name}/valid_trace", f"{name} valid-trace rate"))
    for name in STOCHASTIC:
        metrics.append((f"{name}/rouge_l_greedy", f"{name} ROUGE-L to greedy chain"))
        metrics.append((f"{name}/distinct_chains", f"{name} distinct chains of 16"))
    metrics += [
        ("soft/js_top1", "soft: JS to top-1 input (nats)"),
        ("soft/js_top2", "soft: JS to top-2 input (nats)"),
        ("soft/js_ratio", "soft: JS ratio top-1 / top-2"),
        ("lens/branch_points", "logit lens: branch points"),
    ]
    layers = sorted({k.rsplit("/", 1)[1] for k in rows[0] if k.startswith("lens/mix_vs_top1/")})
    for which in ("top1", "top2"):
        for layer in layers:
            metrics.append((f"lens/mix_vs_{which}/{layer}", f"lens: mix vs {which}, layer {layer}"))
    seeds = " / ".join(str(r["seed"]) for r in rows)
    lines = [f"| quantity | seeds {seeds} | mean |", "|---|---|---|"]
    for key, label in metrics:
        values = [r[key] for r in rows]
        text = " / ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in values)
        lines.append(f"| {label} | {text} | {np.mean(values):.3f} |")
    return "\n".join(lines)


def plot_pass_at_k(record: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    rows = record["rows"]
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for index, name in enumerate(decoders_in(rows)):
        ks = PASS_K
        per_seed = np.array(
            [[r[f"{name}/pass@{1 if name == 'greedy' else k}"] for k in ks] for r in rows]
        )
        colour = f"C{index}"
        for values in per_seed:
            ax.plot(ks, values, color=colour, alpha=0.25, linewidth=0.8)
        ax.plot(ks, per_seed.mean(0), color=colour, marker="o", label=name)
    ax.set(xscale="log", xlabel="k (samples)", ylabel="pass@k (test prompts)")
    ax.set_xticks(PASS_K, [str(k) for k in PASS_K])
    ax.set_title(f"pass@k per decoder (mean of {len(rows)} seeds; faint: each seed)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    print(per_seed_table(results.load("soft_thinking", "full")))
