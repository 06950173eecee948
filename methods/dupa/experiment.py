"""Does aligning two noisy paths of one image train a DDT faster, beyond what the doubled batch
buys? A tiny DDT on scikit-learn digits (pixel space, `configs/dupa.py`), six arms x 3 seeds,
on two backbones, each its own record (RESULT_RUNS) with the same claims:
- "full" (the first study): additive sin-cos positions (`core.nn.dit` position "sincos");
- "full_rope" (the second, fixed before it ran, after the first study's diagnosis that shared
  additive positions make the two paths' tokens similar before any training): DDT's own 2-D
  RoPE inside attention and QK-norm, nothing added to the tokens (`configs/dupa.py`
  backbone=rope). Every other setting, the arms, claims and margins are the first study's.

Arms (configs/dupa.py ARMS): DDT at batch B, DDT at batch 2B (the equal-compute control),
dual-path with lambda = 0, DUPA (lambda = 0.5), DUPA with a stop-gradient on one path, and REPA
toward the frozen digits classifier's feature map (an in-domain "external encoder"). A seed
pairs the arms: the same network init and the same stream of training images.

One recipe for every arm, fixed before the first full run and untuned: AdamW 1e-3 (constant
after a 10 % warm-up, clipping at 1), B = 32 images per step, 450 steps, EMA 0.999 with
warm-up, label dropout 0.1. Evaluation of the EMA weights at every third of training
(`methods/dupa/evaluation.py`): Euler 50 steps, CFG 1.5 on t in [0.3, 1], FD-digits of 200
samples against the real test split (360 images), conditional accuracy, and the linear probe of
mean-pooled tokens at the alignment block at t = 0.5 (fit on the train split, scored on test).

Claims (fixed before the first full run; margins are fractions of DDT-B's mean final FD, m):
- FD(DUPA) < FD(dual, lambda 0) by more than 0.05 m (the alignment itself helps);
- FD(dual) <= FD(DDT, 2B) within 0.05 m (dual-path sampling is at least the doubled batch);
- FD(DDT, 2B) < FD(DDT, B) by more than 0.05 m (the doubled batch helps);
- DUPA reaches DDT-B's final FD (same seed) by 2/3 of the steps: the first checkpoint at or
  below it, as a fraction of the run (2.0 if never), at most 0.8 on every seed;
- the probe accuracy is higher with DUPA than with DDT-B by more than 0.01.
Quick (aimed at about 30 s of an idle 2-core machine): DDT-B and DUPA only on the RoPE
backbone, the quick model (width 32), 100 steps, one evaluation of 100 samples with 10 Euler
steps, the digits classifier read from the per-machine cache; the claim, fixed before it ran:
DUPA's FD below DDT-B's by more than 0.05 m. Every (arm, seed) run is cached by config and code
hash (`core.cache`).

    python -m launch.reproduce --methods=dupa            # both backbones, both records
    python -m methods.dupa.experiment --run=full_rope --workdir=/tmp/dupa_rope   # one of them
    python -m methods.dupa.experiment_v2 --workdir=/tmp/dupa_v2                 # the re-test

The re-test (issue 47: the first two studies' alignment collapses) is its own record, "full_v2",
with its own arms, grid and claims: `experiment_v2.py`.
"""

import argparse
import dataclasses
import os
import shutil
import time

import jax
import numpy as np

from configs import dupa as dupa_config
from core import cache, experiment_runner, results, train
from core.claims import IntervalClaim, Report, verdict_lines
from methods.dupa import evaluation, experiment_v2, make, model_config

SEEDS = (0, 1, 2)
ARMS = ("ddt", "dupa", "ddt_2b", "dual", "dupa_sg", "repa")
LABELS = {
    "ddt": "DDT, batch B",
    "ddt_2b": "DDT, batch 2B",
    "dual": "dual-path, lambda 0",
    "dupa": "DUPA, lambda 0.5",
    "dupa_sg": "DUPA, stop-gradient",
    "repa": "REPA, digits classifier",
}
NOT_REACHED = 2.0  # the step fraction recorded when a run never reaches the target FD
GRID_PER_CLASS = 2  # samples per digit in the figure's grid


@dataclasses.dataclass(frozen=True)
class Settings:
    size: str  # configs/dupa.py size
    backbone: str  # configs/dupa.py backbone
    arms: tuple[str, ...]
    steps: int
    evaluations: int  # evenly spaced, the last at `steps`
    num_samples: int
    sample_steps: int
    margin_fraction: float  # of DDT-B's mean final FD
    probe_margin: float
    max_step_fraction: float


# Sized on the loaded 2-core machine (load 7-11 from other jobs): a first full run at 600 steps
# and 3 evaluations took 6.5 min per (arm, seed) (DDT at 2B), about 2 hours for the 18 runs, and
# was stopped after two runs; this one trains 450 steps with 3 evaluations of 200 samples.
FULL = Settings("full", "sincos", ARMS, 450, 3, 200, 50, 0.05, 0.01, 0.8)
FULL_ROPE = dataclasses.replace(FULL, backbone="rope")  # the second study: only the backbone
# The quick run (a smoke check, ~30 s idle, the digits classifier cached per machine). Its size
# came from time, not from its result: 150 steps and 25 sampling steps took 70 s idle.
QUICK = Settings("quick", "rope", ("ddt", "dupa"), 100, 1, 100, 10, 0.05, 0.01, 0.8)
# record name -> settings; launch.reproduce saves and re-derives each full record.
RUNS = {"full": FULL, "full_rope": FULL_ROPE}
# The re-test (issue 47, `experiment_v2.py`): its own record, written by core.experiment_runner.
V2 = experiment_v2.EXPERIMENT.run_name(quick=False)  # "full_v2"
RESULT_RUNS = (*RUNS, V2)  # each with its record in results/ (a test checks the pairing)


def run_config(s: Settings, arm: str, seed: int, workdir: str):
    config = dupa_config.get_config(f"size={s.size},arm={arm},backbone={s.backbone}")
    config.seed = seed
    config.train.steps = s.steps
    config.train.eval_every = s.steps // s.evaluations
    config.train.log_every = max(s.steps // 4, 1)
    config.train.checkpoint_every = 0
    config.eval.num_samples, config.eval.sample_steps = s.num_samples, s.sample_steps
    if s.size != "quick":  # quick: the config's per-machine cache, trained once per machine
        config.eval.classifier_cache = os.path.join(workdir, "cache")
    return config


def grid_samples(config, params) -> list:
    """GRID_PER_CLASS samples of each digit from the EMA params (the evaluation's noise)."""
    n = GRID_PER_CLASS * 10
    cfg = model_config(config)
    noise = np.asarray(jax.random.normal(jax.random.key(0), (n, 8, 8, 1)), np.float32)
    labels = evaluation.sample_labels(n)
    guidance = evaluation.guidance(cfg, config.eval)
    x = evaluation.sample(
        cfg, params, noise, labels, steps=config.eval.sample_steps, guidance=guidance
    )
    return np.round(np.asarray(x)[..., 0], 3).tolist()


def train_and_evaluate(config, workdir: str) -> dict:
    start = time.perf_counter()
    # One device: the tests' 8 fake CPU devices would split each small batch 8 ways.
    result = train.run(config, make(config), workdir, devices=jax.devices()[:1])
    evals = [
        {"step": row["step"], **{k.removeprefix("eval/"): v for k, v in row.items() if "/" in k}}
        for row in result.history
        if "eval/fd" in row
    ]
    seconds = time.perf_counter() - start
    samples = grid_samples(config, result.state.extra["ema"]["net"])
    return {"evals": evals, "final": evals[-1], "seconds": seconds, "samples": samples}


def cached_run(config, workdir: str, code: str, label: str) -> dict:
    return cache.cached_run(train_and_evaluate, config, code, workdir, f"dupa/{label}")


def measure(workdir: str, *, quick: bool = False, run: str = "full", seeds=SEEDS) -> dict:
    s = QUICK if quick else RUNS[run]
    code = results.code_version("dupa")["source_hash"]
    rows, curves, samples = [], {}, {}
    # Arm by arm, the arms the claims compare first: a run cut short still has whole arms.
    for arm in s.arms:
        for seed in seeds:
            label = f"{s.backbone}: {arm} seed {seed}"
            out = cached_run(run_config(s, arm, seed, workdir), workdir, code, label)
            final = {k: out["final"][k] for k in ("fd", "cond_accuracy", "probe_accuracy")}
            rows.append({"arm": arm, "seed": seed, **final, "seconds": out["seconds"]})
            curves[f"{arm}/{seed}"] = [(e["step"], e["fd"]) for e in out["evals"]]
            if seed == seeds[0]:
                samples[arm] = out["samples"]
    return results.record(
        "dupa",
        "quick" if quick else run,
        config={
            "seeds": list(seeds),
            "quick": quick,
            "settings": dataclasses.asdict(s),
            "train": {a: run_config(s, a, 0, "<workdir>").to_dict() for a in s.arms},
        },
        rows=rows,
        code=results.code_version("dupa"),
        fd_curves=curves,
        grid_samples=samples,
    )


def step_fractions(record: dict) -> dict:
    """Per seed: the first checkpoint where DUPA's FD is at or below DDT-B's final FD, as a
    fraction of the run's steps (NOT_REACHED if none)."""
    steps = record["config"]["settings"]["steps"]
    target = results.by_seed(record["rows"], "fd", arm="ddt")
    out = {}
    for seed, fd_b in target.items():
        curve = record["fd_curves"][f"dupa/{seed}"]
        reached = [step for step, fd in curve if fd <= fd_b]
        out[seed] = min(reached) / steps if reached else NOT_REACHED
    return out


def claims_from_results(record: dict) -> list[IntervalClaim]:
    if record["run"] == V2:
        return experiment_v2.claims_from_results(record)
    return claims_of_study(record)


def claims_of_study(record: dict) -> list[IntervalClaim]:
    """The claims of the first two studies' records (and of the quick one)."""
    s = record["config"]["settings"]
    fd = {arm: results.by_seed(record["rows"], "fd", arm=arm) for arm in s["arms"]}
    m = float(np.mean(list(fd["ddt"].values())))
    margin = s["margin_fraction"] * m
    backbone = s.get("backbone", "sincos")  # the first study's record predates the field
    head = f"{backbone}: at {s['steps']} steps"
    if "dual" not in fd:  # quick: DDT-B and DUPA only
        return [
            IntervalClaim.beats(
                f"{head}, FD(DUPA) < FD(DDT, B) by > {s['margin_fraction']:g} of DDT-B's FD",
                "fd: ddt - dupa",
                fd["ddt"],
                fd["dupa"],
                margin,
            )
        ]
    probe = {a: results.by_seed(record["rows"], "probe_accuracy", arm=a) for a in ("dupa", "ddt")}
    frac = s["margin_fraction"]
    return [
        IntervalClaim.beats(
            f"{head}, FD(DUPA) < FD(dual-path, lambda 0) by > {frac:g} of DDT-B's FD",
            "fd: dual - dupa",
            fd["dual"],
            fd["dupa"],
            margin,
        ),
        IntervalClaim.no_worse(
            f"{head}, FD(dual-path, lambda 0) <= FD(DDT, 2B) within {frac:g} of DDT-B's FD",
            "fd: ddt_2b - dual",
            fd["ddt_2b"],
            fd["dual"],
            margin,
        ),
        IntervalClaim.beats(
            f"{head}, FD(DDT, 2B) < FD(DDT, B) by > {frac:g} of DDT-B's FD",
            "fd: ddt - ddt_2b",
            fd["ddt"],
            fd["ddt_2b"],
            margin,
        ),
        IntervalClaim.at_most(
            f"{backbone}: DUPA reaches DDT-B's final FD within {s['max_step_fraction']:g} of the "
            f"steps (first checkpoint at or below it; {NOT_REACHED:g} = never)",
            "dupa/steps to DDT-B's final FD (fraction)",
            step_fractions(record),
            s["max_step_fraction"],
        ),
        IntervalClaim.beats(
            f"{backbone}: the encoder's linear probe (t = 0.5, block tokens) is higher with DUPA "
            f"by > {s['probe_margin']:g}",
            "probe accuracy: dupa - ddt",
            probe["dupa"],
            probe["ddt"],
            s["probe_margin"],
        ),
    ]


def summary(record: dict) -> list[dict]:
    """Per arm: the mean and range over seeds of each final metric and of the run time."""
    out = []
    for arm in record["config"]["settings"]["arms"]:
        row = {"arm": arm}
        for metric in ("fd", "cond_accuracy", "probe_accuracy", "seconds"):
            values = list(results.by_seed(record["rows"], metric, arm=arm).values())
            row[metric] = (float(np.mean(values)), float(np.min(values)), float(np.max(values)))
        out.append(row)
    return out


def figure_suffix(record: dict) -> str:
    """The figures' file suffix: none for "full" and "quick", "_rope" for "full_rope"."""
    part = record["run"].partition("_")[2]
    return f"_{part}" if part else ""


def plot(record: dict, workdir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = record["config"]["settings"]["arms"]
    backbone = record["config"]["settings"].get("backbone", "sincos")
    suffix = figure_suffix(record)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for i, arm in enumerate(arms):
        for seed in record["config"]["seeds"]:
            steps, fds = zip(*record["fd_curves"][f"{arm}/{seed}"], strict=True)
            label = LABELS[arm] if seed == record["config"]["seeds"][0] else None
            ax.plot(steps, fds, "o-", color=f"C{i}", alpha=0.7, label=label)
    ax.set(xlabel="training step", ylabel="FD-digits (test, EMA weights)", yscale="log")
    ax.set_title(f"FD vs steps, {backbone} backbone, one line per seed")
    ax.legend(fontsize=8)
    fig.tight_layout()
    curve_path = os.path.join(workdir, f"dupa_fd_vs_steps{suffix}.png")
    fig.savefig(curve_path, dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(len(arms), 1, figsize=(10, 1.3 * len(arms)))
    for ax, arm in zip(np.atleast_1d(axes), arms, strict=True):
        images = np.asarray(record["grid_samples"][arm])  # [2 * 10, 8, 8], labels 0..9 twice
        rows = [np.concatenate(list(images[r * 10 : (r + 1) * 10]), axis=1) for r in range(2)]
        ax.imshow(np.concatenate(rows, axis=0), cmap="gray_r", vmin=-1, vmax=1)
        ax.set_axis_off()
        ax.set_title(LABELS[arm], fontsize=9)
    fig.tight_layout()
    grid_path = os.path.join(workdir, f"dupa_samples{suffix}.png")
    fig.savefig(grid_path, dpi=120)
    plt.close(fig)
    return [curve_path, grid_path]


def run(workdir: str, *, quick: bool = False, runs=None) -> Report:
    """The quick record, or the full records `runs` (default all, newest first: the re-test, the
    RoPE study, the first study; a run cut short has the newer ones), each with its claims and
    figures, in one report."""
    names = ("quick",) if quick else (runs or (V2, "full_rope", "full"))
    records = [
        experiment_runner.measure(experiment_v2.EXPERIMENT, workdir)
        if name == V2
        else measure(workdir, quick=quick, run=name)
        for name in names
    ]
    claims = [c for r in records for c in claims_from_results(r)]
    return Report.on_protocol(
        method="dupa",
        figures=[
            f for r in records for f in (experiment_v2.plot if r["run"] == V2 else plot)(r, workdir)
        ],
        claims=claims,
        quick=quick,
        results=records if len(records) > 1 else records[0],
    )


def main() -> None:
    """One full record (e.g. the RoPE study alone): trains, prints its claims, saves
    methods/dupa/results/<run>.json and copies its figures beside this README."""
    from core import compile_cache

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--run", choices=RESULT_RUNS, default="full_rope")  # v2: its own main
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()
    compile_cache.enable()
    report = run(args.workdir, runs=(args.run,))
    print("\n".join(verdict_lines(report.claims)))
    print("saved", results.save(report.results))
    here = os.path.dirname(os.path.abspath(__file__))
    for figure in report.figures:
        shutil.copy(figure, os.path.join(here, os.path.basename(figure).removeprefix("dupa_")))


if __name__ == "__main__":
    main()
