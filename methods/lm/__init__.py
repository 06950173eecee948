"""The baseline decoder-only LM on synthetic sequence tasks (copy, MQAR, parity, arithmetic).

`make(config)` returns a `core.Method`; the pure functions below are usable on their own:

    cfg = model_config(config)
    params = transformer.init_params(cfg, rng)
    loss, metrics = loss_fn(cfg, params, batch)
"""

import functools

import jax.numpy as jnp

from core import data, tasks
from core.errors import ConfigError
from core.method import Method
from core.nn import transformer
from core.precision import compute_dtype

EVAL_SEED_OFFSET = 1_000_003  # held-out examples come from a seed stream training never uses


def model_config(config) -> transformer.TransformerConfig:
    task = make_task(config)
    m = config.model
    return transformer.TransformerConfig(
        vocab_size=task.vocab_size,
        num_layers=m.num_layers,
        d_model=m.d_model,
        num_heads=m.num_heads,
        d_ff=m.d_ff,
        max_len=max(m.max_len, task.seq_len),
        position=m.position,
        rope_base=m.rope_base,
        dtype=compute_dtype(config.dtype),
    )


def make_task(config):
    options = {k: v for k, v in config.task.items() if k != "name"}
    try:
        return tasks.make_task(config.task.name, **options)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"task: {e}") from None


# The LM's masked next-token cross-entropy (`core.nn.transformer.next_token_loss`).
loss_fn = transformer.next_token_loss


def eval_step(cfg, state, batch, *, rng) -> dict:
    """Held-out metrics with teacher forcing, as (sum, weight) pairs over one batch for the
    core's evaluation on the mesh: token accuracy over masked positions, exact match of whole
    sequences, and accuracy at each sequence's last masked position (for prefix parity, the
    parity of the whole sequence)."""
    del rng
    logits_BTV, _ = transformer.apply(cfg, state.params, batch["inputs"])
    correct_BT = jnp.argmax(logits_BTV, -1) == batch["targets"]
    mask_BT = batch["mask"] > 0
    B, T = mask_BT.shape
    last_B = T - 1 - jnp.argmax(mask_BT[:, ::-1], axis=1)
    sequences = jnp.float32(B)
    return {
        "accuracy": (jnp.sum(correct_BT & mask_BT), jnp.sum(mask_BT)),
        "exact_match": (jnp.sum(jnp.all(correct_BT | ~mask_BT, axis=1)), sequences),
        "final_accuracy": (jnp.sum(correct_BT[jnp.arange(B), last_B]), sequences),
    }


def make(config) -> Method:
    cfg = model_config(config)
    task = make_task(config)
    num_eval, batch_size = config.eval.num_examples, config.train.batch_size

    def init(rng, batch_spec):
        del batch_spec
        return {"params": transformer.init_params(cfg, rng)}

    def dataset(split, *, shard, seed):
        if split == "eval":  # the held-out stream (another seed), a fixed number of batches
            if num_eval % batch_size:
                raise ConfigError(
                    f"eval.num_examples={num_eval} must be a multiple of train.batch_size="
                    f"{batch_size} (the evaluation reads whole batches of the held-out stream)"
                )
            return data.synthetic(
                task.example,
                global_batch=batch_size,
                seed=seed + EVAL_SEED_OFFSET,
                shard=shard,
                num_batches=num_eval // batch_size,
            )
        return data.synthetic(task.example, global_batch=batch_size, seed=seed, shard=shard)

    return Method(
        init=init,
        loss=functools.partial(loss_fn, cfg),
        dataset=dataset,
        eval_step=functools.partial(eval_step, cfg),
        sharding_rules=transformer.SHARDING_RULES,
    )
