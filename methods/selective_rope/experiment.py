"""Selective RoPE's state-tracking claim at CPU scale: prefix parity (S2) with per-position labels.

1-layer GLA and 1-layer softmax transformer, each with Selective RoPE, RoPE or no position
encoding ("arms", named "model/position") at matched parameter counts, trained from scratch at
length 64 through `core.train.run` and tested at 64, 128, 256 and 512 (the method's named
evaluation streams "len{T}", read from the run's final evaluation).

The protocol is `core.experiment_runner`'s: every arm of a model trains on the same
learning-rate grid with every seed; each arm's lr is chosen by its mean over seeds of the
last-quarter accuracy at the training length on a VALIDATION stream (example seeds disjoint from
the test stream's), and a full record whose choice sits on its grid's edge is refused, except
for an arm that learned nothing at any lr (`at_chance`: every grid point's validation mean under
CHANCE_CEILING, a flat grid with no optimum to bracket; such edges are listed in the record).
The chosen lr's runs are reported on the TEST stream. Before issue 26 the lr was picked on seed 0
by the same held-out stream that was reported.

Claims (CLAIMS: margins fixed before the run that `results/full.json` records), each a
`core.claims.IntervalClaim` on a bootstrap interval over the training seeds, differences paired
by seed (the same training and test examples): the paper's "GLA + Selective RoPE solves parity
and extrapolates, RoPE / NoPE fail even at the training length; a 1-layer transformer with
Selective RoPE learns parity". The headline metric is the per-position accuracy on the last
quarter of positions ("last_quarter": chance 0.5, no credit for short prefixes only).

The 8x claims are ours, not the paper's (it trains at 128 and tests at 512, 4x): they are
labelled exploratory and counted apart. The re-test of issue 47 (the authors' state-tracking
recipe at their k = 128, tested at 4x, checkpoint and lr chosen on a validation stream at 4x) is
its own record, "full_v2": `experiment_v2.py` (`claims_from_results` dispatches to it).

`measure` trains every (arm, lr, seed) run through the runner's cache (keyed by the run's config
and `results.run_sources`: not this file nor report.py, so a widened grid trains only its new
points) and returns a `core.results` record with one row per run; `claims_from_results`
re-derives the selection and the claims from that record alone (`python -m launch.reproduce
--methods=selective_rope --from_results`). The committed record predates the runner (rows keyed
by model and position, no config.arms): `adopt` reads it unchanged. Tables and the figure of a
record are in report.py.
"""

import dataclasses
import math
import os

from configs import selective_rope as sr_config
from core import experiment_runner as runner
from core.claims import IntervalClaim, Report
from core.experiment_runner import Arm, ClaimSpec, Experiment
from methods.selective_rope import experiment_v2, model, model_config, report, train_and_evaluate

POSITIONS = ("selective", "rope", "none")
METRICS = ("last_quarter", "last_half", "final", "accuracy", "exact_match")
HEADLINE = report.HEADLINE
# The highest validation mean at which an arm counts as "learned nothing at any lr": chance is
# 0.5, and 512 sequences x 16 last-quarter positions give a chance-level model a standard error
# of ~0.006 (the old runs' RoPE / none seeds sat within 0.5 +- 0.013).
CHANCE_CEILING = 0.55


@dataclasses.dataclass(frozen=True)
class Setting:
    models: tuple[str, ...]
    positions: tuple[str, ...]
    seeds: tuple[int, ...]
    lrs: dict  # model -> the lr grid every position of that model trains on, with every seed
    steps: dict  # model -> training steps
    train_length: int
    test_lengths: tuple[int, ...]
    eval_examples: int  # per length and split
    require_interior: bool  # refuse a choice on the grid's edge (full run)
    weight_decay: float = 0.1  # AdamW


FULL = Setting(
    models=("gla", "transformer"),
    positions=POSITIONS,
    seeds=(0, 1, 2),
    # Three points around the previous run's choices (GLA + selective: 3e-3 over 1e-3, 0.909 vs
    # 0.897; transformer + selective: 1e-3 over 3e-3, 0.969 vs 0.853, both on seed 0), so that
    # 3 seeds x 3 lrs x 6 arms stay at 54 runs.
    # The first full run (2026-12-02) chose 3e-3 for transformer + selective, the edge of
    # {3e-4, 1e-3, 3e-3} (validation means .76 / .73 / .90), so 1e-2 was added for every
    # transformer arm.
    lrs={"gla": (1e-3, 3e-3, 1e-2), "transformer": (3e-4, 1e-3, 3e-3, 1e-2)},
    steps={"gla": 1200, "transformer": 700},
    train_length=64,
    test_lengths=(128, 256, 512),
    eval_examples=512,
    require_interior=True,
)
QUICK = Setting(
    models=("gla",),
    positions=("selective", "rope"),
    seeds=(0, 1, 2),
    lrs={"gla": (3e-3,)},  # one point: the quick run checks the pipeline, not the grid
    # 250 steps at length 32, seeds 0 / 1 / 2: selective beats RoPE by +0.357 / +0.386 / +0.284
    # at 1x and +0.168 / +0.197 / +0.119 at 2x (2026-12-02; +0.39 / +0.37 / +0.28 and +0.24 /
    # +0.25 / +0.15 when measured before issue 26, on older code). Batch 32 instead of 64 (half
    # a step's compute) failed seed 2: +0.22 and +0.07.
    steps={"gla": 250},
    train_length=32,
    test_lengths=(64,),
    eval_examples=256,
    require_interior=False,
    # Without weight decay at this length selective beats RoPE by +0.49 / +0.35 at 1x / 2x after
    # 500 steps; with 0.1 by +0.43 / +0.19 (it helps longer runs, see FULL).
    weight_decay=0.0,
)


@dataclasses.dataclass(frozen=True)
class Claim:
    """One claim as the paper states it; `experiment` makes it a runner ClaimSpec per setting."""

    form: str  # IntervalClaim's constructor: beats, at_least, at_most
    text: str
    model: str
    position: str
    baseline: str | None  # beats: the position subtracted, paired by seed
    multiple: int  # test length / training length
    margin: float
    quick_margin: float | None = None  # None: not in the quick run


# Fixed before the run recorded in results/full.json (the old mean-only targets, now on the
# interval's end; at 3 seeds a bootstrap interval's low end is about the lowest seed).
CLAIMS = (
    Claim(
        "beats",
        "GLA: Selective RoPE beats RoPE at the training length",
        "gla",
        "selective",
        "rope",
        1,
        0.25,
        quick_margin=0.25,
    ),
    # Quick: 0.10, not 0.15. The quick claims were set on seed 0 alone (+0.24 at 2x); over three
    # seeds the interval's low end is about seed 2's +0.15, which 0.15 would leave to rounding.
    Claim(
        "beats",
        "GLA: Selective RoPE beats RoPE at 2x the training length",
        "gla",
        "selective",
        "rope",
        2,
        0.15,
        quick_margin=0.10,
    ),
    Claim(
        "at_least",
        "GLA + Selective RoPE solves parity at the training length",
        "gla",
        "selective",
        None,
        1,
        0.9,
    ),
    Claim(
        "at_most",
        "GLA + RoPE stays near chance at the training length",
        "gla",
        "rope",
        None,
        1,
        0.6,
    ),
    Claim(
        "at_most",
        "GLA + no position encoding stays near chance at the training length",
        "gla",
        "none",
        None,
        1,
        0.6,
    ),
    Claim(
        "at_least",
        "GLA + Selective RoPE extrapolates to 4x the training length",
        "gla",
        "selective",
        None,
        4,
        0.9,
    ),
    # The two 8x claims are ours (the paper tests at 4x): exploratory, counted apart (issue 47).
    Claim(
        "at_least",
        "exploratory (ours, not the paper's): GLA + Selective RoPE extrapolates to 8x the "
        "training length",
        "gla",
        "selective",
        None,
        8,
        0.9,
    ),
    Claim(
        "beats",
        "exploratory (ours, not the paper's): GLA: Selective RoPE beats RoPE at 8x the training "
        "length",
        "gla",
        "selective",
        "rope",
        8,
        0.1,
    ),
    Claim(
        "at_least",
        "a 1-layer softmax transformer with Selective RoPE learns parity",
        "transformer",
        "selective",
        None,
        1,
        0.8,
    ),
    Claim(
        "at_most",
        "transformer + RoPE stays near chance at the training length",
        "transformer",
        "rope",
        None,
        1,
        0.6,
    ),
    Claim(
        "at_most",
        "transformer + no position encoding stays near chance at the training length",
        "transformer",
        "none",
        None,
        1,
        0.6,
    ),
)


def parity_config(kind: str, position: str, *, lr: float, seed: int, s: Setting):
    c = sr_config.get_config(f"model={kind},position={position},task=parity")
    c.seed = seed
    c.task.length = s.train_length
    # d_model 64, 4 heads (head dim 16, 8 rotation pairs), SwiGLU 128 (+9 for RoPE/none).
    c.model.d_model, c.model.num_heads, c.model.d_ff = 64, 4, 128
    # temp_max = pi (the authors use 1): the angle increments start at exp(0) * pi per step and
    # phi's learned part is scaled by pi, so a pi-flip per 1-bit is reached within our ~10^3
    # steps (with temp_max = 1, GLA + Selective RoPE stayed at chance for 800 steps).
    c.model.temp_max = math.pi
    c.train.steps, c.train.batch_size = s.steps[kind], 64
    c.train.log_every = max(s.steps[kind] // 4, 1)
    c.train.checkpoint_every, c.train.eval_every = 0, 0  # evaluated once, at the end
    # AdamW with weight decay 0.1, clipping and warm-up: the authors' copying / LM recipe, not
    # their state-tracking one (README, "Departures"). Without weight decay GLA + Selective RoPE
    # reached 0.88 at length 64 and 0.78 at 128 in a 1700-step development run (seed 0), with
    # it 0.97 and 0.93.
    c.optim.name, c.optim.weight_decay = "adamw", s.weight_decay
    c.optim.lr, c.optim.warmup_steps, c.optim.schedule = lr, 50, "cosine"
    c.optim.grad_clip = 1.0
    c.eval.num_examples = s.eval_examples
    c.eval.lengths = s.test_lengths
    return c


def setting(quick: bool) -> Setting:
    return QUICK if quick else FULL


def row(config, out: dict) -> dict:
    """One run's flat results row (the runner adds arm, lr and seed); a diverged run scores
    chance (0.5) on every accuracy (exact match included: it is never read by a claim)."""
    cfg = model_config(config)
    r = {"model": config.model.kind, "position": config.model.position}
    r |= {"params": model.count_params(cfg), "d_ff": cfg.d_ff, "steps": config.train.steps}
    r |= {"diverged": out["diverged"], "seconds": out["seconds"]}
    lengths = sorted({config.task.length, *config.eval.lengths})
    for split, split_lengths in (("validation", [config.task.length]), ("test", lengths)):
        for T in split_lengths:
            for m in METRICS:
                r[f"{split}/len{T}/{m}"] = 0.5 if out["diverged"] else out[split][f"len{T}/{m}"]
    if "flip_error" in out:
        r["flip_error"] = out["flip_error"]
    return r


def run_parity(config, workdir: str) -> dict:
    """The runner's `run`: train and evaluate (`train_and_evaluate`, late-bound so that a test
    can replace it), as one flat row."""
    return row(config, train_and_evaluate(config, workdir))


def config_of(arm: Arm, point: dict, seed: int, quick: bool):
    s = setting(quick)
    kind, position = arm.settings["model"], arm.settings["position"]
    return parity_config(kind, position, lr=point["lr"], seed=seed, s=s)


def experiment(s: Setting, *, quick: bool) -> Experiment:
    """The runner's experiment of setting `s`: its arms, lr grids, seeds and the claims on its
    arms (quick: those with a quick margin), each metric at the setting's lengths."""
    arms = tuple(
        Arm(
            f"{kind}/{pos}",
            grid={"lr": tuple(s.lrs[kind])},
            settings=dict(model=kind, position=pos),
        )
        for kind in s.models
        for pos in s.positions
    )
    specs = []
    for c in CLAIMS:
        margin = c.quick_margin if quick else c.margin
        positions = {c.position, c.baseline} - {None}
        if margin is None or c.model not in s.models or not positions <= set(s.positions):
            continue  # quick: no quick margin; or an arm the setting does not train
        T = s.train_length * c.multiple
        if c.baseline is None:
            label = f"{c.model}/{c.position}/len{T}/{HEADLINE}"
        else:
            label = f"{c.model}: {c.position} - {c.baseline}, len{T}/{HEADLINE}"
        baseline = f"{c.model}/{c.baseline}" if c.baseline else None
        arm = f"{c.model}/{c.position}"
        metric = f"test/len{T}/{HEADLINE}"
        specs.append(ClaimSpec(c.form, c.text, metric, arm, margin, baseline, label=label))
    return Experiment(
        slug="selective_rope",
        arms=arms,
        seeds=s.seeds,
        config_of=config_of,
        run=lambda config, workdir: run_parity(config, workdir),
        claims=tuple(specs),
        select_on=f"validation/len{s.train_length}/{HEADLINE}",
        at_chance=CHANCE_CEILING,
    )


EXPERIMENTS = {quick: experiment(setting(quick), quick=quick) for quick in (False, True)}
# The re-test (issue 47, `experiment_v2.py`): its own record, written by core.experiment_runner.
V2 = experiment_v2.EXPERIMENT.run_name(quick=False)  # "full_v2"
RESULT_RUNS = ("full", V2)  # each with its record in results/ (a test checks the pairing)


def adopt(record: dict, exp: Experiment | None = None) -> dict:
    """`record` as the runner writes it: a record written before the runner (rows keyed by
    model and position) gets each row's arm and `runner.adopt_older`'s config; the record
    itself is not changed. `exp`: the experiment it belongs to (default: full or quick, by
    the record's config)."""
    exp = exp or EXPERIMENTS[bool(record["config"]["quick"])]
    if "arms" in record["config"]:
        return record
    rows = [{**r, "arm": f"{r['model']}/{r['position']}"} for r in record["rows"]]
    return runner.adopt_older(exp, {**record, "rows": rows})


def measure(workdir: str, *, quick: bool = False) -> dict:
    """Every run (cached) as a results record (its "edges": every choice on a grid edge)."""
    return runner.measure(EXPERIMENTS[quick], workdir, quick=quick)


def claims_from_results(record: dict) -> list[IntervalClaim]:
    """The claims, re-derived (lr selection included) from a results record alone (the first
    run's or the re-test's, by the record's run); a full record with an unfinished grid is
    refused (`runner.require_finished`)."""
    if record.get("run") == V2:
        return experiment_v2.claims_from_results(record)
    return runner.claims(EXPERIMENTS[bool(record["config"]["quick"])], adopt(record))


def plot(record: dict, workdir: str) -> list[str]:
    """The figure of the first study's record (parity.png) or of the re-test's."""
    if record["run"] == V2:
        return experiment_v2.plot(record, workdir)
    path = os.path.join(workdir, "parity.png")
    report.plot(adopt(record), path)
    return [path]


def run(workdir: str, *, quick: bool = False) -> Report:
    """The quick record, or the full run's two records (the first study, then the re-test),
    each with its claims, table and figure, in one report."""
    records = [measure(workdir, quick=quick)]
    if not quick:
        records.append(runner.measure(experiment_v2.EXPERIMENT, workdir))
    return Report.from_records(
        records,
        claims_from_results=claims_from_results,  # refuses an unfinished grid
        table=lambda record: report.table(adopt(record)),
        plot=plot,
        workdir=workdir,
        quick=quick,
    )


if __name__ == "__main__":  # the README's tables from the committed results
    from core import results

    print(report.table(adopt(results.load("selective_rope", "full"))))
