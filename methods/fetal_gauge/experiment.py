"""Fetal-Gauge's experiment: the harness scored on generated phantoms, by stub models that must
hit known scores and by a small JAX VLM before and after training (the paper's fine-tuning,
box-size and phantom findings, mirrored).

One benchmark (`phantom_set.phantom_benchmark`, 300 patients, data seed 0): training reads
clinical-style images only; validation and test hold every scan in both styles (paired by
scan). Arms:
- "stub/<name>": oracle, random, always-a, parse-failure on the test split; the seed reshuffles
  every question's options (`records.shuffle_options`) and draws the random stub, so always-A's
  accuracy measures the shuffle.
- "vlm/untrained": the VLM at its initial parameters (train.steps = 0), seed = init seed.
- "vlm/trained": trained through `core.train` on the train split, its learning rate chosen on
  validation micro accuracy (mean over seeds; the grid must bracket it).

Claims, fixed before the first full run (intervals over 3 seeds; "dev" = |accuracy - chance|):
- oracle scores 100 % (low > 0.999) and parse-failure 0 % (high < 0.001) with 100 % invalid
  (low > 0.999);
- random and always-A sit at chance: micro dev high < 0.03 (about 2.5 standard errors of the
  micro accuracy at ~1,500 questions), and chance lies inside the bootstrap interval of at least
  half the tasks on every seed (`chance_covered`: its expectation is 0.95 for a model at chance,
  0 for an always-A without shuffling);
- the untrained VLM is at chance: micro dev high < 0.05;
- the trained VLM is far above chance: micro minus the untrained arm's, paired by seed, > 0.30;
  PI and large-box VG above 90 % (low > 0.90) on the test questions in training's style (the
  paper's fine-tuning is in-domain; a probe run, 1500 steps at lr 1e-3, had validation PI .85
  over both styles, so the unseen style is the next claim's business, not this one's);
- VG small boxes lowest: VG large - small > 0.05 and VG medium - small > 0 (within each seed);
- the unseen style scores lower: clinical - phantom micro accuracy > 0.03 (within each seed).
The quick run (tests, ~30 s; a fifth of the patients, so ~400 test questions: a micro accuracy's
standard error at chance is ~0.022 there) keeps the stub claims and the untrained-at-chance claim
with margins of 0.08 on the micro deviation, and a trained model above the untrained one by 0.10
(a few hundred steps learn PI, not everything); the other claims are the full run's.
"""

import dataclasses

import jax
import numpy as np

from configs import fetal_gauge as fg_config
from core import experiment_runner, results, train
from core.claims import IntervalClaim, Report
from core.experiment_runner import Arm, ClaimSpec, Experiment
from methods.fetal_gauge import benchmark_records, harness, make, records, scoring, stubs
from methods.fetal_gauge.model import VLMModel, model_config
from methods.fetal_gauge.report import plot

SEEDS = (0, 1, 2)
STUBS = ("oracle", "random", "always-a", "parse-failure")
LRS = (3e-4, 1e-3, 3e-3, 1e-2)


@dataclasses.dataclass(frozen=True)
class Size:
    num_patients: int  # of the whole benchmark (60/20/20 % train / validation / test)
    steps: int
    lrs: tuple


FULL = Size(num_patients=300, steps=1500, lrs=LRS)
QUICK = Size(num_patients=40, steps=80, lrs=(3e-3,))


def size_of(quick: bool) -> Size:
    return QUICK if quick else FULL


def config_of(arm: Arm, point: dict, seed: int, quick: bool):
    s = size_of(quick)
    if arm.name.startswith("stub/"):  # a plain dict: no training config
        name = arm.name.removeprefix("stub/")
        return {"stub": name, "seed": seed, "num_patients": s.num_patients}
    config = fg_config.get_config("size=cpu")
    config.seed = seed
    config.data.num_patients = s.num_patients
    config.data.seed = 0  # one benchmark for every arm and seed
    config.train.steps = 0 if arm.name == "vlm/untrained" else s.steps
    config.optim.lr = point.get("lr", config.optim.lr)
    config.train.eval_every = 0
    config.train.checkpoint_every = 0
    config.train.log_every = max(config.train.steps // 5, 1)
    return config


def benchmark(num_patients: int) -> dict[str, list[records.Record]]:
    """{split: records} of the experiment's benchmark (data seed 0)."""
    out = {split: [] for split in records.SPLITS}
    for r in benchmark_records(num_patients, 0):
        out[r.split].append(r)
    return out


def _flat(prefix: str, s: dict) -> dict:
    """Row metrics of one `scoring.score`: micro, macro, invalid rate, each task and VG's bins."""
    out = {
        f"{prefix}/micro": s["micro"]["accuracy"],
        f"{prefix}/macro": s["macro"]["accuracy"],
        f"{prefix}/invalid_rate": s["invalid_rate"],
    }
    out |= {f"{prefix}/{task}": t["accuracy"] for task, t in s["tasks"].items()}
    vg_bins = s["by"].get("bbox_bin", {}).get("VG", {})
    out |= {f"{prefix}/VG_{name}": b["accuracy"] for name, b in vg_bins.items()}
    if {"small", "medium", "large"} <= set(vg_bins):
        out[f"{prefix}/VG_large_minus_small"] = (
            out[f"{prefix}/VG_large"] - out[f"{prefix}/VG_small"]
        )
        out[f"{prefix}/VG_medium_minus_small"] = (
            out[f"{prefix}/VG_medium"] - out[f"{prefix}/VG_small"]
        )
    return out


def metrics_of(split: str, recs, predictions, *, seed: int) -> dict:
    """Flat row metrics "<split>/..." of one model's predictions on one split; "<split>/<style>/..."
    the same on one rendering style's questions."""
    s = scoring.score(recs, predictions, seed=seed)
    out = _flat(split, s) | {
        f"{split}/chance_micro": s["chance_micro"],
        f"{split}/micro_dev": abs(s["micro"]["accuracy"] - s["chance_micro"]),
    }
    covered = []
    for task, t in s["tasks"].items():
        out[f"{split}/{task}/chance"] = t["chance"]
        covered.append(t["low"] <= t["chance"] <= t["high"])
    out[f"{split}/chance_covered"] = float(np.mean(covered))
    for style in records.STYLES:
        rows = [i for i, r in enumerate(recs) if r.style == style]
        if rows:
            part = scoring.score([recs[i] for i in rows], [predictions[i] for i in rows], seed=seed)
            out |= _flat(f"{split}/{style}", part)
    if {f"{split}/clinical/micro", f"{split}/phantom/micro"} <= set(out):
        gap = out[f"{split}/clinical/micro"] - out[f"{split}/phantom/micro"]
        out[f"{split}/clinical_minus_phantom"] = gap
    return out


def run_stub(config: dict) -> dict:
    """A stub on the validation and test splits, every question's options reshuffled by the
    seed (validation too: every arm reports the runner's select_on metric)."""
    seed = config["seed"]
    split = benchmark(config["num_patients"])
    out = {}
    for name in ("validation", "test"):
        shuffled = [records.shuffle_options(r, seed) for r in split[name]]
        model = stubs.make_stub(config["stub"], shuffled, seed=seed)
        predictions = harness.evaluate(model, shuffled, progress=False)
        out |= metrics_of(name, shuffled, predictions.indices, seed=seed)
        out[f"{name}/seconds"] = predictions.seconds
    return out


def run_vlm(config, run_dir: str) -> dict:
    result = train.run(config, make(config), run_dir, devices=jax.devices()[:1])
    model = VLMModel(model_config(config), result.state.params)
    split = benchmark(config.data.num_patients)
    out = {"losses": [row["loss"] for row in result.history if "loss" in row]}
    for name in ("validation", "test"):
        predictions = harness.evaluate(model, split[name], progress=False)
        out |= metrics_of(name, split[name], predictions.indices, seed=config.seed)
        out[f"{name}/seconds"] = predictions.seconds
    return out


def run_one(config, run_dir: str) -> dict:
    return run_stub(config) if isinstance(config, dict) else run_vlm(config, run_dir)


def _claims() -> tuple[ClaimSpec, ...]:
    c = ClaimSpec
    dev, covered, trained = "test/micro_dev", "test/chance_covered", "vlm/trained"
    full = dict(in_quick=False)
    return (
        c("at_least", "the oracle stub scores 100 %", "test/micro", "stub/oracle", 0.999),
        c("at_most", "the parse-failure stub scores 0 %", "test/micro", "stub/parse-failure",
          1e-3),
        c("at_least", "... with 100 % invalid answers", "test/invalid_rate",
          "stub/parse-failure", 0.999),
        c("at_most", "the random stub sits at chance (micro)", dev, "stub/random", 0.03,
          quick_margin=0.08),
        c("at_least", "chance inside the random stub's per-task intervals", covered,
          "stub/random", 0.5),
        c("at_most", "always-A sits at chance: shuffling removes position bias (micro)", dev,
          "stub/always-a", 0.03, quick_margin=0.08),
        c("at_least", "chance inside always-A's per-task intervals", covered, "stub/always-a",
          0.5),
        c("at_most", "the VLM before training is at chance (micro)", dev, "vlm/untrained", 0.05,
          quick_margin=0.08),
        c("beats", "training lifts the VLM far above its untrained self (micro)", "test/micro",
          trained, 0.30, baseline="vlm/untrained", quick_margin=0.10),
        c("at_least", "the trained VLM exceeds 90 % on PI (training's style)",
          "test/clinical/PI", trained, 0.90, **full),
        c("at_least", "the trained VLM exceeds 90 % on large-box VG (training's style)",
          "test/clinical/VG_large", trained, 0.90, **full),
        c("at_least", "VG: large boxes beat small ones", "test/VG_large_minus_small", trained,
          0.05, **full),
        c("at_least", "VG: medium boxes beat small ones", "test/VG_medium_minus_small", trained,
          0.0, **full),
        c("at_least", "the style unseen in training scores lower",
          "test/clinical_minus_phantom", trained, 0.03, **full),
    )  # fmt: skip


def _arms(quick: bool) -> tuple[Arm, ...]:
    return (
        *(Arm(f"stub/{name}") for name in STUBS),
        Arm("vlm/untrained"),
        Arm("vlm/trained", grid={"lr": size_of(quick).lrs}),
    )


EXPERIMENT = Experiment(
    slug="fetal_gauge",
    arms=_arms(False),
    quick_arms=_arms(True),
    seeds=SEEDS,
    config_of=config_of,
    run=lambda config, run_dir: run_one(config, run_dir),
    select_on="validation/micro",
    claims=_claims(),
    # The run cache's code key: the method's sources but its readers (results.READERS), the
    # loader of a user's local files and the box-size diagnosis, which no run imports.
    sources=results.run_sources(
        "fetal_gauge", besides=(*results.READERS, "local_data.py", "box_size_check.py")
    ),
)


def measure(workdir: str, *, quick: bool = False) -> dict:
    return experiment_runner.measure(EXPERIMENT, workdir, quick=quick)


def claims_from_results(record: dict) -> list[IntervalClaim]:
    return experiment_runner.claims(EXPERIMENT, record)


def run(workdir: str, *, quick: bool = False) -> Report:
    record = measure(workdir, quick=quick)
    claims = claims_from_results(record)
    return Report.on_protocol(
        method="fetal_gauge",
        figures=[] if quick else plot(record, workdir),
        claims=claims,
        quick=quick,
        results=record,
    )
