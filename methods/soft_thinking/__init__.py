"""Stochastic Soft Thinking (paper 2): soft, Dirichlet and Gumbel decoding through the shared
sampler (`decode.py`), the JS probes (`probes.py`), and the task model, trained through
`core.train`.

`make(config)` returns the `core.Method` that trains the small decoder of the experiment on the
shuffled modular sum (`task.py`): masked next-token cross-entropy on the completion after "=".
The decoding rules (greedy, sampling, soft, Dirichlet, Gumbel) are in `decode.py`, the probes
in `probes.py` and `evaluation.py`, the experiment in `experiment.py`.

    cfg = model_config(config)                     # a core.nn TransformerConfig
    params = transformer.init_params(cfg, rng)
    loss, metrics = loss_fn(cfg, params, batch)

The core LM's output projection is untied from its input embedding; soft thinking feeds the
probability-weighted sum of rows of the INPUT embedding matrix.
"""

import functools

import jax.numpy as jnp
import numpy as np

from core import data
from core.errors import ConfigError
from core.method import Method
from core.nn import transformer
from core.precision import compute_dtype
from methods.soft_thinking.task import ShuffledSum

EVAL_SEED = 0  # the validation prompts of the core's teacher-forced evaluation


def make_task(config) -> ShuffledSum:
    try:
        return ShuffledSum(**config.task.to_dict())
    except (TypeError, ValueError) as e:
        raise ConfigError(f"task: {e}") from None


def model_config(config) -> transformer.TransformerConfig:
    task, m = make_task(config), config.model
    try:
        return transformer.TransformerConfig(
            vocab_size=task.vocab_size,
            num_layers=m.num_layers,
            d_model=m.d_model,
            num_heads=m.num_heads,
            d_ff=m.d_ff,
            # Room for decoding past the completion (a scratchpad that runs long).
            max_len=task.seq_len + 8,
            position=m.position,
            dtype=compute_dtype(config.dtype),
        )
    except ValueError as e:
        raise ConfigError(f"model: {e}") from None


# The LM's masked next-token cross-entropy (`core.nn.transformer.next_token_loss`).
loss_fn = transformer.next_token_loss


def eval_step(cfg, state, batch, *, rng) -> dict:
    """Teacher-forced validation metrics as (sum, weight): token accuracy on the completion
    and the fraction of sequences with every completion token right."""
    del rng
    logits_BTV, _ = transformer.apply(cfg, state.params, batch["inputs"])
    real_B = batch["mask"]  # one_pass's padding rows
    target_BT = (batch["target_mask"] > 0) & real_B[:, None]
    correct_BT = jnp.argmax(logits_BTV, -1) == batch["targets"]
    return {
        "token_accuracy": (jnp.sum(correct_BT & target_BT), jnp.sum(target_BT)),
        "sequence_accuracy": (
            jnp.sum(jnp.all(correct_BT | ~target_BT, axis=1) & real_B),
            jnp.sum(real_B),
        ),
    }


def validation_sequences(task: ShuffledSum, n: int) -> dict[str, np.ndarray]:
    """n validation prompts, each with one random valid scratchpad (fixed seed)."""
    terms = task.prompts("validation", n, EVAL_SEED)
    batch = task.batch_from(terms, np.random.default_rng(EVAL_SEED))
    return {
        "inputs": batch["inputs"],
        "targets": batch["targets"],
        "target_mask": batch["mask"],
    }


def make(config) -> Method:
    cfg = model_config(config)
    task = make_task(config)
    batch_size = config.train.batch_size

    def init(rng, batch_spec):
        del batch_spec
        return {"params": transformer.init_params(cfg, rng)}

    def dataset(split, *, shard, seed):
        if split == "eval":
            arrays = validation_sequences(task, config.eval.num_validation)
            return data.one_pass(arrays, global_batch=batch_size, shard=shard)
        return data.synthetic(
            examples_fn=task.examples, global_batch=batch_size, seed=seed, shard=shard
        )

    return Method(
        init=init,
        loss=functools.partial(loss_fn, cfg),
        dataset=dataset,
        eval_step=functools.partial(eval_step, cfg),
        sharding_rules=transformer.SHARDING_RULES,
    )
