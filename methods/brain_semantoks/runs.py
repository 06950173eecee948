"""The cached units of Brain-Semantoks' experiment: one arm of one seed, trained and probed.

    row = run(config, run_dir)   # config.arm_kind: "ssl" | "random_init" | "fc"

- ssl: pretraining (`core.train.run` of the method) in `run_dir`, then the "probe" evaluator's
  numbers at the end and the "collapse" evaluator's over training (from the run's history);
- random_init: the same probes on the teacher of the initial state (untrained weights of that
  seed);
- fc: the FC + logistic-regression baseline on the same probe sets and splits.
A row holds "test/<set>/<phenotype>" and "val/..." (set id | ood, phenotype a | b), their means
over phenotypes ("test/<set>/mean"), the share of repetitions whose choice sat on a grid edge,
and for ssl the collapse diagnostics per evaluation step and "collapse/spread_gain" (the teacher
projection std at the end over its first value).
"""

import jax

from core import train, workdir
from core.errors import ConfigError
from methods import brain_semantoks as bs

KINDS = ("ssl", "random_init", "fc")


def _row(probes: dict) -> dict:
    out = {}
    for name in ("id", "ood"):
        for split in ("val", "test"):
            vals = [probes[f"{name}/{phen}/{split}"] for phen in ("a", "b")]
            out |= {f"{split}/{name}/{phen}": v for phen, v in zip("ab", vals, strict=True)}
            out[f"{split}/{name}/mean"] = sum(vals) / 2
        for phen in "ab":
            out[f"edge_share/{name}/{phen}"] = probes[f"{name}/{phen}/edge_share"]
    return out


def _collapse(history: list[dict]) -> dict:
    keys = ("proj_std", "effective_rank", "token_cosine")
    rows = [r for r in history if "eval/collapse/proj_std" in r]
    series = {f"collapse/{k}": [float(r[f"eval/collapse/{k}"]) for r in rows] for k in keys}
    std = series["collapse/proj_std"]
    # How far the teacher's projections spread out between the first and the last evaluation
    # (a teacher that never moves, or collapses, stays at about 1 or falls below it).
    return {"collapse/step": [int(r["step"]) for r in rows], **series,
            "collapse/spread_gain": std[-1] / max(std[0], 1e-12)}  # fmt: skip


def run(config, run_dir: str) -> dict:
    kind = config.arm_kind
    if kind not in KINDS:
        raise ConfigError(f"brain_semantoks: arm_kind={kind!r}; one of {KINDS}")
    if kind == "fc":
        return _row(bs.fc_baseline(config))
    if kind == "random_init":  # the initial state's teacher: the ssl arm's weights at step 0
        state = train.init(config, bs.make(config), devices=jax.devices()[:1]).state
        teacher, buffers = state.extra["teacher"], state.extra["buffers"]
        return _row(bs.evaluate_probes(config, bs.model_config(config), teacher, buffers))
    result = train.run(config, bs.make(config), run_dir, devices=jax.devices()[:1])
    if result.preempted:
        raise ConfigError(f"brain_semantoks: the run in {run_dir} was preempted; rerun to resume")
    # The whole run's rows, not only this call's (a resumed or finished run's history starts
    # where this call did, and the collapse series from its first evaluation).
    history = workdir.read_metrics(run_dir)
    final = [r for r in history if "eval/probe/id/a/test" in r][-1]
    probes = {k.removeprefix("eval/probe/"): v for k, v in final.items() if "/probe/" in k}
    return _row(probes) | _collapse(history)
