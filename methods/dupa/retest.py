"""One run of the re-test (issue 47; `experiment_v2.py` holds its grid and claims): train one
config, then evaluate its final weights on the validation split (what the learning rate is chosen
on) and on the test split (what the claims read).

    metrics = run(config, run_dir)   # {"validation/fd", "test/fd", "test/log_fd", ...}

- FD-digits, conditional accuracy and the linear probe of the EMA weights (`evaluation.Evaluator`,
  the first two studies' evaluation: config.eval's CFG and sampler, `exp.samples` samples);
  "<split>/log_fd" = log FD, so paired differences are relative effects (the paper's ~10 %).
- The gate's numbers (`collapse_check.measure_draws`) of the trained `params` (what the alignment
  loss trains) on every image of the split, with the re-test's alignment options (the config's
  align_*): "<split>/align_gap", "<split>/align_same", "<split>/align_cross". Arms that do not
  align get them too, as a reference: how distinguishable the tokens are without the loss.
- "validation/velocity_loss": the held-out velocity MSE of the EMA weights at the end.
"""

import math
import time

import jax
import jax.numpy as jnp
from ml_collections import ConfigDict

from core import digits, train
from methods.dupa import align_name, collapse_check, evaluation, make, model_config

SPLITS = ("validation", "test")


def split_metrics(config, params, ema_params, clf, splits, split: str) -> dict:
    """FD, log FD, conditional accuracy, probe and the gate's numbers on one split."""
    eval_config = ConfigDict({**config.eval.to_dict(), "split": split})
    eval_config.num_samples = config.exp.samples
    cfg, name = model_config(config), align_name(config)
    metrics = evaluation.Evaluator(cfg, eval_config, clf, splits, name)(ema_params)
    metrics["log_fd"] = math.log(metrics["fd"])
    real = evaluation.split_of(splits, split)
    images, labels = jnp.asarray(real.images), jnp.asarray(real.labels)
    tokens = collapse_check.measure_draws(config, params, images, labels)
    metrics["align_gap"] = tokens["gap"]
    metrics["align_same"] = tokens["aligned"]["same"]
    metrics["align_cross"] = tokens["aligned"]["cross"]
    return {f"{split}/{k}": float(v) for k, v in metrics.items()}


def run(config, run_dir: str) -> dict:
    """Trains `config` in `run_dir` (one device; the runner's cache keys it), then its metrics on
    both splits (module docstring) and the wall time."""
    start = time.perf_counter()
    # One device: the tests' 8 fake CPU devices would split each small batch 8 ways.
    result = train.run(config, make(config), run_dir, devices=jax.devices()[:1])
    trained = time.perf_counter() - start
    held_out = [row for row in result.history if "eval/velocity_loss" in row]
    clf, splits = digits.classifier(config.eval.classifier_cache), digits.load_splits()
    state = result.state
    out = {"validation/velocity_loss": float(held_out[-1]["eval/velocity_loss"])}
    for split in SPLITS:
        out |= split_metrics(config, state.params, state.extra["ema"]["net"], clf, splits, split)
    return {**out, "train_seconds": trained, "seconds": time.perf_counter() - start}
