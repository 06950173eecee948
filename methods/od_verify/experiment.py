"""ODPV's claims at CPU scale: a tiny detector on synthetic scenes, verified on 30 test images.

One arm ("odpv"), 3 seeds; a seed trains the detectors (64x64 and 32x32) and draws every sample
set, the scenes are fixed by `data.seed`. Every verifier runs inside the seed's unit (ODPV with
T = 0 and T = 1, RCP_N on the first 10 images, the scalar scenario bound, PGD), so each number
below is a per-seed summary and the intervals are over the 3 seeds. The CI configuration
(alpha = beta = 0.05: N1 = 2000, N2 = 270, M = 10 pairs, M2 = 500), the paper's thresholds
(iota 0.25, eta 0.45), eps in {1, 2, 4}/255, tau in {0.5, 0.7}.

No hyperparameter is chosen on the test objects: the verifier's settings are the paper's (or the
CI configuration of the reproduction plan), the detector's were set on validation mAP50
(configs/od_verify.py), PGD's steps and restarts are fixed before any run. The claims,
written before the first full run:
1. coverage: on 1e5 fresh samples per checked Z, the fraction outside Z is below alpha = 0.05
   (the largest over the checked Z of a seed);
2. soundness: no certified ODPV bound lies above PGD's IoU (count per seed < 0.5); and the
   guarantee itself on fresh random perturbations (the scalar baseline's samples): the share
   whose post-NMS IoU falls below the certified bound is under (1 + T) alpha = 0.1;
3. the sample count does not depend on the input size: ODPV's at 64x64 over 32x32 < 1.01,
   while RCP_N's grows (> 2: its count is linear in the output size, 4x larger at 64x64);
4. one refinement step raises the bound on some objects (> 1 % of object-eps cases);
5. wall time: RCP_N takes > 2x ODPV's time for the same statuses (the paper: 5-10x);
6. the detector is good enough to verify: test mAP50 > 0.9;
7. the paper's tightness claim: ODPV's bound above RCP_N's on the same objects (mean, > 0).
The scalar scenario bound is reported beside both, not claimed either way.
"""

from ml_collections import ConfigDict

from configs import od_verify as od_config
from core import experiment_runner
from core.claims import IntervalClaim, Report
from core.experiment_runner import Arm, ClaimSpec, Experiment
from methods.od_verify import runs
from methods.od_verify.report import plot

SEEDS = (0, 1, 2)
PAPER = dict(alpha=0.0099, beta=0.0099, n1=30_000, n2=5_000, m2=2_000, pairs=10)
EXP = {
    "full": dict(
        images=30,
        eps=(1, 2, 4),
        taus=(0.5, 0.7),
        rcp_images=10,
        coverage_images=1,
        coverage_samples=100_000,
        count_images=2,
        pgd_steps=40,
        pgd_restarts=2,
        paper_objects=5,
        paper_eps=2 / 255,
        config32="size=small,image=32",
    ),
    # quick: the pipeline end to end in seconds (no RCP_N, no 32x32 detector, no paper setting)
    "quick": dict(
        images=2,
        eps=(2,),
        taus=(0.5,),
        rcp_images=0,
        coverage_images=1,
        coverage_samples=5_000,
        count_images=0,
        pgd_steps=10,
        pgd_restarts=1,
        paper_objects=0,
        paper_eps=2 / 255,
        config32="",
    ),
}


def config_of(arm: Arm, point: dict, seed: int, quick: bool):
    del arm, point
    c = od_config.get_config("size=quick" if quick else "size=small")
    c.seed = seed
    c.exp = ConfigDict(EXP["quick" if quick else "full"] | {"paper": PAPER})
    return c


def _claims() -> tuple[ClaimSpec, ...]:
    return (
        ClaimSpec(
            "at_most",
            "coverage: outputs outside Z below alpha (largest checked Z)",
            "coverage/outside_max",
            "odpv",
            0.05,
        ),
        ClaimSpec(
            "at_most",
            "PAC soundness: fresh perturbations fall below the certified "
            "bound at a rate under (1 + T) alpha = 0.1",
            "soundness/sampled_below",
            "odpv",
            0.1,
        ),
        ClaimSpec(
            "at_most",
            "soundness: no certified bound above PGD's IoU (count)",
            "soundness/violations",
            "odpv",
            0.5,
            in_quick=False,
        ),
        ClaimSpec(
            "at_most",
            "ODPV's sample count does not grow from 32x32 to 64x64",
            "samples/odpv_ratio",
            "odpv",
            1.01,
            in_quick=False,
        ),
        ClaimSpec(
            "at_least",
            "RCP_N's sample count grows from 32x32 to 64x64 (x2)",
            "samples/rcp_ratio",
            "odpv",
            2.0,
            in_quick=False,
        ),
        ClaimSpec(
            "at_least",
            "one refinement raises the bound on some objects (> 1 %)",
            "refine/raised",
            "odpv",
            0.01,
            in_quick=False,
        ),
        ClaimSpec(
            "at_least", "wall time: RCP_N over ODPV (x2)", "time/ratio", "odpv", 2.0, in_quick=False
        ),
        ClaimSpec(
            "at_least",
            "the detector: test mAP50 above 0.9",
            "detector/map50_test",
            "odpv",
            0.9,
            in_quick=False,
        ),
        ClaimSpec(
            "at_least",
            "ODPV's bound above RCP_N's (the paper's tightness claim)",
            "gap/odpv_minus_rcp",
            "odpv",
            0.0,
            in_quick=False,
        ),
    )


EXPERIMENT = Experiment(
    slug="od_verify",
    arms=(Arm("odpv"),),
    seeds=SEEDS,
    config_of=config_of,
    run=runs.run,
    claims=_claims(),
)


def measure(workdir: str, *, quick: bool = False) -> dict:
    return experiment_runner.measure(EXPERIMENT, workdir, quick=quick)


def claims_from_results(record: dict) -> list[IntervalClaim]:
    return experiment_runner.claims(EXPERIMENT, record)


def run(workdir: str, *, quick: bool = False) -> Report:
    return experiment_runner.report(EXPERIMENT, workdir, quick=quick, plot=plot)
