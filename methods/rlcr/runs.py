"""One cached unit of RLCR's experiment: train one arm on one seed, measure the policy.

    value = train_and_evaluate(config, run_dir)  # {"final": {family: ...}, "start": ... | None}

Everything that decides the numbers is in `config` (the training config plus `config.measure`:
what is evaluated and on how many questions) or in the files of `SOURCES`, which key the run
cache (`core.cache.cached_run`). The experiment's claims, tables and plots
(`experiment.py`) are not among them: editing a claim never retrains a policy.
"""

import jax
import jax.numpy as jnp
import numpy as np

from core import results, train
from core.precision import compute_dtype
from methods import rlcr
from methods.rlcr import calibration, evaluation, policy, witness

FAMILIES = (witness.IN_DOMAIN, witness.OUT_OF_DOMAIN)
# The sources a run's numbers depend on: core, the config and the method's training and
# measuring modules; not experiment.py (claims, tables) nor bench.py.
SOURCES = results.run_sources("rlcr")


def code_hash() -> str:
    return results.source_hash(SOURCES)


def train_policy(config, workdir: str, *, keep_step: int | None = None, devices=None):
    """Train through `core.train` (warm start, then GRPO) on `devices` (default: all): (the
    final params, a copy of the params after step `keep_step`, or None when not asked for or
    not passed, e.g. when the run resumed from a later checkpoint)."""
    method, kept = rlcr.make(config), {}
    if keep_step is not None:

        def hook(state, *, step):
            if step == keep_step:
                # A device copy (the next step donates the state's buffers): host arrays would
                # give the evaluation's jitted functions other input shardings, and a recompile.
                kept["params"] = jax.tree.map(jnp.copy, state.params)

        method = method._replace(hook=hook)
    return train.run(config, method, workdir, devices=devices).state.params, kept.get("params")


def reliability_lists(q_N, correct_N) -> dict[str, list]:
    conf, acc, count = calibration.reliability(q_N, correct_N)
    return {
        "confidence": np.asarray(conf).tolist(),
        "accuracy": np.asarray(acc).tolist(),
        "count": np.asarray(count).tolist(),
    }


def measure(config, params) -> dict:
    """Every number of one trained policy, per family of `config.measure.families`, and
    reliability bins for the plots; "probe" and "votes" only where `config.measure` asks."""
    m, seed = config.measure, config.seed
    cfg = policy.model_config(config.model, compute_dtype(config.dtype))
    # One stream in a fixed order (probe, then FAMILIES' order): what is skipped changes the
    # questions drawn after it, so the full run keeps its questions only while it skips nothing.
    rng = np.random.default_rng([seed, 7])
    probe = None
    if m.probe_examples:
        probe_data = witness.sample(rng, m.probe_examples, witness.IN_DOMAIN)
        probe_out = evaluation.answer(cfg, params, probe_data)
        probe = evaluation.fit_probe(probe_out["hidden"], probe_out["correct"], seed=seed)
    result = {}
    for f, family in enumerate(FAMILIES):
        if family.name not in m.families:
            continue
        data = witness.sample(rng, m.eval_examples, family)
        out = evaluation.answer(cfg, params, data)
        probed = {}
        if probe is not None:
            probed["probe"] = evaluation.probe_confidence(probe, out["hidden"])
        confidences = {
            "verbalized": out["q"],
            "verbalized_mean": out["mean_q"],
            "answer_prob": out["answer_prob"],
            **probed,
            "ideal": out["ideal_q"],  # the exact posterior of the policy's own answers
        }
        correct = out["correct"]
        votes = {}
        if m.vote_examples:
            votes["votes"] = evaluation.vote(
                cfg,
                params,
                {k: v[: m.vote_examples] for k, v in data.items()},
                rng=jax.random.key(1000 * seed + f),
                num_samples=m.vote_samples,
                temperature=config.grpo.temperature,
            )
        result[family.name] = {
            "format": float(out["format_ok"].mean()),
            "mean_q": float(out["q"].mean()),
            "scores": {k: evaluation.summary(q, correct) for k, q in confidences.items()},
            "bins": {k: reliability_lists(q, correct) for k, q in confidences.items()},
            **votes,
            "bayes": witness.bayes_summary(data["counts"], data["rho"]),
        }
    return result


def train_and_evaluate(config, run_dir: str, devices=None) -> dict:
    """One arm on one seed: the final policy's measurements, and the warm start's (the params
    after `warm_start.steps`, read from this run) when `config.measure.start` asks."""
    keep = config.warm_start.steps if config.measure.start else None
    params, start = train_policy(config, run_dir, keep_step=keep, devices=devices)
    if keep is not None and start is None:  # resumed past the warm start: train it alone
        alone = config.copy_and_resolve_references()
        alone.train.steps = alone.warm_start.steps
        start, _ = train_policy(alone, run_dir + "-start", devices=devices)
    return {
        "final": measure(config, params),
        "start": None if start is None else measure(config, start),
    }
