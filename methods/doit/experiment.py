"""Does DOIT's switching end lower than the single optimisers and than blind switching, on
the paper's 2-D test functions (Rosenbrock, Three-Hump Camel)?

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
"""

import dataclasses
import os
import time

import jax
import numpy as np

import methods.doit as doit
from configs import doit as doit_config
from core import cycles, results, train
from core.claims import IntervalClaim, Report
from methods.doit import policy, problems

SINGLES = ("sgd", "sgdm", "adagrad", "rmsprop", "adam")
MARGIN_DECADES = 0.3
LOSS_FLOOR = 1e-20  # log10 of an exact 0 (float32 can land on the minimum)


@dataclasses.dataclass(frozen=True)
class Settings:
    tasks: tuple
    seeds: tuple
    cycles: int
    hybrids: bool  # SWATS and Padam too


FULL = Settings(("rosenbrock", "camel"), tuple(range(20)), 80, True)
QUICK = Settings(("rosenbrock",), tuple(range(5)), 40, False)


def task_config(task: str, num_cycles: int, **doit_options):
    c = doit_config.get_config(f"task={task}")
    c.train.steps, c.train.checkpoint_every = num_cycles, 0
    for k, v in doit_options.items():
        c.doit[k] = v
    return c


class Runner:
    """One compiled cycle program per (task, pool); arms are host policies over it."""

    def __init__(self, config, timers=None):
        self.config = config
        self.method = doit.make(config, timers=timers)
        one = jax.devices()[:1]
        self.plan = train.plan(config, self.method, devices=one)
        self.init = jax.jit(self.plan.make_state, out_shardings=self.plan.state_shardings)
        self.data = self.method.dataset("train", shard=(0, 1), seed=0)  # ignored by the loss

    def run(self, seed: int, hook, first: int | None) -> tuple[train.Session, list]:
        state = self.init(train.seed_key(seed))
        if first is not None:
            where = self.plan.state_shardings.extra[cycles.OPTIMIZER]
            extra = {**state.extra, cycles.OPTIMIZER: train.place(np.int32(first), where)}
            state = state.replace(extra=extra)
        session = train.Session(
            self.config,
            self.method._replace(hook=hook),
            self.plan.mesh,
            state,
            self.plan.step,
            self.data,
            self.plan.state_shardings,
            self.plan.batch_sharding,
        )
        rows = session.train(self.config.train.steps)
        return session, rows


def final_loss(task: str, state) -> float:
    fn = problems.function(task)[0]
    return float(fn(np.asarray(state.params["xy"], np.float64)))


def measure(s: Settings, *, quick: bool) -> dict:
    rows = []
    for task in s.tasks:
        config = task_config(task, s.cycles)
        runner = Runner(config)
        names = list(config.doit.pool)
        settings = doit.settings(config, len(names))
        arms = {"doit": (doit.hook_for("doit", settings), None)}
        arms["random"] = (doit.hook_for("random", settings), None)
        arms["periodic"] = (doit.hook_for("periodic", settings), 0)
        arms |= {name: (None, names.index(name)) for name in SINGLES}
        for arm, (hook, first) in arms.items():
            start = time.perf_counter()
            for seed in s.seeds:
                session, history = runner.run(seed, hook, first)
                chosen = [int(r[cycles.OPTIMIZER]) for r in history]
                rows.append(row(task, arm, seed, session.state, chosen))
            print(f"{task} {arm}: {time.perf_counter() - start:.1f} s", flush=True)
        if s.hybrids:
            lr = config.doit.pool["adam"]["lr"]
            for arm, spec in (("swats", {"kind": "swats", "lr": lr}),
                              ("padam", {"kind": "padam", "lr": lr})):  # fmt: skip
                pooled = task_config(task, s.cycles, pool={arm: spec}, policy="single", single=arm)
                hybrid = Runner(pooled)
                for seed in s.seeds:
                    session, _ = hybrid.run(seed, None, 0)
                    rows.append(row(task, arm, seed, session.state, []))
    return results.record(
        "doit",
        "quick" if quick else "full",
        config={"quick": quick, "settings": dataclasses.asdict(s), "margin": MARGIN_DECADES},
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


def claims_from_results(record: dict) -> list:
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


def summary(record: dict) -> dict:
    """Median final log10 loss per task and arm; DOIT's optimiser shares in the first and
    last quarter of the cycles."""
    out = {}
    for task in record["config"]["settings"]["tasks"]:
        mine = [r for r in record["rows"] if r["task"] == task]
        arms = sorted({r["arm"] for r in mine})
        out[task] = {a: float(np.median([r["log10_loss"] for r in mine if r["arm"] == a]))
                     for a in arms}  # fmt: skip
        chosen = np.array([r["chosen"] for r in mine if r["arm"] == "doit"])
        quarter = max(chosen.shape[1] // 4, 1)
        for part, sl in (("early", slice(0, quarter)), ("late", slice(-quarter, None))):
            counts = np.bincount(chosen[:, sl].ravel(), minlength=len(SINGLES))
            out[task][f"doit_{part}_shares"] = dict(
                zip(SINGLES, np.round(counts / counts.sum(), 3).tolist(), strict=True)
            )
    return out


def run(workdir: str, *, quick: bool = False) -> Report:
    s = QUICK if quick else FULL
    start = time.perf_counter()
    record = measure(s, quick=quick)
    record["seconds"] = time.perf_counter() - start
    record["summary"] = summary(record)
    claims = claims_from_results(record)
    os.makedirs(workdir, exist_ok=True)
    return Report(
        method="doit",
        claims=claims,
        metrics={c.metric: c.interval.to_dict() for c in claims} | {"summary": record["summary"]},
        command="python -m launch.reproduce --methods=doit" + (" --quick" if quick else ""),
        results=record,
    )


def quick_check(record: dict) -> bool:
    """The quick run's assertion: DOIT's median-over-seeds final loss on Rosenbrock is <= the
    median single optimizer's."""
    rows = [r for r in record["rows"] if r["task"] == "rosenbrock"]
    by_arm = lambda a: np.median([r["log10_loss"] for r in rows if r["arm"] == a])
    return by_arm("doit") <= float(np.median([by_arm(a) for a in SINGLES]))


__all__ = ["run", "claims_from_results", "policy"]
