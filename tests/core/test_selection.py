"""core.selection: picks on validation means, refuses test data, reports the grid's edges."""

import itertools

import pytest

from core.errors import ConfigError
from core.selection import ValidationScores, select

GRID = {"lr": (1e-4, 3e-4, 1e-3), "model": ("gcn", "sage")}


def scores_peaking_at(best_lr: float, best_model: str = "sage") -> ValidationScores:
    """Validation scores over 3 seeds, highest at (best_lr, best_model)."""
    by_point = {}
    for lr, model in itertools.product(*GRID.values()):
        base = 0.9 - 0.05 * abs(GRID["lr"].index(lr) - GRID["lr"].index(best_lr))
        base -= 0.02 * (model != best_model)
        by_point[(lr, model)] = {seed: base + 0.001 * seed for seed in range(3)}
    return ValidationScores(metric="val/auroc", by_point=by_point)


def test_picks_the_best_mean_and_sees_an_interior_choice():
    chosen = select(GRID, scores_peaking_at(3e-4))
    assert chosen.point == {"lr": 3e-4, "model": "sage"}
    assert chosen.edges == {"lr": None}  # a categorical axis has no edge
    assert not chosen.on_edge and chosen.n == 3
    chosen.require_interior()  # does not raise
    assert select(GRID, scores_peaking_at(3e-4), rule="min").point == {"lr": 1e-4, "model": "gcn"}


def test_a_choice_on_the_edge_is_an_unfinished_grid():
    chosen = select(GRID, scores_peaking_at(1e-3))
    assert chosen.point["lr"] == 1e-3 and chosen.edges == {"lr": "high"}
    with pytest.raises(ConfigError, match="lr=0.001 is the grid's highest value") as info:
        chosen.require_interior()
    assert "\n" not in str(info.value)
    assert select(GRID, scores_peaking_at(1e-4)).edges == {"lr": "low"}


def test_test_data_cannot_be_passed_in():
    by_point = scores_peaking_at(3e-4).by_point
    with pytest.raises(ConfigError, match="validation split only; got split='test'"):
        ValidationScores(metric="auroc", by_point=by_point, split="test")
    for metric in ("test_auroc", "eval/test/auroc", "TEST-acc"):
        with pytest.raises(ConfigError, match="names the test split"):
            ValidationScores(metric=metric, by_point=by_point)
    ValidationScores(metric="val/attestation_rate", by_point=by_point)  # "test" inside a word
    with pytest.raises(ConfigError, match="takes ValidationScores, not dict"):
        select(GRID, by_point)


def test_incomplete_grids_and_unpaired_seeds_are_refused():
    by_point = dict(scores_peaking_at(3e-4).by_point)
    del by_point[(1e-3, "gcn")]
    with pytest.raises(ConfigError, match=r"without scores \[\(0.001, 'gcn'\)\]"):
        select(GRID, ValidationScores("val/auroc", by_point))
    by_point[(1e-3, "gcn")] = {0: 0.5, 1: 0.5}  # seeds 0-1 where the others have 0-2
    with pytest.raises(ConfigError, match="same seeds"):
        select(GRID, ValidationScores("val/auroc", by_point))
    with pytest.raises(ConfigError, match="rule='best'"):
        select(GRID, scores_peaking_at(3e-4), rule="best")
