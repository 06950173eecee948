"""Does silencing the most word-selective units of a small VLM impair reading selectively? The
four-task VLM (`configs/vwf_dyslexia.py`, size "cpu"), 3 model seeds; localiser, lesions and
controls as in `localiser.py` and `lesion.py`.

Per model seed: train; localise (72 images per category, the paper's count, 3 resamples: the
selection is resample 0's, the others give the overlap); evaluate one fixed held-out set (256
examples per task, the same for every seed, so drops pair by seed) intact, then with the top k %
of units by t zeroed for k in {0.5, 1, 2, 4, 8, 16} (global ranking; per-layer ranking
reported), with 10 random layer-matched masks per k, and with the selected units scaled by s
(the sweep, at CLAIM_PERCENT). Reported, not asserted: lexical decision in the held-out fonts,
intact and lesioned (exploratory), and every task with a whole decoder layer's MLP silenced
("layer/<l>") and with all of them ("all"): how much any lesion of these units can do at most.

A mask's drop on a task is intact accuracy - lesioned accuracy; its selectivity is the lexical
drop minus the mean drop of the non-reading tasks (shape comparison, sentence-picture matching).
The letter read-out is a reading task: reported, in neither side of the contrast.

Claims (fixed before the first full run; intervals over the 3 seeds):
- selectivity of the VWF lesion at k = 4 % is above 0.10;
- it exceeds the mean selectivity of the random masks at that k by more than 0.05;
- VWF lesions bring lexical decision below 65 % within the grid (smallest such k, 32 = never,
  at most 16.5: some k <= 16 % on every seed);
- random masks of that size (each seed's smallest k; 16 % if none) keep lexical decision above
  65 % (their mean);
- only s = 0 is selective: selectivity at s = 0 exceeds the largest at any other s by > 0.05.
Quick (about a minute on an idle machine): 3 seeds of a 300-step model, k = 8 % only, 5 random
masks. At 300 steps no task is learned (the yes/no tasks sit at one answer's share), so its
claims are smoke checks of the pipeline (report.quick_checks): training taught the answer format
(yes/no accuracy > 0.25; untrained ~0), the localiser finds a contrast (max t > 6; shuffled
categories ~3), silencing every decoder MLP unit changes the answers (a no-op lesion: 0).
Every seed's training and analysis is one cached run (`core.cache`). The claims, the figure and
the summary are derived from the record alone, in report.py.

The re-test (issue 47: the localiser's categories never occurred in training, and reading was
half of it) is its own record, "full_v2", with its own diet, grid and claims:
`experiment_v2.py` (python -m methods.vwf_dyslexia.experiment_v2 --workdir=/tmp/vwf_v2).
"""

import dataclasses
import os
import time

import jax
import numpy as np

from configs import vwf_dyslexia as vwf_config
from core import cache, experiment_runner, results, train
from core.claims import Report
from methods.vwf_dyslexia import (
    experiment_v2,
    lesion,
    localiser,
    make,
    model_config,
    report_v2,
    stimuli,
)
from methods.vwf_dyslexia.report import claims_of_study, name, plot, summary
from methods.vwf_dyslexia.retest import whole_layers

EVAL_SEED = 7  # the held-out evaluation set: the same examples for every model seed
# The re-test (issue 47, `experiment_v2.py`): its own record, written by core.experiment_runner.
V2 = experiment_v2.EXPERIMENT.run_name(quick=False)  # "full_v2"
RESULT_RUNS = ("full", V2)  # each with its record in results/ (a test checks the pairing)


def claims_from_results(record: dict):
    """The claims of any of this method's records: the re-test's, or the first study's (and
    its quick run's smoke checks)."""
    if record["run"] in (V2, experiment_v2.EXPERIMENT.run_name(quick=True)):
        return experiment_v2.claims_from_results(record)
    return claims_of_study(record)


@dataclasses.dataclass(frozen=True)
class Settings:
    size: str  # configs/vwf_dyslexia.py size
    steps: int
    seeds: tuple
    percents: tuple  # the k grid, % of all decoder MLP units
    random_masks: int  # per k
    claim_percent: float
    scales: tuple  # the sweep's s values (s = 1 is the intact model)
    n_per_task: int
    n_localiser: int  # images per category per resample
    resamples: int
    selectivity_margin: float
    random_margin: float
    scale_margin: float
    threshold: float = 0.65
    batch_size: int = 0  # 0: the config's


FULL = Settings(
    "cpu", 10000, (0, 1, 2), (0.5, 1, 2, 4, 8, 16), 10, 4.0, (-2, -1, 0, 0.5, 2, 4),
    256, 72, 3, 0.10, 0.05, 0.05,
)  # fmt: skip
QUICK = Settings("cpu", 300, (0, 1, 2), (8,), 5, 8.0, (), 64, 24, 1, 0.0, 0.02, 0.0, 0.65, 64)
# The pipeline end to end in seconds (tests): an untrained smoke model, every kind of mask.
SMOKE = Settings("smoke", 2, (0, 1, 2), (1, 8), 2, 8.0, (0, 2), 4, 4, 2, 0.1, 0.05, 0.05, 0.65, 8)


def run_config(s: Settings, seed: int):
    config = vwf_config.get_config(f"size={s.size}")
    config.seed = seed
    config.train.steps = s.steps
    if s.batch_size:
        config.train.batch_size = s.batch_size
    config.eval.num_examples = 2 * config.train.batch_size
    config.train.eval_every = 0  # the analysis evaluates; only the end of training
    config.train.log_every = max(s.steps // 5, 1)
    config.train.checkpoint_every = s.steps
    config.optim.warmup_steps = min(100, s.steps // 10)
    return config


def analysis_settings(s: Settings) -> dict:
    """What the analysis of a trained model depends on (part of each seed's cache key)."""
    return {k: getattr(s, k) for k in ("percents", "random_masks", "claim_percent", "scales")} | {
        k: getattr(s, k) for k in ("n_per_task", "n_localiser", "resamples")
    }


def accuracies(cfg, params, examples, selections: dict, value: float = 0.0) -> dict:
    """{name: {task: accuracy}} for named bool [L, F] selections set to `value` (one vmapped
    evaluation of all of them)."""
    names = list(selections)
    masks = lesion.unit_masks(np.stack([selections[n] for n in names]), value)
    acc = lesion.accuracy(cfg, params, examples, masks, batch_size=128, chunk=8)
    return {n: {t: float(acc[t][i]) for t in acc} for i, n in enumerate(names)}


def analyse(cfg, params, s: Settings, seed: int, data) -> dict:
    """Rows of per-task accuracy for every mask of one trained model, and the localiser's
    overlaps and layer histograms. data: the model's config.data (lexical decision asks about
    the words it was taught; stimuli at its jitter, letters spelled if it spells)."""
    stimulus = dict(lexicon_size=data.lexicon_size, jitter=data.jitter, spell=data.spell)
    start = time.perf_counter()
    t_maps = [
        localiser.t_map(cfg, params, s.n_localiser, seed=100 * seed + r, jitter=data.jitter)
        for r in range(s.resamples)
    ]
    localise_seconds = time.perf_counter() - start
    examples = lesion.eval_set(s.n_per_task, EVAL_SEED, **stimulus)
    none = np.zeros_like(t_maps[0], bool)
    selections, localiser_rows = {"intact": none}, []
    rng = np.random.default_rng([seed, 1])
    for k in s.percents:
        vwf = localiser.top_k_global(t_maps[0], k)
        selections[name("vwf", k)] = vwf
        selections[name("vwf_per_layer", k)] = localiser.top_k_per_layer(t_maps[0], k)
        for d in range(s.random_masks):
            selections[name("random", k, d)] = localiser.random_matched(vwf, rng)
        resampled = [localiser.top_k_global(t, k) for t in t_maps]
        localiser_rows.append(
            {
                "percent": k,
                "units": int(vwf.sum()),
                "per_layer": vwf.sum(axis=1).tolist(),
                "resample_overlap": (
                    localiser.mean_pairwise_overlap(resampled) if s.resamples > 1 else None
                ),
                "global_vs_per_layer_overlap": localiser.overlap(
                    vwf, selections[name("vwf_per_layer", k)]
                )
                if vwf.sum() == selections[name("vwf_per_layer", k)].sum()
                else None,
            }
        )
    selections |= whole_layers(*none.shape)
    start = time.perf_counter()
    acc = accuracies(cfg, params, examples, selections)
    claim_units = localiser.top_k_global(t_maps[0], s.claim_percent)
    for value in s.scales:
        acc[name("scale", value)] = accuracies(cfg, params, examples, {"x": claim_units}, value)[
            "x"
        ]
    fonts = {}
    for font in stimuli.HELD_OUT_FONTS:  # exploratory: reading in fonts never trained on
        lexical_set = lesion.eval_set(
            s.n_per_task,
            EVAL_SEED,
            fonts=(font,),
            task_names=("lexical",),
            **stimulus,
        )
        out = accuracies(cfg, params, lexical_set, {"intact": none, "vwf": claim_units})
        fonts[font] = {name: v["lexical"] for name, v in out.items()}
    rows = [{"seed": seed, "mask": name, **a} for name, a in acc.items()]
    return {
        "rows": rows,
        "localiser": localiser_rows,
        "fonts": fonts,
        "t_max": float(np.max(t_maps[0])),
        "seconds": {"localise": localise_seconds, "lesions": time.perf_counter() - start},
    }


def train_and_analyse(config, workdir: str, s: Settings) -> dict:
    start = time.perf_counter()
    # One device: the tests' 8 fake CPU devices would split each small batch 8 ways.
    result = train.run(config, make(config), workdir, devices=jax.devices()[:1])
    train_seconds = time.perf_counter() - start
    final = {k.removeprefix("eval/"): v for k, v in result.history[-1].items() if "eval/" in k}
    out = analyse(model_config(config), result.state.params, s, config.seed, config.data)
    out["seconds"]["train"] = train_seconds
    out["train_eval"] = final
    return out


def measure(workdir: str, *, quick: bool = False, settings: Settings | None = None) -> dict:
    s = settings or (QUICK if quick else FULL)
    code = results.code_version("vwf_dyslexia")
    rows, per_seed = [], {}
    for seed in s.seeds:
        config = run_config(s, seed)
        key = {"train": config.to_dict(), "analysis": analysis_settings(s)}
        print(f"-- vwf_dyslexia seed {seed}: {config.train.steps} steps", flush=True)
        run_dir = os.path.join(workdir, "runs", cache.key(config, code["source_hash"]))
        out = cache.cached(
            lambda config=config, run_dir=run_dir: train_and_analyse(config, run_dir, s),
            config=key,
            code=code["source_hash"],
            root=os.path.join(workdir, "cache"),
        )
        rows += out.pop("rows")
        per_seed[str(seed)] = out
    return results.record(
        "vwf_dyslexia",
        "quick" if quick else "full",
        config={
            "settings": dataclasses.asdict(s),
            "train": run_config(s, s.seeds[0]).to_dict(),
            "eval_seed": EVAL_SEED,
        },
        rows=rows,
        code=code,
        per_seed=per_seed,
    )


def run(workdir: str, *, quick: bool = False) -> Report:
    """The quick record, or the full run's two records (the first study, then the re-test),
    each with its claims and figures, in one report."""
    records = [measure(workdir, quick=quick)]
    if not quick:
        records.append(experiment_runner.measure(experiment_v2.EXPERIMENT, workdir))
    claims = [c for r in records for c in claims_from_results(r)]
    figures = [] if quick else plot(records[0], workdir) + report_v2.plot(records[1], workdir)
    return Report(
        method="vwf_dyslexia",
        figures=figures,
        claims=claims,
        metrics={**{c.metric: c.interval.to_dict() for c in claims}, **summary(records[0])},
        command="python -m launch.reproduce --methods=vwf_dyslexia" + (" --quick" if quick else ""),
        results=records if len(records) > 1 else records[0],
    )
