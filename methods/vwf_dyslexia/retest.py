"""One run of the re-test (issue 47; `experiment_v2.py` states the arms, grid and claims): train
the `cpu` VLM on diet "v2" (`tasks.DIETS`: reading 22.5 % of the examples, a task on every
localiser category), then localise and lesion it, and return the metrics the selection and the
claims read, with every mask's per-task accuracy as detail.

Per run (one model seed at one grid point): the localiser (`localiser.t_map`, words from the
taught lexicon, each scrambled word the same item as its word) on `resamples` resamples, the
selection from resample 0; the intact model on a "val" set (the selection's metric: the mean
of its tasks) and on the "eval" set that every mask is scored on (the same examples for every
seed, so drops pair by seed). Masks, unit lesion (`lesion.py`, the paper's): the top k % by t
(global; per layer reported), `random_masks` layer-matched random masks per k, the top
`claim_percent` % scaled by each s, every unit of each decoder layer and of all of them. The
official code's behaviour (`official_hook.py`): the top k % through the official hook at every
k, and the first `official_random` random masks of `official_percent` through it.

A mask's drop on a task is intact - lesioned accuracy; its selectivity is the lexical drop minus
the mean drop of the non-reading tasks (every task of the diet but lexical and letters; the
letter read-out is reading, in neither side).
"""

import dataclasses
import time

import jax
import numpy as np

from core import train
from core.errors import ConfigError
from methods.vwf_dyslexia import lesion, localiser, make, model_config, official_hook, tasks

VAL_SEED = 11  # the "val" set the grid choice reads
EVAL_SEED = 7  # the "eval" set every mask is scored on (the first study's seed)
NOT_REACHED = 32.0  # the "smallest k" when no k of the grid puts lexical decision below 65 %
THRESHOLD = 0.65  # the paper's dyslexia threshold on lexical decision


@dataclasses.dataclass(frozen=True)
class Sizes:
    steps: int
    batch_size: int
    percents: tuple  # the k grid, % of all decoder MLP gate units
    random_masks: int  # per k
    claim_percent: float  # the first study's claim k (the scale sweep's too)
    official_percent: float  # the official code's default k
    official_random: int  # random masks through the official hook, at official_percent
    scales: tuple
    n_per_task: int  # "eval" examples per task
    n_val: int  # "val" examples per task
    n_localiser: int  # images per category per resample
    resamples: int

    def __post_init__(self):
        if not {self.claim_percent, self.official_percent} <= set(self.percents):
            raise ConfigError(
                f"retest sizes: claim_percent {self.claim_percent} and official_percent "
                f"{self.official_percent} must be in the k grid {self.percents}"
            )
        sweep_ok = not self.scales or (0 in self.scales and len(set(self.scales)) > 1)
        if self.official_random > self.random_masks or not sweep_ok:
            raise ConfigError(
                f"retest sizes: official_random {self.official_random} must be <= random_masks "
                f"{self.random_masks}, and the scale sweep {self.scales} must hold s = 0 and "
                "another s"
            )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def name(kind: str, value, draw: int | None = None) -> str:
    """A mask's name: "vwf/4", "random/21/3", "official/vwf/21", "scale/-2" (numbers %g)."""
    return f"{kind}/{value:g}" + ("" if draw is None else f"/{draw}")


def selectivity(intact: dict, lesioned: dict, non_reading) -> float:
    """Lexical drop minus the mean drop of the non-reading tasks."""
    others = np.mean([intact[t] - lesioned[t] for t in non_reading])
    return float(intact["lexical"] - lesioned["lexical"] - others)


def non_reading(diet: str) -> tuple[str, ...]:
    return tuple(t for t in tasks.DIETS[diet] if t not in tasks.READING)


def _accuracies(cfg, params, examples, selections: dict, value=0.0, official=False) -> dict:
    """{name: {task: accuracy}} for named bool [L, F] selections: zeroed (or scaled by `value`)
    units, or (official) the official hook of the same selection."""
    names = list(selections)
    stacked = np.stack([selections[n] for n in names])
    if official:
        acc = official_hook.accuracy(cfg, params, examples, stacked)
    else:
        masks = lesion.unit_masks(stacked, value)
        acc = lesion.accuracy(cfg, params, examples, masks, batch_size=128, chunk=8)
    return {n: {t: float(acc[t][i]) for t in acc} for i, n in enumerate(names)}


def whole_layers(layers: int, width: int) -> dict:
    """{"layer/<l>": every unit of decoder layer l, "all": every unit}: bool [L, F]."""
    layer_LF = np.repeat(np.arange(layers)[:, None], width, axis=1)
    return {name("layer", i): layer_LF == i for i in range(layers)} | {
        "all": np.ones((layers, width), bool)
    }


def selections(t_LF, s: Sizes, rng: np.random.Generator) -> tuple[dict, dict, list]:
    """(unit-lesion selections, official-hook selections, localiser rows) of one t map."""
    unit = {"intact": np.zeros_like(t_LF, bool)}
    official, rows = {}, []
    for k in s.percents:
        vwf = localiser.top_k_global(t_LF, k)
        unit[name("vwf", k)] = vwf
        unit[name("vwf_per_layer", k)] = localiser.top_k_per_layer(t_LF, k)
        for d in range(s.random_masks):
            unit[name("random", k, d)] = localiser.random_matched(vwf, rng)
        official[name("official/vwf", k)] = vwf
        if k == s.official_percent:
            for d in range(s.official_random):
                official[name("official/random", k, d)] = unit[name("random", k, d)]
        rows.append({"percent": k, "units": int(vwf.sum()), "per_layer": vwf.sum(1).tolist()})
    unit |= whole_layers(*t_LF.shape)
    return unit, official, rows


def summarise(acc: dict, s: Sizes, diet: str) -> dict:
    """The flat metrics the claims read, from {mask: {task: accuracy}} of one run."""
    others, intact = non_reading(diet), acc["intact"]
    out = {f"test/intact/{t}": v for t, v in intact.items()}
    # A task left at chance loses nothing to any lesion and would lift every selectivity.
    out["test/intact/least_non_reading"] = min(intact[t] for t in others)

    def sel(lesioned: dict) -> float:
        return selectivity(intact, lesioned, others)

    def draws_mean(kind: str, k, draws: int, fn) -> float:
        return float(np.mean([fn(acc[name(kind, k, d)]) for d in range(draws)]))

    for k in s.percents:
        vwf = sel(acc[name("vwf", k)])
        rand = draws_mean("random", k, s.random_masks, sel)
        out[f"test/selectivity/vwf/{k:g}"] = vwf
        out[f"test/selectivity/random/{k:g}"] = rand
        out[f"test/selectivity/vwf_minus_random/{k:g}"] = vwf - rand
        out[f"test/official/selectivity/vwf/{k:g}"] = sel(acc[name("official/vwf", k)])
        out[f"test/official/lexical/vwf/{k:g}"] = acc[name("official/vwf", k)]["lexical"]
    if s.official_random:
        k = s.official_percent
        rand = draws_mean("official/random", k, s.official_random, sel)
        out[f"test/official/selectivity/random/{k:g}"] = rand
        out[f"test/official/selectivity/vwf_minus_random/{k:g}"] = (
            out[f"test/official/selectivity/vwf/{k:g}"] - rand
        )
    below = [k for k in s.percents if acc[name("vwf", k)]["lexical"] < THRESHOLD]
    out["test/smallest_k"] = min(below) if below else NOT_REACHED
    at = min(below) if below else max(s.percents)  # no k reached: the largest, as the first study
    out["test/random_lexical_at_smallest_k"] = draws_mean(
        "random", at, s.random_masks, lambda a: a["lexical"]
    )
    if s.scales:
        by_scale = {v: sel(acc[name("scale", v)]) for v in s.scales}
        best_other = max(value for v, value in by_scale.items() if v != 0)
        out["test/selectivity/scale0_minus_max_other"] = by_scale[0] - best_other
    return out


def analyse(cfg, params, s: Sizes, seed: int, data) -> dict:
    """Every metric of one trained model (module docstring). data: its config.data."""
    diet = data.get("diet", "v1")
    diet_tasks = tuple(tasks.DIETS[diet])
    stimulus = dict(
        lexicon_size=data.lexicon_size, jitter=data.jitter, spell=data.spell, task_names=diet_tasks
    )
    words = tasks.lexicon(data.lexicon_size) if data.lexicon_size else None
    start = time.perf_counter()
    t_maps = [
        localiser.t_map(
            cfg, params, s.n_localiser, seed=100 * seed + r, jitter=data.jitter, words=words
        )
        for r in range(s.resamples)
    ]
    seconds = {"localise": time.perf_counter() - start}
    unit, official, localiser_rows = selections(t_maps[0], s, np.random.default_rng([seed, 1]))
    if s.resamples > 1:
        for row in localiser_rows:
            resampled = [localiser.top_k_global(t, row["percent"]) for t in t_maps]
            row["resample_overlap"] = localiser.mean_pairwise_overlap(resampled)
    start = time.perf_counter()
    val = lesion.eval_set(s.n_val, VAL_SEED, split="val", **stimulus)
    val_acc = _accuracies(cfg, params, val, {"intact": unit["intact"]})["intact"]
    examples = lesion.eval_set(s.n_per_task, EVAL_SEED, **stimulus)
    acc = _accuracies(cfg, params, examples, unit)
    claim_units = localiser.top_k_global(t_maps[0], s.claim_percent)
    for value in s.scales:
        scaled = _accuracies(cfg, params, examples, {"x": claim_units}, value)
        acc[name("scale", value)] = scaled["x"]
    seconds["unit_lesions"] = time.perf_counter() - start
    start = time.perf_counter()
    acc |= _accuracies(cfg, params, examples, official, official=True)
    seconds["official_hook"] = time.perf_counter() - start
    return {
        "validation/mean_accuracy": float(np.mean(list(val_acc.values()))),
        **{f"validation/{t}": v for t, v in val_acc.items()},
        **summarise(acc, s, diet),
        "detail": {
            "accuracy": acc,
            "localiser": localiser_rows,
            "t_max": float(np.max(t_maps[0])),
            "seconds": seconds,
        },
    }


def run(config, run_dir: str) -> dict:
    """`core.experiment_runner`'s run: train (one device), then `analyse`; the sizes are
    config.exp (`experiment_v2.config_of`)."""
    s = Sizes(**{k: tuple(v) if isinstance(v, list) else v for k, v in config.exp.items()})
    start = time.perf_counter()
    # One device: the tests' 8 fake CPU devices would split each small batch 8 ways.
    result = train.run(config, make(config), run_dir, devices=jax.devices()[:1])
    train_seconds = time.perf_counter() - start
    out = analyse(model_config(config), result.state.params, s, config.seed, config.data)
    out["detail"]["seconds"]["train"] = train_seconds
    return out
