"""Selective RoPE's experiment protocol (issue 26): the lr is chosen on the validation stream and
the chosen lr's runs are reported on the test stream; an edge choice stops the full run unless
the arm learned nothing at any lr; the committed full run re-derives its claims."""

import os
import types

import numpy as np
import pytest

import methods.selective_rope as sr
from configs import selective_rope as sr_config
from core import results
from core.errors import ConfigError
from methods.selective_rope import experiment

LRS = (1e-3, 3e-3, 1e-2)
SEEDS = (0, 1, 2)


def _record(val: dict, test: dict) -> dict:
    """A quick-shaped record (GLA, selective and RoPE, trained at 32, tested at 32 and 64):
    val / test[position][lr] -> score, plus 0.01 * seed so that seeds differ."""
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
    config = {
        "quick": True,
        "models": ["gla"],
        "positions": ["selective", "rope"],
        "seeds": list(SEEDS),
        "lrs": {"gla": list(LRS)},
        "train_length": 32,
        "test_lengths": [64],
    }
    return {"config": config, "rows": rows}


def test_the_lr_is_chosen_on_validation_and_reported_on_test():
    # Validation prefers the middle lr; the test stream would prefer the highest. The claims
    # must report the middle lr's test numbers (choosing on test would give 0.99 - 0.5).
    record = _record(
        val={
            "selective": {1e-3: 0.7, 3e-3: 0.9, 1e-2: 0.8},
            "rope": {1e-3: 0.5, 3e-3: 0.52, 1e-2: 0.5},
        },
        test={
            "selective": {1e-3: 0.6, 3e-3: 0.8, 1e-2: 0.99},
            "rope": {1e-3: 0.5, 3e-3: 0.5, 1e-2: 0.5},
        },
    )
    chosen = experiment.choices(record)
    assert {k: sel.point["lr"] for k, sel in chosen.items()} == {
        ("gla", "selective"): 3e-3,
        ("gla", "rope"): 3e-3,
    }
    claims = experiment.claims_from_results(record)
    assert [c.metric for c in claims] == [
        "gla: selective - rope, len32/last_quarter",
        "gla: selective - rope, len64/last_quarter",
    ]
    # Paired by seed, both arms carry the same 0.01 * seed: every difference is exactly 0.3.
    for claim in claims:
        assert claim.n == 3
        assert claim.interval.mean == pytest.approx(0.3, abs=1e-9)
    assert [c.margin for c in claims] == [0.25, 0.10]  # the quick margins
    assert experiment.edges(chosen) == [] and experiment.unfinished_edges(chosen) == []


def test_an_edge_choice_stops_the_run_unless_the_arm_learned_nothing():
    learned_on_edge = {1e-3: 0.6, 3e-3: 0.8, 1e-2: 0.9}
    chance_on_edge = {1e-3: 0.50, 3e-3: 0.51, 1e-2: 0.52}
    test = {p: dict.fromkeys(LRS, 0.5) for p in ("selective", "rope")}
    chosen = experiment.choices(
        _record(val={"selective": learned_on_edge, "rope": chance_on_edge}, test=test)
    )
    assert experiment.edges(chosen) == [
        "gla/selective: lr=0.01 (high)",
        "gla/rope: lr=0.01 (high) at chance (best validation mean 0.530)",  # 0.52 + 0.01 (seeds)
    ]
    assert experiment.unfinished_edges(chosen) == ["gla/selective: lr=0.01 (high)"]
    # An arm that learned (0.7 > CHANCE_CEILING) gets no pass for its edge.
    rope_learned = {1e-3: 0.5, 3e-3: 0.6, 1e-2: 0.7}
    chosen = experiment.choices(
        _record(val={"selective": learned_on_edge, "rope": rope_learned}, test=test)
    )
    assert len(experiment.unfinished_edges(chosen)) == 2


def test_validation_and_test_examples_come_from_different_streams(monkeypatch):
    seen = []

    def record_inputs(cfg, params, inputs_BT, targets_BT):
        seen.append(np.asarray(inputs_BT))
        return np.ones(inputs_BT.shape, bool)

    monkeypatch.setattr(sr, "_correct", record_inputs)
    config = sr_config.get_config("size=smoke")
    task = sr.make_task(config)
    for split in ("validation", "test", "validation"):
        sr.accuracy(None, None, task, num_examples=8, seed=0, split=split)
    validation, test, again = seen
    assert not np.array_equal(validation, test)
    np.testing.assert_array_equal(validation, again)  # a stream, not fresh randomness
    with pytest.raises(ConfigError, match="split='train'"):
        sr.accuracy(None, None, task, num_examples=8, seed=0, split="train")


def test_a_run_reports_validation_and_test_from_their_own_streams(monkeypatch, tmp_path):
    """`train_and_evaluate` scores the training length on the validation stream (what
    selection reads) and every length on the test stream (what is reported)."""
    calls = []

    def fake_evaluate(cfg, params, config, *, seed, split="test", lengths=None):
        calls.append((split, lengths))
        return {"len16/last_quarter": {"validation": 0.7, "test": 0.6}[split]}

    untrained = types.SimpleNamespace(state=types.SimpleNamespace(params=None))  # not trained
    monkeypatch.setattr(sr.train, "run", lambda *a, **k: untrained)
    monkeypatch.setattr(sr, "evaluate_lengths", fake_evaluate)
    config = sr_config.get_config("size=smoke,position=rope")
    out = sr.train_and_evaluate(config, str(tmp_path))
    assert calls == [("validation", [config.task.length]), ("test", None)]
    assert out["validation"] == {"len16/last_quarter": 0.7}
    assert out["test"] == {"len16/last_quarter": 0.6}


def test_every_arm_has_a_grid_to_choose_from_and_three_seeds():
    for s in (experiment.FULL, experiment.QUICK):
        assert len(s.seeds) >= 3
    assert all(len(grid) >= 3 for grid in experiment.FULL.lrs.values())  # an interior exists
    assert experiment.FULL.require_interior


COMMITTED = results.path("selective_rope", "full")


@pytest.mark.skipif(not os.path.exists(COMMITTED), reason="no committed full run yet")
def test_committed_full_run_rederives_its_claims_on_three_seeds():
    record = results.load("selective_rope", "full")
    assert record["config"]["quick"] is False
    assert len(record["code"]["git_commit"]) == 40 and record["code"]["git_dirty"] is False
    claims = experiment.claims_from_results(record)
    assert len(claims) == len(experiment.CLAIMS) and all(c.n == 3 for c in claims)
    # Every grid point of every arm was trained on every seed, and no arm that learned chose
    # an lr on its grid's edge.
    cfg = record["config"]
    for kind in cfg["models"]:
        for pos in cfg["positions"]:
            for lr in cfg["lrs"][kind]:
                rows = [
                    r
                    for r in record["rows"]
                    if (r["model"], r["position"], r["lr"]) == (kind, pos, lr)
                ]
                assert sorted(r["seed"] for r in rows) == cfg["seeds"]
    assert experiment.unfinished_edges(experiment.choices(record)) == []
