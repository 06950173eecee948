"""The LM baseline: its loss is the masked cross-entropy, and its experiment's claims hold."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import lm
from core import results
from core.errors import ConfigError
from core.nn import transformer
from methods.lm import experiment, loss_fn, make, model_config

CONFIG = lm.get_config("size=smoke,task=copy")
CFG = model_config(CONFIG)


def batch_and_params():
    method = make(CONFIG)
    batch = next(method.dataset("train", shard=(0, 1), seed=0))
    params = transformer.init_params(CFG, jax.random.PRNGKey(0))
    return {k: jnp.asarray(v) for k, v in batch.items()}, params


def test_loss_is_masked_cross_entropy():
    batch, params = batch_and_params()
    loss, metrics = loss_fn(CFG, params, batch)
    logits, _ = transformer.apply(CFG, params, batch["inputs"])
    logp = np.asarray(jax.nn.log_softmax(logits))
    targets, mask = np.asarray(batch["targets"]), np.asarray(batch["mask"])
    b, t = np.nonzero(mask)
    expected = -logp[b, t, targets[b, t]].mean()
    # Same float32 numbers summed in another order: ~1e-7 relative.
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    assert float(metrics["num_tokens"]) == batch["inputs"].size


def test_loss_ignores_unmasked_targets_only():
    batch, params = batch_and_params()
    loss, _ = loss_fn(CFG, params, batch)
    unmasked = np.asarray(batch["mask"]) == 0
    scrambled = np.where(unmasked, (np.asarray(batch["targets"]) + 1) % CFG.vocab_size, 0)
    changed = {**batch, "targets": jnp.where(unmasked, scrambled, batch["targets"])}
    assert float(loss_fn(CFG, params, changed)[0]) == float(loss)
    b, t = np.argwhere(np.asarray(batch["mask"]) > 0)[0]
    flipped = batch["targets"].at[b, t].set((batch["targets"][b, t] + 1) % CFG.vocab_size)
    assert float(loss_fn(CFG, params, {**batch, "targets": flipped})[0]) != float(loss)


def test_bad_task_option_is_a_config_error():
    config = lm.get_config("size=smoke,task=mqar")
    config.task.num_pairs = 100  # more pairs than keys
    with pytest.raises(ConfigError, match="num_pairs"):
        make(config)


def test_evaluation_reads_whole_batches_or_says_why_not():
    config = lm.get_config("size=smoke,task=copy")
    config.eval.num_examples = 60  # not a multiple of the batch of 8
    method = make(config)  # training alone is fine
    with pytest.raises(ConfigError, match="eval.num_examples=60 must be a multiple of"):
        method.dataset("eval", shard=(0, 1), seed=0)
    config.eval.num_examples = 64
    batches = list(make(config).dataset("eval", shard=(0, 1), seed=0))
    assert len(batches) == 8 and all(b["inputs"].shape[0] == 8 for b in batches)


# 278 s on 2 cores under a load of ~11 (other jobs), over the ~45 s a method's default tests
# may take: run it with -m slow
# (or `python -m launch.reproduce --methods=lm --quick`).
@pytest.mark.slow
def test_quick_experiment_claims_hold_and_are_rederived_from_its_results(tmp_path, monkeypatch):
    from launch import reproduce

    out = str(tmp_path)
    (report,) = reproduce.reproduce(["lm"], out, quick=True)
    failed = [c.to_dict() for c in report.claims if not c.holds]
    assert not failed, failed
    assert [c.metric for c in report.claims] == ["copy/exact_match"]
    assert all(c.n == len(experiment.SEEDS) >= 3 for c in report.claims)
    # The results file holds one row per (task, seed) and the code version.
    saved = results.load("lm", "quick", root=os.path.join(out, "results"))
    assert sorted((r["task"], r["seed"]) for r in saved["rows"]) == [
        ("copy", s) for s in experiment.SEEDS
    ]
    assert saved["code"]["source_hash"] == results.code_version("lm")["source_hash"]
    # --from_results: the same claims from the file alone, nothing trained.
    monkeypatch.setattr(experiment, "train_and_evaluate", fail_if_trained)
    (derived,) = reproduce.reproduce(["lm"], out, quick=True, from_results=True)
    assert [c.to_dict() for c in derived.claims] == [c.to_dict() for c in report.claims]
    # A rerun in the same workdir reads every (task, seed) run from the cache.
    again = experiment.run(os.path.join(out, "workdirs", "lm"), quick=True)
    assert [c.to_dict() for c in again.claims] == [c.to_dict() for c in report.claims]


def fail_if_trained(*args, **kwargs):
    raise AssertionError("trained although the results or the cache had the run")


def record_with(values: dict[str, list[float]], quick: bool = False) -> dict:
    """A results record in the committed full run's format (written before
    `core.experiment_runner`) with the given per-seed claim metric for each task."""
    metric = {r.task: r.metric for r in experiment.RUNS}
    rows = [
        {"task": task, "seed": seed, metric[task]: value}
        for task, per_seed in values.items()
        for seed, value in enumerate(per_seed)
    ]
    return {"method": "lm", "config": {"quick": quick}, "rows": rows}


def test_claims_from_results_cover_every_task_and_can_fail():
    good = {"copy": [1.0, 1.0, 0.99], "mqar": [0.97, 0.95, 0.96], "modular": [1.0, 0.98, 1.0]}
    claims = experiment.claims_from_results(record_with({**good, "parity": [0.5, 0.49, 0.52]}))
    assert [c.metric.split("/")[0] for c in claims] == ["copy", "mqar", "modular", "parity"]
    assert all(c.holds for c in claims)
    # One seed that learned parity pushes the interval's upper end past 0.6: the claim fails
    # although the mean (0.59) is below the target.
    claims = experiment.claims_from_results(record_with({**good, "parity": [0.5, 0.49, 0.78]}))
    assert not claims[-1].holds and claims[-1].interval.mean < 0.6
    # MQAR above 0.9 on average but one seed at 0.85: not learned on every seed's evidence.
    bad_mqar = {**good, "mqar": [0.97, 0.96, 0.85], "parity": [0.5, 0.49, 0.52]}
    claims = experiment.claims_from_results(record_with(bad_mqar))
    assert not claims[1].holds and claims[1].interval.mean > 0.9
    with pytest.raises(ConfigError, match="2 values"):
        experiment.claims_from_results(record_with({"copy": [1.0, 1.0]}, quick=True))
    # A quick record leaves out the tasks it did not run; a full one may not.
    (claim,) = experiment.claims_from_results(record_with({"copy": [1.0, 1.0, 1.0]}, quick=True))
    assert claim.metric == "copy/exact_match"
    with pytest.raises(ConfigError, match="no arm 'mqar'"):
        experiment.claims_from_results(record_with({"copy": [1.0, 1.0, 1.0]}))


def test_a_runner_record_gives_the_claims_of_the_same_rows_in_the_committed_format(
    tmp_path, monkeypatch
):
    # No training: each run's metrics are a number made from its config (task and seed).
    def fake_run(config, workdir):
        return {"exact_match": 0.9 + config.seed / 100, "final_accuracy": 0.5, "losses": [1.0]}

    monkeypatch.setattr(experiment, "train_and_evaluate", fake_run)
    record = json.loads(json.dumps(experiment.measure(str(tmp_path))))
    assert [(r["task"], r["seed"]) for r in record["rows"]] == [
        (r.task, s) for r in experiment.RUNS for s in experiment.SEEDS
    ]
    steps = {task: cfg["train"]["steps"] for task, cfg in record["config"]["run_config"].items()}
    assert steps == {r.task: r.steps for r in experiment.RUNS}
    older = {"method": "lm", "config": {"quick": False, "seeds": list(experiment.SEEDS)}}
    older["rows"] = [{k: v for k, v in r.items() if k != "losses"} for r in record["rows"]]
    claims = [c.to_dict() for c in experiment.claims_from_results(record)]
    assert claims == [c.to_dict() for c in experiment.claims_from_results(older)]
    assert [c["interval"]["mean"] for c in claims] == pytest.approx([0.91, 0.91, 0.91, 0.5])


def test_full_run_settings_use_three_seeds_on_every_task():
    assert len(experiment.SEEDS) >= 3
    assert {r.task for r in experiment.RUNS} == {"copy", "mqar", "modular", "parity"}
    assert set(experiment.QUICK_TASKS) < {r.task for r in experiment.RUNS}


COMMITTED = results.path("lm", "full")


@pytest.mark.skipif(not os.path.exists(COMMITTED), reason="no committed full run yet")
def test_committed_full_results_give_every_task_a_claim_on_three_seeds():
    # The README's numbers come from this file: each task's claim re-derives from it, on every
    # seed of a full (not quick) run made from a recorded commit.
    record = results.load("lm", "full")
    claims = experiment.claims_from_results(record)
    assert [c.metric.split("/")[0] for c in claims] == ["copy", "mqar", "modular", "parity"]
    assert all(c.n == len(experiment.SEEDS) for c in claims) and record["config"]["quick"] is False
    assert len(record["code"]["git_commit"]) == 40 and len(record["code"]["source_hash"]) == 64
    steps = {task: cfg["train"]["steps"] for task, cfg in record["config"]["train"].items()}
    assert steps == {r.task: r.steps for r in experiment.RUNS}
