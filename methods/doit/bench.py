"""What does DOIT's switching cost next to training with one optimiser?

    python -m launch.bench --methods=doit          # 80 cycles of 25 steps (2000 steps)
    python -m launch.bench --methods=doit --smoke  # 12 cycles

One process, one device, Rosenbrock (methods/doit/experiment.py's runner, both runs through
core.train's cycle step, compiled before timing): the wall time of a DOIT run next to an
Adam-only run of the same cycles (seed 0), and the DOIT run's host time split into the cycle
score, the PCA (snapshots, fit, on-device projection), the GP surrogates and the acquisition.
On a 2-D problem a step costs microseconds, so this measures the policy's absolute cost per
cycle against almost no training: the paper's "under 1 %" is a ratio to a ResNet's step.
"""

import time

from core.benchmark import Ratio, Result, machine
from methods.doit import policy, runs


def measure(*, smoke: bool = False) -> Result:
    num_cycles = 12 if smoke else 80
    config = runs.task_config("rosenbrock", num_cycles)
    timers = policy.Timers()
    runner = runs.Runner(config, timers=timers)
    adam = list(config.doit.pool).index("adam")
    doit_hook = runner.method.hook
    runner.run(0, doit_hook, None)  # compiles the cycle program and the encoding functions
    runner.run(0, None, adam)
    for part in ("score", "pca", "surrogate", "acquisition"):
        setattr(timers, part, 0.0)
    start = time.perf_counter()
    runner.run(0, doit_hook, None)
    doit_s = time.perf_counter() - start
    start = time.perf_counter()
    runner.run(0, None, adam)
    single_s = time.perf_counter() - start
    steps = num_cycles * config.doit.tau
    parts = {p: getattr(timers, p) for p in ("score", "pca", "surrogate", "acquisition")}
    ratios = [
        Ratio(
            f"a DOIT run vs an Adam run, {num_cycles} cycles of {config.doit.tau} steps",
            "DOIT",
            doit_s,
            "Adam only",
            single_s,
            "s",
        )
    ]
    ratios += [
        Ratio(f"DOIT's {part} time in its run", part, seconds, "the DOIT run", doit_s, "s")
        for part, seconds in parts.items()
        if seconds > 0
    ]
    details = {
        "cycles": num_cycles,
        "steps": steps,
        "doit_seconds": doit_s,
        "single_seconds": single_s,
        "parts_seconds": parts,
        "policy_ms_per_cycle": 1e3 * sum(parts.values()) / num_cycles,
        "machine": machine(),
    }
    notes = [
        "a 2-D problem: the ratio is the policy's cost against almost no training work; "
        "policy_ms_per_cycle is the number that carries over"
    ]
    return Result(ratios, details, notes)
