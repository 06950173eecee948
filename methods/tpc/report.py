"""TPC's tables and figure of a results record (numbers read, none computed anew), and the
per-seed numbers its claims are about.

    print(table(results.load("tpc", "full")))    # the README's tables
    plot(record, "tpc_f1_vs_cost.png")           # test F1 against parameters paid
    derived(record, "digits")["cascade"]         # {seed: the cascade's test F1}
"""

import numpy as np

from core import results, stats
from methods.tpc.runs import TPC_ARMS


def per_seed(record: dict, dataset: str, arm: str, field: str = "test_f1") -> dict:
    return results.by_seed(record["rows"], field, dataset=dataset, arm=arm)


def derived(record: dict, dataset: str) -> dict[str, dict]:
    """Per-seed numbers the claims are about ({seed: value})."""
    prog = per_seed(record, dataset, "progressive")
    mid = lambda f1: float(np.mean(f1[1:-1]))  # orders 2..N-1
    return {
        "progressive, mean F1 orders 2..N-1": {s: mid(v) for s, v in prog.items()},
        "joint_all, mean F1 orders 2..N-1": {
            s: mid(v) for s, v in per_seed(record, dataset, "joint_all").items()
        },
        "progressive order N": {s: v[-1] for s, v in prog.items()},
        "progressive order 2": {s: v[1] for s, v in prog.items()},
        "cascade": {s: v[0] for s, v in per_seed(record, dataset, "cascade").items()},
        "cascade cost fraction": per_seed(record, dataset, "cascade", "cost_fraction"),
        "mlp@N": {s: v[0] for s, v in per_seed(record, dataset, "mlp@N").items()},
        "linear": {s: v[0] for s, v in per_seed(record, dataset, "linear").items()},
    }


def _iv(values: dict) -> str:
    iv = stats.interval(values)
    return f"{iv.mean:.3f} [{iv.low:.3f}, {iv.high:.3f}]"


def _per_seed_iv(record, dataset, arm, n) -> dict:
    return {s: v[n] for s, v in per_seed(record, dataset, arm).items()}


def table(record: dict) -> str:
    """The README's tables: test F1 per arm and order as mean [95 % bootstrap interval] over
    seeds, the cascade, the paired differences and every validation choice."""
    lines = []
    for dataset in record["config"]["datasets"]:
        info = record["datasets"][dataset]
        N = len(info["counts"])
        seeds = sorted(per_seed(record, dataset, "linear"))
        layer = f", MiniLM layer {info['layer']}" if info["layer"] is not None else ""
        lines += [
            f"**{dataset}** (D = {info['D']}{layer}; {len(seeds)} seeds; parameters "
            f"{' / '.join(map(str, info['counts']))}); test F1, mean [95 % interval]:",
            "",
            "| arm | " + " | ".join(f"order {n}" for n in range(1, N + 1)) + " |",
            "|---|" + "---|" * N,
            f"| linear | {_iv(_per_seed_iv(record, dataset, 'linear', 0))} |" + " |" * (N - 1),
        ]
        arms = [a for a in TPC_ARMS if per_seed(record, dataset, a)]
        for arm in arms:
            cells = [_iv(_per_seed_iv(record, dataset, arm, n)) for n in range(1, N)]
            lines.append(f"| {arm} | | {' | '.join(cells)} |")
        mlp = {"mlp@2": 2, "mlp@N": N}
        cells = {
            n: _iv(_per_seed_iv(record, dataset, a, 0))
            for a, n in mlp.items()
            if per_seed(record, dataset, a)
        }
        lines.append(
            "| MLP, matched | | " + " | ".join(cells.get(n, "") for n in range(2, N + 1)) + " |"
        )
        cas = {
            r["seed"]: r
            for r in record["rows"]
            if r["dataset"] == dataset and r["arm"] == "cascade"
        }
        d = derived(record, dataset)
        lines += [
            "",
            f"Cascade: tau {[cas[s]['tau'] for s in seeds]} (seeds {seeds}, from validation), "
            f"test F1 {_iv(d['cascade'])}, cost {_iv(d['cascade cost fraction'])} of order N's "
            f"parameters, mean exit order "
            f"{_iv({s: cas[s]['mean_exit_order'] for s in seeds})}; rows exiting at orders "
            f"1..{N} per seed: "
            + "; ".join(" ".join(f"{x:.2f}" for x in cas[s]["exit_fraction"]) for s in seeds)
            + ".",
            "",
            "Paired differences (test F1), mean [95 % interval] and per seed:",
            "",
            "| difference | mean [interval] | per seed |",
            "|---|---|---|",
        ]
        pairs = [
            ("progressive - joint_all, orders 2..N-1", "progressive, mean F1 orders 2..N-1",
             "joint_all, mean F1 orders 2..N-1"),
            ("cascade - order N", "cascade", "progressive order N"),
            ("order N - matched MLP", "progressive order N", "mlp@N"),
            ("order 2 - linear", "progressive order 2", "linear"),
        ]  # fmt: skip
        if per_seed(record, dataset, "joint"):
            joint_mid = {
                s: float(np.mean(v[1:-1])) for s, v in per_seed(record, dataset, "joint").items()
            }
            d["joint, mean F1 orders 2..N-1"] = joint_mid
            pairs.append(
                ("progressive - joint, orders 2..N-1", "progressive, mean F1 orders 2..N-1",
                 "joint, mean F1 orders 2..N-1")
            )  # fmt: skip
        for name, a, b in pairs:
            iv = stats.paired_interval(d[a], d[b])
            each = " / ".join(f"{d[a][s] - d[b][s]:+.3f}" for s in seeds)
            lines.append(f"| {name} | {iv.mean:+.3f} [{iv.low:+.3f}, {iv.high:+.3f}] | {each} |")
        lines += ["", "Validation choices (first seed's validation F1 at the last order):", ""]
        for sel in record["selections"]:
            if sel["dataset"] == dataset:
                edges = f" (edge: {sel['edges']})" if sel["edges"] else ""
                lines.append(
                    f"- {sel['arm']}: {sel['point']}, val F1 {sel['val_f1']:.3f} over "
                    f"{sel['seeds']} seed(s){edges}"
                )
        lines.append("")
    if record["edges"]:
        lines.append(f"Choices on a grid edge: {'; '.join(record['edges'])}.")
        for *edge, why in record["config"]["open_edges"]:
            lines.append(f"Open edge {' '.join(edge)}: {why}.")
    return "\n".join(lines)


def _bars(ax, x, per_seed_values, label, fmt, **kw) -> None:
    v = np.asarray(per_seed_values, np.float64)  # [points, seeds]
    m = v.mean(1)
    ax.errorbar(x, m, [m - v.min(1), v.max(1) - m], fmt=fmt, label=label, capsize=2, **kw)


def plot(record: dict, path: str) -> None:
    """Test F1 against parameters paid, per dataset: every truncation of each TPC arm, the
    cascade over tau, the matched MLPs and the linear probe (mean over seeds, range bars)."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    datasets = record["config"]["datasets"]
    fig, axes = plt.subplots(1, len(datasets), figsize=(6 * len(datasets), 4.4), squeeze=False)
    for ax, dataset in zip(axes[0], datasets, strict=True):
        info = record["datasets"][dataset]
        counts, N = info["counts"], len(info["counts"])

        for arm, fmt in zip(TPC_ARMS, ("o-", "s--", "^:"), strict=True):
            f1 = per_seed(record, dataset, arm)
            if f1:
                _bars(ax, counts, [[v[n] for v in f1.values()] for n in range(N)], arm, fmt)
        mlp = {a: per_seed(record, dataset, a) for a in ("mlp@2", "mlp@N")}
        mlp = {a: f1 for a, f1 in mlp.items() if f1}
        _bars(
            ax,
            [info["mlp_params"][a] for a in mlp],
            [[v[0] for v in f1.values()] for f1 in mlp.values()],
            "MLP (matched, tuned)",
            "d-",
        )
        cas = [r for r in record["rows"] if r["dataset"] == dataset and r["arm"] == "cascade"]
        curve = np.asarray([r["curve"] for r in cas]).mean(0)  # [taus, (tau, f1, params)]
        ax.plot(curve[:, 2], curve[:, 1], "k.-", alpha=0.6, label="cascade (tau sweep)")
        ax.plot(
            np.mean([r["mean_params"] for r in cas]),
            np.mean([r["test_f1"][0] for r in cas]),
            "rX",
            markersize=10,
            label="cascade, tau from validation",
        )
        lin = per_seed(record, dataset, "linear")
        _bars(ax, [counts[0]], [[v[0] for v in lin.values()]], "linear", "k*", markersize=10)
        ax.set_xscale("log")
        ax.set_xlabel("parameters paid (cascade: mean over rows)")
        ax.set_ylabel("test F1")
        ax.set_title(f"{dataset} (D = {info['D']}, {len(lin)} seeds; bars: range)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
