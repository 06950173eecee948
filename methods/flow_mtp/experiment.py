"""Does an O-PTP student emit many correct tokens per call, and is u what makes it possible?

Toy teacher (`teacher.increasing_sequence`, V = 100), completion length L, 3 seeds. For each
seed, two students trained through `core.train.run` with the same budget and settings: O-PTP
(slots fed u_emb(u_k)) and the no-u baseline (the same network, every slot fed one constant:
independent multi-token prediction, which can only emit per-slot modes). Metric: `correct`,
the leading slots whose argmax equals the teacher's token given the same u's (u ~ U(0, 1) in
the teacher's bins), mean over held-out test completions; it is the number of tokens a
verification call accepts before its corrected token.

Claims (fixed before any result was seen), on intervals over the 3 seeds:
- O-PTP beats the no-u baseline by more than a quarter of L (4 tokens at L = 16; quick: 1 of 8)
  in correct prefix per forward pass (paired by seed);
- O-PTP's correct prefix is at least half of L (quick: 0.3 L);
- without u the correct prefix stays below 1.5 (independent prediction: about 1).

The learning rate is chosen on validation sequences (another seed stream than training and
test) from a 3-point grid at a short budget on seed 0, for each variant separately with the
same grid, budget and rule; the training length is set by the CPU budget, not by results.
Every (variant, seed) run is cached by config and code hash (`core.cache`).
"""

import dataclasses
import functools
import os
import types

import jax

from configs import flow_mtp as flow_mtp_config
from core import cache, results, selection, train
from core.claims import IntervalClaim, Report
from methods.flow_mtp import code_experiment, experiment_code_v2, experiment_cptp, make

SEEDS = (0, 1, 2)
VARIANTS = {"ptp": True, "no_u": False}  # variant -> use_u
# 1e-3 / 3e-3 / 1e-2 chose 1e-2, the grid's edge (600 steps, earlier data without long
# prefixes), so the grid moved up one step.
LR_GRID = (3e-3, 1e-2, 3e-2)


@dataclasses.dataclass(frozen=True)
class Settings:
    completion_len: int
    context_len: int
    max_start: int
    d_model: int
    num_layers: int
    steps: int
    select_steps: int
    batch_size: int
    eval_every: int
    num_eval: int
    margin_fraction: float  # of L: the u - no-u margin
    target_fraction: float  # of L: O-PTP's correct prefix


# Full: our plan's toy (2 layers, d = 64, L = 16; AdamW, warmup + cosine) at batch 32 and a
# context of up to 8 tokens instead of batch 64: on 2 shared cores a batch of 64 x 32 tokens
# cost 6x the step time of 32 x 24 (XLA:CPU under load), and the toy's next token depends on
# the last context token only. Completions start anywhere in the first 64 tokens (token values
# up to ~60), so decoding well past the prompt stays in the training range. 3000 steps: what
# ~25 minutes of the shared machine afford.
FULL = Settings(16, 8, 64, 64, 2, 3000, 600, 32, 375, 1024, 0.25, 0.5)
# Quick: L = 8, a smaller model, 150 steps, one evaluation (a smoke check; an untrained or
# u-blind student fails it: its correct prefix is about 1; at 200 steps seeds 0-2 gave 5.3-6.1).
QUICK = Settings(8, 4, 16, 32, 2, 150, 0, 32, 150, 128, 0.125, 0.3)


def run_config(s: Settings, variant: str, seed: int, *, lr: float, steps: int, split: str):
    config = flow_mtp_config.get_config(f"size=toy,u={'on' if VARIANTS[variant] else 'off'}")
    config.seed = seed
    config.ptp.completion_len, config.ptp.context_len = s.completion_len, s.context_len
    config.ptp.max_start = s.max_start
    config.model.d_model, config.model.num_layers = s.d_model, s.num_layers
    config.model.d_ff = 4 * s.d_model
    config.train.steps, config.train.batch_size = steps, s.batch_size
    config.train.log_every = max(steps // 4, 1)
    config.train.eval_every = s.eval_every if split == "test" else 0
    config.train.checkpoint_every = 0
    config.optim.lr, config.optim.warmup_steps = lr, min(100, steps // 10)
    config.eval.num_examples, config.eval.split = s.num_eval, split
    return config


def train_and_evaluate(config, workdir: str) -> dict:
    """One run: the held-out metrics at every evaluation (the last is the final)."""
    # One device: the tests' 8 fake CPU devices would split each small batch 8 ways.
    result = train.run(config, make(config), workdir, devices=jax.devices()[:1])
    evals = [
        {"step": row["step"], **{k.removeprefix("eval/"): v for k, v in row.items() if "/" in k}}
        for row in result.history
        if any(k.startswith("eval/") for k in row)
    ]
    return {"evals": evals, "final": evals[-1]}


def cached_run(config, workdir: str, code: str, label: str) -> dict:
    return cache.cached_run(train_and_evaluate, config, code, workdir, f"flow_mtp/{label}")


def choose_lr(s: Settings, variant: str, workdir: str, code: str) -> tuple[float, dict]:
    """The grid's best validation correct prefix at the short budget (seed 0)."""
    if not s.select_steps:  # quick: our plan's rate, no search
        return 3e-3, {}
    by_point = {}
    for lr in LR_GRID:
        config = run_config(s, variant, 0, lr=lr, steps=s.select_steps, split="validation")
        out = cached_run(config, workdir, code, f"select {variant} lr={lr:g}")
        by_point[(lr,)] = {0: out["final"]["correct"]}
    scores = selection.ValidationScores("validation/correct", by_point)
    chosen = selection.select({"lr": LR_GRID}, scores, rule="max")
    info = {
        "means": {f"{k[0]:g}": v for k, v in chosen.means.items()},
        "edge": chosen.edges["lr"],
        "steps": s.select_steps,
    }
    return chosen.point["lr"], info


def measure(workdir: str, *, quick: bool = False, seeds=SEEDS) -> dict:
    s = QUICK if quick else FULL
    code = results.code_version("flow_mtp")["source_hash"]
    rows, curves, chosen = [], {}, {}
    for variant in VARIANTS:
        lr, info = choose_lr(s, variant, workdir, code)
        chosen[variant] = {"lr": lr, **info}
        for seed in seeds:
            config = run_config(s, variant, seed, lr=lr, steps=s.steps, split="test")
            out = cached_run(config, workdir, code, f"{variant} seed {seed}")
            rows.append({"variant": variant, "seed": seed, **out["final"]})
            curves[f"{variant}/{seed}"] = [(e["step"], e["correct"]) for e in out["evals"]]
    return results.record(
        "flow_mtp",
        "quick" if quick else "full",
        config={
            "seeds": list(seeds),
            "quick": quick,
            "settings": dataclasses.asdict(s),
            "lr_grid": list(LR_GRID),
            "chosen": chosen,
            "train": {
                v: run_config(s, v, 0, lr=chosen[v]["lr"], steps=s.steps, split="test").to_dict()
                for v in VARIANTS
            },
        },
        rows=rows,
        code=results.code_version("flow_mtp"),
        correct_curves=curves,
    )


# The full run has three parts, each its own record (launch.reproduce saves and re-derives each):
# the toy teacher (this module), the code teacher vs Medusa (code_experiment) and C-PTP from
# scratch (experiment_cptp). The quick run is the toy part alone (the quick budget).
# The re-test (issue 47; README, "Re-test (issue 47)"): two parts of their own, each its own
# record, also run alone by their own commands (experiment_code_v2, experiment_cptp --v2). Each
# joined RESULT_RUNS in the commit that added its results file
# (tests/methods/test_flow_mtp_retest.py holds the two together).
PARTS = {
    "code": code_experiment,
    "cptp": experiment_cptp,
    "code_v2": experiment_code_v2,
    "cptp_v2": types.SimpleNamespace(run=functools.partial(experiment_cptp.run, v2=True)),
}
V2_RUNS = (experiment_code_v2.EXPERIMENT.run_name(quick=False), "full_cptp_v2")
RESULT_RUNS = ("full", *(f"full_{part}" for part in PARTS))


def claims_from_results(record: dict) -> list[IntervalClaim]:
    """The claims of one part's record (its part read from `record["run"]`)."""
    part = record["run"].partition("_")[2]
    if part == "code_v2":
        return experiment_code_v2.claims_from_results(record)
    if part in ("cptp", "cptp_v2"):
        return experiment_cptp.claims_cptp(record)
    if part == "code":
        return code_experiment.claims_code(record)
    return toy_claims(record)


def toy_claims(record: dict) -> list[IntervalClaim]:
    s = record["config"]["settings"]
    L = s["completion_len"]
    ptp = results.by_seed(record["rows"], "correct", variant="ptp")
    no_u = results.by_seed(record["rows"], "correct", variant="no_u")
    return [
        IntervalClaim.beats(
            f"u lets the student emit more correct tokens per call than independent prediction "
            f"(by > {s['margin_fraction']:g} L, L = {L})",
            "correct prefix: ptp - no_u",
            ptp,
            no_u,
            s["margin_fraction"] * L,
        ),
        IntervalClaim.at_least(
            f"O-PTP's correct prefix per call is at least {s['target_fraction']:g} L (L = {L})",
            "ptp/correct",
            ptp,
            s["target_fraction"] * L,
        ),
        IntervalClaim.at_most(
            "without u the correct prefix stays near 1 (below 1.5)", "no_u/correct", no_u, 1.5
        ),
    ]


def plot_curves(curves: dict, path: str, completion_len: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, points in curves.items():
        variant, seed = name.split("/")
        steps, values = zip(*points, strict=True)
        colour = "C0" if variant == "ptp" else "C1"
        label = {"ptp": "O-PTP (with u)", "no_u": "no u (independent)"}[variant]
        ax.plot(steps, values, "o-", color=colour, alpha=0.8, label=label if seed == "0" else None)
    ax.axhline(completion_len, color="grey", lw=0.8, ls="--")
    ax.set(xlabel="training step", ylabel="correct prefix per call (test)", ylim=(0, None))
    ax.set_title(f"PTP on the toy teacher, L = {completion_len} (one line per seed)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(workdir: str, *, quick: bool = False) -> Report:
    """The toy part (quick: alone), then in a full run the code and C-PTP parts, each its own
    record (RESULT_RUNS) and claims, in one report."""
    record = measure(workdir, quick=quick)
    claims = claims_from_results(record)
    figure = os.path.join(workdir, "flow_mtp_correct_prefix.png")
    L = record["config"]["settings"]["completion_len"]
    plot_curves(record["correct_curves"], figure, L)
    records, figures = [record], [figure]
    if not quick:
        for part in PARTS.values():
            report = part.run(workdir, quick=False)
            records.append(report.results)
            claims += report.claims
            figures += report.figures
    return Report.on_protocol(
        method="flow_mtp",
        figures=figures,
        claims=claims,
        quick=quick,
        results=records if len(records) > 1 else record,
    )
