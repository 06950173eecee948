"""Does DOIT's switching end lower than the single optimisers and than blind switching, on
the paper's 2-D test functions (Rosenbrock, Three-Hump Camel)? Parts 2 and 3 (the digits MLP
and the transfer setting) are methods/doit/on_digits.py and on_transfer.py, each its own
results record (RESULT_RUNS); `python -m methods.doit.experiment --run=full_transfer ...`
reruns chosen parts alone.

Every arm runs the same steps (80 cycles of tau = 25: 2000 steps; quick: Rosenbrock, 40
cycles, 5 seeds) from the same start point per seed (drawn in the box of
methods/doit/problems.py from the seed's key): DOIT (cold start 10 cycles, then the GPs), random
and periodic switching over the same pool, each of the five optimisers alone (SGD, SGDM,
Adagrad, RMSprop, Adam at the learning rates of configs/doit.py, fixed before any run), SWATS
and Padam (Adam's learning rate). Everything runs through core.train's cycle step
(core/cycles.py); the arms of one task share one compiled program (only the host policy
differs), so each seed is a fresh initial state, not a new compile.

Claims (margins fixed in this file before the first full run), per task, on bootstrap
intervals over the seeds of paired differences in log10 of the final loss (lower is better):
DOIT no worse than the per-seed median of the five single optimisers, than random and than
periodic switching, each within a margin of 0.3 decades (a factor of 2).

The quick run (5 seeds, 40 cycles) keeps the median-single claim and replaces the two against
blind switching, which 5 seeds cannot decide, by smoke checks that a working pipeline passes
and a broken one fails (SMOKE_CHECKS): DOIT learned (its final loss SMOKE_LEARNED_DECADES below
its seed's start point, also recorded in the quick run as arm "start"), and switching works
(random switching SMOKE_SWITCHING_DECADES below the median single optimizer).
"""

import argparse
import dataclasses
import os
import shutil
import time

import numpy as np

from core import cycles, results, train
from core.claims import IntervalClaim, Report, verdict_lines
from methods.doit import on_digits, on_transfer, problems
from methods.doit.runs import SINGLES, Runner, arms, shares, task_config

RESULT_RUNS = ("full", "full_digits", "full_transfer")
PARTS = {  # run -> (measure, summary)
    "full_digits": (lambda: on_digits.measure(on_digits.Settings()), on_digits.summary),
    "full_transfer": (lambda: on_transfer.measure(on_transfer.Settings()), on_transfer.summary),
}
MARGIN_DECADES = 0.3
# Smoke checks' margins, from what a broken pipeline gives, not from a measured quick value. An
# untrained run (lr 0, no step) ends at its start: 0 decades; one that ascends ends above it.
# Rosenbrock's start box puts the start on the valley's walls (loss ~10-3000); any descent
# reaches the valley floor (loss < 1) within a few cycles: 2 decades a broken step cannot fake.
SMOKE_LEARNED_DECADES = 2.0
# Switching that does not switch (the hook ignored) is one optimizer alone: it ends with the
# single optimizers, about 0 decades from their median; 0.3 decades is the claims' own margin.
SMOKE_SWITCHING_DECADES = 0.3
LOSS_FLOOR = 1e-20  # log10 of an exact 0 (float32 can land on the minimum)


@dataclasses.dataclass(frozen=True)
class Settings:
    tasks: tuple
    seeds: tuple
    cycles: int
    hybrids: bool  # SWATS and Padam too


FULL = Settings(("rosenbrock", "camel"), tuple(range(20)), 80, True)
QUICK = Settings(("rosenbrock",), tuple(range(5)), 40, False)


def final_loss(task: str, state) -> float:
    fn = problems.function(task)[0]
    return float(fn(np.asarray(state.params["xy"], np.float64)))


def measure(s: Settings, *, quick: bool) -> dict:
    rows = []
    for task in s.tasks:
        config = task_config(task, s.cycles)
        runner = Runner(config)
        for arm, (hook, first) in arms(config).items():
            start = time.perf_counter()
            for seed in s.seeds:
                session, history, _ = runner.run(seed, hook, first)
                chosen = [int(r[cycles.OPTIMIZER]) for r in history]
                rows.append(row(task, arm, seed, session.state, chosen))
            print(f"{task} {arm}: {time.perf_counter() - start:.1f} s", flush=True)
        if quick:  # each seed's start point (the same for every arm), for the smoke checks
            for seed in s.seeds:
                session = train.start_session(config, runner.method, runner.plan, seed=seed)
                rows.append(row(task, "start", seed, session.state, []))
    if s.hybrids:
        lr = config.doit.pool["adam"]["lr"]
        for arm, spec in (("swats", {"kind": "swats", "lr": lr}),
                              ("padam", {"kind": "padam", "lr": lr})):  # fmt: skip
            pooled = task_config(task, s.cycles, pool={arm: spec}, policy="single", single=arm)
            hybrid = Runner(pooled)
            for seed in s.seeds:
                session, _, _ = hybrid.run(seed, None, 0)
                rows.append(row(task, arm, seed, session.state, []))
    return results.record(
        "doit",
        "quick" if quick else "full",
        config={
            "quick": quick,
            "settings": dataclasses.asdict(s),
            "margin": MARGIN_DECADES,
            # The order of "chosen"'s indices: the config's pool order (ConfigDict sorts names).
            "pool": list(task_config(s.tasks[0], s.cycles).doit.pool),
        },
        rows=rows,
    )


def row(task, arm, seed, state, chosen) -> dict:
    loss = final_loss(task, state)
    return {
        "task": task,
        "arm": arm,
        "seed": seed,
        "final_loss": loss,
        "log10_loss": float(np.log10(max(loss, LOSS_FLOOR))),
        "chosen": chosen,
    }


def toy_claims(record: dict) -> list:
    rows = record["rows"]
    margin = record["config"]["margin"]
    claims = []
    for task in record["config"]["settings"]["tasks"]:
        # Lower loss is better: compare minus log10 loss, so "no worse" reads the right way.
        score = lambda arm, t=task: {
            r["seed"]: -r["log10_loss"] for r in rows if r["task"] == t and r["arm"] == arm
        }
        doit_ = score("doit")
        singles = [score(name) for name in SINGLES]
        median = {seed: float(np.median([s[seed] for s in singles])) for seed in doit_}
        for name, other in (("the median single optimizer", median),
                            ("random switching", score("random")),
                            ("periodic switching", score("periodic"))):  # fmt: skip
            claims.append(
                IntervalClaim.no_worse(
                    f"{task}: DOIT's final loss <= {name} (log10, within {margin} decades)",
                    f"{task}/doit_vs_{name.split()[0]}_{name.split()[-1]}",
                    doit_,
                    other,
                    margin,
                )
            )
    return claims


def smoke_checks(record: dict) -> list:
    """The quick run's checks beside the median-single claim: learning happened (DOIT far below
    its start) and switching works (random switching below the median single optimizer)."""
    rows, claims = record["rows"], []
    for task in record["config"]["settings"]["tasks"]:
        score = lambda arm, t=task: {
            r["seed"]: -r["log10_loss"] for r in rows if r["task"] == t and r["arm"] == arm
        }
        singles = [score(name) for name in SINGLES]
        median = {seed: float(np.median([s[seed] for s in singles])) for seed in score("doit")}
        claims += [
            IntervalClaim.beats(
                f"smoke: {task}: DOIT learned: final loss below the start point's by > "
                f"{SMOKE_LEARNED_DECADES:g} decades (log10, paired by seed)",
                f"{task}/smoke_doit_vs_start",
                score("doit"),
                score("start"),
                SMOKE_LEARNED_DECADES,
            ),
            IntervalClaim.beats(
                f"smoke: {task}: switching works: random switching's final loss below the "
                f"median single optimizer's by > {SMOKE_SWITCHING_DECADES:g} decades (log10)",
                f"{task}/smoke_random_vs_median",
                score("random"),
                median,
                SMOKE_SWITCHING_DECADES,
            ),
        ]
    return claims


def summary(record: dict) -> dict:
    """Median final log10 loss per task and arm; DOIT's optimiser shares."""
    out = {}
    for task in record["config"]["settings"]["tasks"]:
        mine = [r for r in record["rows"] if r["task"] == task]
        arms_ = sorted({r["arm"] for r in mine})
        out[task] = {a: float(np.median([r["log10_loss"] for r in mine if r["arm"] == a]))
                     for a in arms_}  # fmt: skip
        chosen = [r["chosen"] for r in mine if r["arm"] == "doit"]
        out[task]["doit_shares"] = shares(chosen, record["config"]["pool"])
    return out


def claims_from_results(record: dict) -> list:
    if record["run"] == "full_digits":
        return on_digits.claims_from_results(record)
    if record["run"] == "full_transfer":
        return on_transfer.claims_from_results(record)
    if record["config"].get("quick"):  # the median-single claim holds at 5 seeds; the others not
        return toy_claims(record)[0::3] + smoke_checks(record)
    return toy_claims(record)


def timed(measure_fn, summary_fn) -> dict:
    start = time.perf_counter()
    record = measure_fn()
    record["seconds"] = time.perf_counter() - start
    record["summary"] = summary_fn(record)
    return record


def run(workdir: str, *, quick: bool = False, runs: tuple = RESULT_RUNS) -> Report:
    s = QUICK if quick else FULL
    records = []
    if quick or "full" in runs:
        records.append(timed(lambda: measure(s, quick=quick), summary))
    if not quick:
        records += [timed(*PARTS[r]) for r in runs if r in PARTS]
    claims = [c for r in records for c in claims_from_results(r)]
    os.makedirs(workdir, exist_ok=True)
    figures = []
    for record in records:
        if record["run"] == "full_digits":
            figures.append(os.path.join(workdir, "doit_switching.png"))
            plot_switching(record, figures[-1])
    return Report(
        method="doit",
        claims=claims,
        metrics={c.metric: c.interval.to_dict() for c in claims}
        | {"summary": {r["run"]: r["summary"] for r in records}},
        command="python -m launch.reproduce --methods=doit" + (" --quick" if quick else ""),
        figures=figures,
        results=records if len(records) > 1 else records[0],
    )


def plot_switching(record: dict, path: str) -> None:
    """DOIT's switching pattern on digits: each optimiser's share of the seeds per cycle."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = record["config"]["pool"]
    chosen = np.array([r["chosen"] for r in record["rows"] if r["arm"] == "doit"])
    shares_KC = np.stack([(chosen == k).mean(0) for k in range(len(names))])
    steps = (np.arange(chosen.shape[1]) + 1) * record["config"]["tau"]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.stackplot(steps, shares_KC, labels=names)
    ax.set_xlabel("step")
    ax.set_ylabel("share of seeds")
    ax.set_title(f"DOIT's optimiser per cycle, digits MLP, {chosen.shape[0]} seeds")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def quick_check(record: dict) -> bool:
    """The quick run's assertion: DOIT's median-over-seeds final loss on Rosenbrock is <= the
    median single optimizer's."""
    rows = [r for r in record["rows"] if r["task"] == "rosenbrock"]
    by_arm = lambda a: np.median([r["log10_loss"] for r in rows if r["arm"] == a])
    return by_arm("doit") <= float(np.median([by_arm(a) for a in SINGLES]))


def main() -> None:
    """Chosen full parts alone (e.g. the transfer setting): trains, prints their claims, saves
    methods/doit/results/<run>.json and copies the figure beside this README."""
    from core import compile_cache

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--run", choices=RESULT_RUNS, action="append", required=True)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()
    compile_cache.enable()
    report = run(args.workdir, runs=tuple(args.run))
    print("\n".join(verdict_lines(report.claims)))
    records = report.results if isinstance(report.results, list) else [report.results]
    for record in records:
        print("saved", results.save(record))
    here = os.path.dirname(os.path.abspath(__file__))
    for figure in report.figures:
        shutil.copy(figure, os.path.join(here, os.path.basename(figure).removeprefix("doit_")))


if __name__ == "__main__":
    main()
