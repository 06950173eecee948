"""The two test-defined kinds of method (tests/kinds.py) do what they say, so that their passing
the generic tests (tests/test_configs.py, tests/core/test_precision.py, tests/aot, which take
them with the configs' entries) means the generic machinery takes an evaluate-only method and a
data-free one as they are: no dummy loss, step, dataset or batch."""

import jax
import numpy as np

from core import train
from tests import kinds
from tests.entries import BY_NAME, NAMES

RULE, REGRESSION = (BY_NAME[name] for name in ("threshold_rule", "self_sampled_regression"))


def test_the_kinds_are_entries_of_the_generic_tests():
    assert {"threshold_rule", "self_sampled_regression"} <= set(NAMES)
    rule = RULE.method(RULE.smoke_config())
    assert not rule.trains and rule.loss is None and rule.step is None
    regression = REGRESSION.method(REGRESSION.smoke_config())
    assert regression.trains and regression.dataset is None and regression.loss is None


def test_the_evaluate_only_rule_is_scored_on_every_example_once(tmp_path):
    """One evaluation, no step: the accuracy is the rule's on all 100 examples, padding (100
    rows in batches of 32) left out."""
    config = RULE.smoke_config(mesh="cpu")
    result = train.run(config, RULE.method(config), str(tmp_path))
    arrays = kinds.scored_set(config.examples)
    want = np.mean((arrays["x"] @ kinds.TARGET_W > 0) == (arrays["label"] > 0))
    assert 0.5 < want < 1  # a real score: not trivially all right or all wrong
    (row,) = result.history
    assert set(row) == {"step", "eval/accuracy"} and row["step"] == 0
    # Sums of 0/1 hits (exact in float32), then one division: equal up to its rounding.
    assert abs(row["eval/accuracy"] - want) < 1e-6
    assert int(result.state.step) == 0


def test_the_data_free_method_learns_from_its_own_samples(tmp_path):
    """The core calls its step with batch=None (the step refuses anything else) and
    `train.batch_size` is not read; its draws from the step's rng are enough to recover the
    target map."""
    config = REGRESSION.get_config("mesh=cpu")
    config.train.steps, config.train.batch_size = 100, 3  # 3 divides over no mesh: unread
    result = train.run(config, REGRESSION.method(config), str(tmp_path))
    losses = [row["loss"] for row in result.history if "loss" in row]
    assert len(losses) == 100 and losses[-1] < 1e-2 * losses[0]
    w = np.asarray(jax.device_get(result.state.params["w"]))
    # 100 Adam steps at lr 0.05 from zero on noiseless data: Adam's steps are ~lr in size, so
    # it ends within a step of the target (measured: 0.009 at most).
    np.testing.assert_allclose(w, kinds.TARGET_W, atol=0.05)
