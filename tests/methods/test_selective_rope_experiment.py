"""Selective RoPE's experiment protocol (issue 26): the lr is chosen on the validation stream and
the chosen lr's runs are reported on the test stream; an edge choice stops the full run unless
the arm learned nothing at any lr; the committed full run re-derives its claims."""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import methods.selective_rope as sr
from configs import selective_rope as sr_config
from core import data, results, train
from core import experiment_runner as runner
from core.errors import ConfigError
from methods.selective_rope import experiment, model

LRS = (1e-3, 3e-3, 1e-2)
SEEDS = (0, 1, 2)


def _record(val: dict, test: dict, *, quick: bool = True) -> dict:
    """A record as written before the runner (GLA, selective and RoPE, trained at 32, tested at
    32 and 64): val / test[position][lr] -> score, plus 0.01 * seed so that seeds differ."""
    rows = [
        {
            "model": "gla",
            "position": pos,
            "lr": lr,
            "seed": seed,
            "validation/len32/last_quarter": val[pos][lr] + 0.01 * seed,
            "test/len32/last_quarter": test[pos][lr] + 0.01 * seed,
            "test/len64/last_quarter": test[pos][lr] + 0.01 * seed,
        }
        for pos in ("selective", "rope")
        for lr in LRS
        for seed in SEEDS
    ]
    return {"method": "selective_rope", "config": {"quick": quick}, "rows": rows}


# The quick setting on a three-point lr grid: an interior and two edges to choose from.
WIDE = dataclasses.replace(experiment.QUICK, lrs={"gla": LRS})


def test_the_lr_is_chosen_on_validation_and_reported_on_test():
    # Validation prefers the middle lr; the test stream would prefer the highest. The claims
    # must report the middle lr's test numbers (choosing on test would give 0.99 - 0.5).
    exp = experiment.experiment(WIDE, quick=True)
    record = experiment.adopt(
        _record(
            val={
                "selective": {1e-3: 0.7, 3e-3: 0.9, 1e-2: 0.8},
                "rope": {1e-3: 0.5, 3e-3: 0.52, 1e-2: 0.5},
            },
            test={
                "selective": {1e-3: 0.6, 3e-3: 0.8, 1e-2: 0.99},
                "rope": {1e-3: 0.5, 3e-3: 0.5, 1e-2: 0.5},
            },
        ),
        exp,
    )
    chosen = runner.choices(record)
    assert {k: sel.point["lr"] for k, sel in chosen.items()} == {
        "gla/selective": 3e-3,
        "gla/rope": 3e-3,
    }
    claims = runner.claims(exp, record)
    assert [c.metric for c in claims] == [
        "gla: selective - rope, len32/last_quarter",
        "gla: selective - rope, len64/last_quarter",
    ]
    # Paired by seed, both arms carry the same 0.01 * seed: every difference is exactly 0.3.
    for claim in claims:
        assert claim.n == 3
        assert claim.interval.mean == pytest.approx(0.3, abs=1e-9)
    assert [c.margin for c in claims] == [0.25, 0.10]  # the quick margins
    assert runner.edges(record) == []


def test_an_edge_choice_stops_the_full_run_unless_the_arm_learned_nothing():
    exp = experiment.experiment(WIDE, quick=False)
    learned_on_edge = {1e-3: 0.6, 3e-3: 0.8, 1e-2: 0.9}
    chance_on_edge = {1e-3: 0.50, 3e-3: 0.51, 1e-2: 0.52}
    test = {p: dict.fromkeys(LRS, 0.5) for p in ("selective", "rope")}
    val = {"selective": learned_on_edge, "rope": chance_on_edge}
    record = experiment.adopt(_record(val, test, quick=False), exp)
    edges = runner.edges(record)
    assert [(e["arm"], e["value"], e["side"]) for e in edges] == [
        ("gla/selective", 1e-2, "high"),
        ("gla/rope", 1e-2, "high"),
    ]
    assert edges[0]["open"] is None and "at chance" in edges[1]["open"]  # 0.53 < 0.55
    with pytest.raises(ConfigError, match=r"widen it: gla/selective: lr=0.01 \(high\)$"):
        runner.claims(exp, record)
    # An arm that learned (0.7 > CHANCE_CEILING) gets no pass for its edge.
    val["rope"] = {1e-3: 0.5, 3e-3: 0.6, 1e-2: 0.7}
    record = experiment.adopt(_record(val, test, quick=False), exp)
    assert len(runner.unfinished(record)) == 2


def old_host_loop(cfg, params, config, split: str, length: int) -> dict:
    """The host loop the streams replaced (`accuracy` before issue 38), kept as a reference:
    its own example draws, its own batches, integer counts added in NumPy."""
    task = sr.make_task(config, length=length, min_length=None)
    T, n = task.seq_len, config.eval.num_examples
    size, t = max(1, sr.EVAL_TOKENS_PER_BATCH // T), np.arange(T)[None]
    correct_of = jax.jit(
        lambda p, x, y: jnp.argmax(model.apply(cfg, p, x, mask_BT=x != 0)[0], -1) == y
    )
    sums = dict.fromkeys(("hit", "n", "hit_half", "n_half", "hit_q", "n_q", "final", "exact"), 0)
    for start in range(0, n, size):
        rows = range(start, min(start + size, n))
        offset = config.seed + sr.SPLIT_SEED_OFFSETS[split]
        batch = data.stack([task.example(np.random.default_rng([offset, j])) for j in rows])
        correct = np.asarray(correct_of(params, batch["inputs"], batch["targets"]))
        mask = batch["mask"] > 0
        half, quarter = mask & (t >= T // 2), mask & (t >= (3 * T) // 4)
        sums["hit"] += (correct & mask).sum()
        sums["n"] += mask.sum()
        sums["hit_half"] += (correct & half).sum()
        sums["n_half"] += half.sum()
        sums["hit_q"] += (correct & quarter).sum()
        sums["n_q"] += quarter.sum()
        sums["exact"] += np.all(correct | ~mask, axis=1).sum()
        last = T - 1 - np.argmax(mask[:, ::-1], axis=1)
        sums["final"] += correct[np.arange(len(rows)), last].sum()
    return {
        "accuracy": sums["hit"] / sums["n"],
        "last_half": sums["hit_half"] / sums["n_half"],
        "last_quarter": sums["hit_q"] / sums["n_q"],
        "final": sums["final"] / n,
        "exact_match": sums["exact"] / n,
    }


def test_length_streams_equal_the_old_host_loop_on_the_same_examples():
    """Each named stream (one per length, plus validation at the training length) gives the old
    host loop's numbers exactly: the same examples, the same counts (float32 sums of 0/1 are
    exact), the padded rows of a batch not counted (20 examples in a batch of 24, on the 8 test
    devices); a stream reading another length's examples, or the other stream's, differs."""
    config = sr_config.get_config("size=smoke")
    config.eval.num_examples = 20  # not a multiple of 8 devices: the last batch is padded
    cfg = sr.model_config(config)
    session = train.init(config, sr.make(config))
    session.train(2)
    got = session.evaluate()
    params = session.state.params
    expected = {}
    for T in (16, 32):
        for k, v in old_host_loop(cfg, params, config, "test", T).items():
            expected[f"len{T}/{k}"] = v
    for k, v in old_host_loop(cfg, params, config, "validation", 16).items():
        expected[f"validation.len16/{k}"] = v
    assert got == pytest.approx(expected, rel=0, abs=0)  # the same counts: exactly equal
    assert got["len16/accuracy"] != got["len32/accuracy"]  # the lengths' data differ


def test_validation_and_test_examples_come_from_different_streams():
    config = sr_config.get_config("size=smoke")
    validation, test, again = (
        sr.split_examples(config, split, seed=0)
        for split in ("validation/len16", "test/len16", "validation/len16")
    )
    assert not np.array_equal(validation["inputs"], test["inputs"])
    np.testing.assert_array_equal(validation["inputs"], again["inputs"])  # a stream
    assert sr.split_examples(config, "test/len32", seed=0)["inputs"].shape == (16, 32)
    with pytest.raises(ConfigError, match="selective_rope: split='train'"):
        sr.split_examples(config, "train", seed=0)


def test_a_run_reports_validation_and_test_from_its_final_evaluation(tmp_path):
    """`train_and_evaluate` reads the run's final evaluation: the training length on the
    validation stream (what selection reads), every length on the test stream (reported)."""
    config = sr_config.get_config("size=smoke,position=rope")
    config.train.eval_every, config.train.checkpoint_every = 0, 0
    out = sr.train_and_evaluate(config, str(tmp_path))
    metrics = ("accuracy", "last_half", "last_quarter", "final", "exact_match")
    assert set(out["validation"]) == {f"len16/{m}" for m in metrics}
    assert set(out["test"]) == {f"len{T}/{m}" for T in (16, 32) for m in metrics}
    assert out["validation"] != {k: out["test"][k] for k in out["validation"]}
    assert out["diverged"] == 0.0 and "flip_error" not in out  # RoPE: no flip


def test_every_arm_has_a_grid_to_choose_from_and_three_seeds():
    for s in (experiment.FULL, experiment.QUICK):
        assert len(s.seeds) >= 3
    assert all(len(grid) >= 3 for grid in experiment.FULL.lrs.values())  # an interior exists
    assert experiment.FULL.require_interior


COMMITTED = results.path("selective_rope", "full")


@pytest.mark.skipif(not os.path.exists(COMMITTED), reason="no committed full run yet")
def test_committed_full_run_rederives_its_claims_on_three_seeds():
    """The committed record (written before the runner) is read unchanged: every grid point of
    every arm on every seed, no arm that learned on its grid's edge, and every claim re-derived
    on three seeds with its own label (the model, the position(s), the length)."""
    record = results.load("selective_rope", "full")
    assert record["config"]["quick"] is False
    assert len(record["code"]["git_commit"]) == 40 and record["code"]["git_dirty"] is False
    claims = experiment.claims_from_results(record)
    assert len(claims) == len(experiment.CLAIMS) and all(c.n == 3 for c in claims)
    for claim, spec in zip(claims, experiment.CLAIMS, strict=True):
        assert claim.metric.startswith(spec.model) and spec.position in claim.metric
        assert f"len{64 * spec.multiple}/" in claim.metric
    adopted = experiment.adopt(record)
    for arm, settings in adopted["config"]["arms"].items():
        for lr in settings["grid"]["lr"]:
            rows = [r for r in adopted["rows"] if (r["arm"], r["lr"]) == (arm, lr)]
            assert sorted(r["seed"] for r in rows) == record["config"]["seeds"]
    assert {a: s["grid"]["lr"] for a, s in adopted["config"]["arms"].items()} == {
        f"{kind}/{pos}": list(experiment.FULL.lrs[kind])
        for kind in experiment.FULL.models
        for pos in experiment.FULL.positions
    }
    assert runner.unfinished(adopted) == []
