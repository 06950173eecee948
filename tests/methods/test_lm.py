"""The LM baseline: its loss is the masked cross-entropy, and its experiment's claims hold."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import lm
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


def test_quick_experiment_claims_hold(tmp_path):
    report = experiment.run(str(tmp_path), quick=True)
    failed = [c.to_dict() for c in report.claims if not c.holds]
    assert not failed, failed
    assert {c.metric.split("/")[0] for c in report.claims} == {"copy", "mqar", "modular", "parity"}
