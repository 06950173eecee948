"""Part `code`'s re-test (issue 47), the record "full_code_v2": PTP as the official code trains
it (LoRA on the frozen teacher, slots shifted by -1) against the Medusa-style drafter, both on
one pool of 16,384 teacher completions for 2,500 steps, decoded on 256 test prompts.

    python -m methods.flow_mtp.experiment_code_v2 --workdir=results/workdirs/flow_mtp_v2 --pilot
    python -m methods.flow_mtp.experiment_code_v2 --workdir=results/workdirs/flow_mtp_v2
    python -m methods.flow_mtp.experiment_code_v2 --workdir=results/workdirs/flow_mtp_v2 --arm=ptp

What changed from v1 (README, "Re-test (issue 47)"): the pool (2,048 -> 16,384 completions),
the steps (250 -> 2,500, both drafters), the student (full fine-tune -> LoRA rank 8 on every
linear of the frozen teacher, the context through the teacher's own pass), the slot position
shift (off -> on, the official default), the decode prompts (64 -> 256), the validation and
test completions (256 / 512 -> 512 / 1,024) and the selection (80 steps on seed 0 -> every
grid point at the full budget on every seed, the best mean validation correct prefix; a
choice on the grid's edge refuses the claims). The teacher, its data (T 0.7, top-k 50, top-p
0.95; contexts of 16 bytes) and the Medusa drafter are v1's. The Medusa baseline proposes by
the inverse CDF of each head at the same u's as PTP: u-coupled, closer to the paper's
"independent prediction" ablation than to published Medusa (argmax trees, typical acceptance);
its argmax is reported beside it, without a claim.

Claims, written before the first run (margins as v1's, which were fixed before v1's run):
1. accepted tokens per teacher call: PTP - Medusa (same u) > 0.25, paired by seed;
2. PTP's correct prefix per call on the test completions is at least 1 byte;
3. exploratory (not a paper claim here): PTP's test correct prefix above Medusa's at the same
   u's by > 0.25, paired by seed.
The pilot (--pilot: both arms at 3e-3, seeds 0-2, the grid's own runs) gives the paired spread
of the accepted-per-call difference and the power of claim 1 (`power`).
"""

import argparse
import dataclasses
import os

import numpy as np

from core import experiment_runner, results, stats
from core.claims import IntervalClaim, Report, power, verdict_lines
from core.errors import ConfigError
from core.experiment_runner import Arm, ClaimSpec, Experiment
from methods.flow_mtp import code_experiment, code_v2, lora_student

# Three seeds: the pilot's paired PTP - Medusa spread is sd 0.007 tokens per call (256 prompts,
# the same prompts and key for both drafters), so 3 seeds detect a true 0.27 with power 0.99.
SEEDS = (0, 1, 2)
LR_GRID = (1e-3, 3e-3, 1e-2, 3e-2)  # v1's grid without its 3e-4 (neither drafter chose it)
MARGIN = 0.25  # accepted per call, PTP - Medusa (v1's)
TARGET = 1.0  # PTP's correct prefix (v1's)
PILOT_LR = 3e-3

V2 = dataclasses.replace(
    code_experiment.FULL,
    pool=16_384,
    num_val=512,
    num_test=1024,
    decode_rows=256,
    steps=2500,
    select_steps=2500,  # every grid point at the full budget
    lr_grid=LR_GRID,
    margin=MARGIN,
    target=TARGET,
)
# A smoke check of the whole path (`--quick`; the slow test): part `code`'s quick teacher.
QUICK = dataclasses.replace(
    code_experiment.QUICK, pool=128, num_val=32, num_test=32, decode_rows=8, steps=6,
    select_steps=6, batch_size=8, lr_grid=(3e-3,),
)  # fmt: skip
LORA = lora_student.LoraSettings()  # rank 8, alpha 8, all linear layers, shift on


def config_of(arm: Arm, point: dict, seed: int, quick: bool):
    lr = point.get("lr", arm.settings.get("lr"))
    return code_v2.config_of(QUICK if quick else V2, LORA, arm.name, seed, lr)


CLAIMS = (
    ClaimSpec("beats", f"v2: PTP (LoRA, shift on) accepts more tokens per teacher call than the "
              f"u-coupled Medusa drafter (by > {MARGIN:g})", "test/accepted_per_call", "ptp",
              MARGIN, "medusa", quick_margin=0.0),
    ClaimSpec("at_least", f"v2: PTP's correct prefix per call on test completions is at least "
              f"{TARGET:g} byte", "test/correct", "ptp", TARGET, quick_margin=0.0),
    ClaimSpec("beats", "v2, exploratory: PTP's test correct prefix above Medusa's at the same u "
              f"(by > {MARGIN:g})", "test/correct", "ptp", MARGIN, "medusa",
              in_quick=False),
)  # fmt: skip

RUN_MODULES = (
    *code_v2.POOL_SOURCES,
    "model.py",
    "decode.py",
    "medusa.py",
    "lora_student.py",
    "code_v2.py",
    "code_experiment.py",  # its Settings and v1's sizes that V2 starts from
)

EXPERIMENT = Experiment(
    slug="flow_mtp",
    part="code_v2",
    arms=tuple(Arm(name, grid={"lr": LR_GRID}) for name in code_v2.DRAFTERS),
    seeds=SEEDS,
    config_of=config_of,
    run=code_v2.run,
    select_on="validation/correct",
    rule="max",
    claims=CLAIMS,
    quick_arms=tuple(Arm(name, grid={"lr": QUICK.lr_grid}) for name in code_v2.DRAFTERS),
    quick_seeds=(0, 1, 2),
    # Editing a claim, the grid or this driver retrains nothing: only the runs' modules key it.
    sources=tuple(results.source_files() + [f"methods/flow_mtp/{name}" for name in RUN_MODULES]),
)
PILOT = dataclasses.replace(
    EXPERIMENT,
    part="code_v2_pilot",
    arms=tuple(Arm(name, settings={"lr": PILOT_LR}) for name in code_v2.DRAFTERS),
    seeds=SEEDS,
    select_on=None,
    claims=(),
    quick_arms=None,
)


def claims_from_results(record: dict) -> list[IntervalClaim]:
    return experiment_runner.claims(EXPERIMENT, record)


def run(workdir: str, *, quick: bool = False) -> Report:
    """The full re-test of part `code` as a part of `experiment.run` (its own workdir)."""
    if quick:
        raise ConfigError("flow_mtp code_v2: a part of the full run only (--quick: main())")
    record = experiment_runner.measure(EXPERIMENT, os.path.join(workdir, "code_v2"))
    return Report.on_protocol(
        method="flow_mtp",
        claims=claims_from_results(record),
        results=record,
        command="python -m methods.flow_mtp.experiment_code_v2 --workdir=DIR",
    )


def pilot_spread(record: dict) -> dict:
    """Mean and sd over seeds of the paired PTP - Medusa accepted-per-call difference."""
    by_arm = {a: results.by_seed(record["rows"], "test/accepted_per_call", arm=a)
              for a in code_v2.DRAFTERS}  # fmt: skip
    diffs = stats.paired_differences(by_arm["ptp"], by_arm["medusa"], what="ptp - medusa")
    values = list(diffs.values())
    return {"mean": float(np.mean(values)), "sd": float(np.std(values, ddof=1))}


def generation_seconds(workdir: str, count: int = 2048) -> float:
    """The teacher's time to generate `count` training completions (the pool's cost per
    completion), measured without touching the pools on disk."""
    import time

    from methods.flow_mtp import code_drafters

    teacher, _ = code_v2.teacher_of(V2, workdir)
    code_drafters.teacher_pool(teacher, V2, "train", 256, 99)  # compile
    start = time.perf_counter()
    code_drafters.teacher_pool(teacher, V2, "train", count, 99)
    return time.perf_counter() - start


def main() -> None:
    """The pilot (spread, power), the grid (saved as results/full_code_v2.json, claims
    printed), one arm's runs (--arm: cached only, for splitting the grid), or --quick."""
    from core import compile_cache

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--pilot", action="store_true")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--arm", choices=code_v2.DRAFTERS)
    parser.add_argument("--time_pool", action="store_true")
    args = parser.parse_args()
    compile_cache.enable()
    if args.time_pool:
        seconds = generation_seconds(args.workdir)
        print(f"2048 completions: {seconds:.1f} s; {V2.pool}: ~{seconds * V2.pool / 2048:.0f} s")
        return
    if args.pilot:
        spread = experiment_runner.measure(PILOT, args.workdir)
        s = pilot_spread(spread)
        chances = ", ".join(
            f"n={n}: {power('beats', s['mean'], s['sd'], n, MARGIN):.2f}" for n in (3, 5, 8)
        )
        print(f"accepted per call, PTP - Medusa: {s['mean']:.3f}, paired sd {s['sd']:.3f}; "
              f"power of claim 1 at the pilot's effect ({chances})")  # fmt: skip
        return
    if args.arm:
        one = dataclasses.replace(
            EXPERIMENT, arms=tuple(a for a in EXPERIMENT.arms if a.name == args.arm)
        )
        experiment_runner.measure(one, args.workdir, quick=args.quick)
        return
    record = experiment_runner.measure(EXPERIMENT, args.workdir, quick=args.quick)
    record["teacher"] = code_v2.teacher_of(QUICK if args.quick else V2, args.workdir)[1]
    if not args.quick:
        print("saved", results.save(record))
    print("\n".join(verdict_lines(claims_from_results(record))))


if __name__ == "__main__":
    main()
