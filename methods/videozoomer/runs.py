"""The cached units of VideoZoomer's experiment: a cold start, a GRPO stage, a measurement.

    summary = trained(config, workdir)   # cached by (config, code): train both stages, measure

A run is two `core.train` runs: the cold start (`sft.steps` supervised steps; its own workdir
keyed by the SFT-relevant config, so arms with the same cold start share it: full, SFT-only and
no-bonus), then GRPO (`train.init_from` the cold start's workdir; none for the no-cold-start
arm; none for SFT-only). The trained policy plays greedy episodes on held-out videos
(`evaluation.summary`: its numbers, and the perfect reader's on uniform frames).

Everything that decides the numbers is in `config` or in the files of `SOURCES`; the claims,
tables and plots (`experiment.py`, `report.py`) are not among them.
"""

import os

import jax

from core import cache, results, train
from core.errors import ConfigError
from core.precision import compute_dtype
from methods import videozoomer
from methods.videozoomer import evaluation, policy
from methods.videozoomer import video as v

SOURCES = results.run_sources("videozoomer")
EXAMPLES = 3  # transcripts kept per run, for the README
RL_SEED_OFFSET = 1000


def code_hash() -> str:
    return results.source_hash(SOURCES)


def sft_config(config):
    """The cold start's own config: only what it depends on (the RL fields at fixed values, so
    arms that differ only after the cold start share it)."""
    c = config.copy_and_resolve_references()
    c.arm = "cold_start"
    c.rewards.tool_bonus = 0.0
    c.train.steps = c.sft.steps
    c.train.init_from = ""
    c.train.eval_every = -1
    c.train.checkpoint_every = c.sft.steps
    c.train.log_every = max(1, c.sft.steps // 10)
    return c


def rl_config(config, init_from: str):
    """The GRPO stage's config: from the cold start's params, on a video stream of its own (the
    seed offset: not the videos the cold start was trained on)."""
    c = config.copy_and_resolve_references()
    c.seed = config.seed + RL_SEED_OFFSET
    c.train.steps = config.train.steps - config.sft.steps
    c.sft.steps = 0
    c.train.init_from = init_from
    c.train.eval_every = -1
    c.train.checkpoint_every = c.train.steps
    c.train.log_every = max(1, c.train.steps // 10)
    return c


def _train(config, workdir: str):
    result = train.run(config, videozoomer.make(config), workdir, devices=jax.devices()[:1])
    if result.preempted:
        raise ConfigError(f"videozoomer: the run in {workdir} was preempted; rerun to resume it")
    return result.state.params


def train_and_evaluate(config, workdir: str, code: str) -> dict:
    """Train the arm's stages (module docstring) under `workdir` and measure the policy."""
    sft_steps, rl_steps = config.sft.steps, config.train.steps - config.sft.steps
    params, init_from = None, ""
    if sft_steps > 0:
        cold = sft_config(config)
        init_from = os.path.join(workdir, "cold_start", cache.key(cold, code))
        params = _train(cold, init_from)
    if rl_steps > 0:
        rl = rl_config(config, init_from)
        params = _train(rl, os.path.join(workdir, "rl", cache.key(rl, code)))
    if params is None:
        raise ConfigError("videozoomer: a run with neither sft.steps nor RL steps trains nothing")
    cfg = policy.model_config(config.model, compute_dtype(config.dtype))
    batch = evaluation.held_out(config.eval.num_examples // len(v.KINDS), config.seed)
    episodes = evaluation.play(cfg, params, batch)
    summary = evaluation.summary(batch, episodes)
    summary["examples"] = [evaluation.transcript(batch, episodes, i) for i in range(EXAMPLES)]
    return summary


def trained(config, workdir: str) -> dict:
    """`train_and_evaluate`'s summary, cached under `workdir`/trainings by (config, code)."""
    code = code_hash()
    return cache.cached(
        lambda: train_and_evaluate(config, workdir, code),
        config=config,
        code=code,
        root=os.path.join(workdir, "trainings"),
    )


READERS = {"glance_only": "glance", "uniform_eq": "uniform_eq", "uniform_2x": "uniform_2x"}


def rows(summary: dict, reader: str | None = None) -> dict:
    """A results row's metrics: the agent's numbers under "test/...", or (reader) the perfect
    reader's on its frames, under the same names (accuracy per kind and overall, frames)."""
    if reader is None:
        out = {f"test/{k}": x for k, x in summary.items() if k != "examples"}
        return out | {"examples": summary["examples"]}
    kinds = {f"test/{kind}/accuracy": summary[f"{kind}/{reader}"] for kind in v.KINDS}
    overall = sum(kinds.values()) / len(kinds)  # held-out sets have equal counts per kind
    return kinds | {"test/accuracy": overall, "test/frames": summary[f"frames/{reader}"]}
