"""Inducing dyslexia in a vision-language model (paper 6 of PAPERS.md; issue 23).

- `stimuli.py`: real words (PyPI english-words), bigram-chain pseudowords with dictionary
  exclusion, Pillow rendering in matplotlib's fonts, the localiser categories (words,
  scrambled words, line faces, line objects), a shape-comparison task and sentence-picture
  matching; grey 32 x 128 images in [0, 1] (background 0), deterministic per seed.
- `tasks.py`: the training tasks (lexical decision, letter read-out, shape comparison,
  sentence-picture matching; the re-test's diet "v2" adds a task on faces, one on line objects
  and one on scrambled strings) as token text after the image; train / val / eval split of
  letter strings by hash.
- here: `make(config) -> Method` for `core.train`: the shared `core.nn.vlm` (ViT -> linear
  merger -> decoder LM) trained on the diet's tasks at once, loss on the answer tokens only;
  `eval_step` gives the answer accuracy per task on held-out letter strings.
- `localiser.py`, `lesion.py`, `official_hook.py`, `experiment.py` (the first study),
  `experiment_v2.py` with `retest.py` (the re-test of issue 47): README.

    python -m launch.train --config=configs/vwf_dyslexia.py:size=cpu --workdir=/tmp/vwf
"""

import functools

import jax
import jax.numpy as jnp

from core import data
from core.errors import ConfigError
from core.method import Method
from core.nn import transformer, vlm
from core.precision import compute_dtype
from methods.vwf_dyslexia import stimuli, tasks

EVAL_SEED_OFFSET = 1_000_003  # held-out examples come from a seed stream training never uses


def diet_of(config) -> str:
    """config.data.diet (a run folder's config written before the re-test has none: "v1")."""
    return config.data.get("diet", "v1")


def model_config(config) -> vlm.VLMConfig:
    return vlm.from_fields(
        config.model,
        image_height=stimuli.HEIGHT,
        image_width=stimuli.WIDTH,
        channels=1,
        vocab_size=tasks.vocab_size(diet_of(config)),
        text_len=tasks.TEXT_LEN,
        dtype=compute_dtype(config.dtype),
    )


def answer_logits(cfg: vlm.VLMConfig, params, batch, gate_mask_LF=None):
    """Logits at the text positions [B, TEXT_LEN, V] (the image positions predict nothing)."""
    out = vlm.apply(cfg, params, batch["image"], batch["inputs"], gate_mask_LF=gate_mask_LF)
    return out.logits_BTV[:, cfg.num_image_tokens :]


def loss_fn(cfg, params, batch, *, rng=None, extra=None):
    """Cross-entropy on the answer tokens, averaged over them, and their token accuracy."""
    del rng, extra
    logits_BTV = answer_logits(cfg, params, batch)
    mask_BT = batch["mask"]
    log_probs_BTV = jax.nn.log_softmax(logits_BTV)
    nll_BT = -jnp.take_along_axis(log_probs_BTV, batch["targets"][..., None], -1)[..., 0]
    denom = jnp.maximum(mask_BT.sum(), 1.0)
    correct_BT = jnp.argmax(logits_BTV, -1) == batch["targets"]
    return (nll_BT * mask_BT).sum() / denom, {"accuracy": (correct_BT * mask_BT).sum() / denom}


def task_accuracy(cfg, params, batch, gate_mask_LF=None, task_names=tasks.ALL_TASKS) -> dict:
    """{"accuracy/<task>": (examples with every answer token right, examples)} per task."""
    return answer_counts(answer_logits(cfg, params, batch, gate_mask_LF), batch, task_names)


def answer_counts(logits_BTV, batch, task_names=tasks.ALL_TASKS) -> dict:
    """`task_accuracy` from the text positions' logits [B, TEXT_LEN, V], however computed
    (`official_hook` computes them position by position)."""
    wrong_BT = (jnp.argmax(logits_BTV, -1) != batch["targets"]) & (batch["mask"] > 0)
    right_B = ~jnp.any(wrong_BT, axis=1)
    weight_B = batch.get("valid", jnp.ones_like(right_B, jnp.float32))
    out = {}
    for task in task_names:
        in_task_B = (batch["task"] == tasks.ALL_TASKS.index(task)) * weight_B
        out[f"accuracy/{task}"] = (jnp.sum(right_B * in_task_B), jnp.sum(in_task_B))
    return out


def curriculum_of(config) -> tasks.Curriculum:
    """The training stream's `tasks.Curriculum` (config.data)."""
    d = config.data
    return tasks.Curriculum(
        d.jitter, d.jitter_from, d.jitter_to, d.lexical_from, d.spell, diet=diet_of(config)
    )


def make(config) -> Method:
    cfg = model_config(config)
    batch_size = config.train.batch_size

    def init(rng, batch_spec):
        del batch_spec
        return {"params": vlm.init_params(cfg, rng)}

    curriculum = curriculum_of(config)
    diet_tasks = tuple(tasks.DIETS[curriculum.diet])

    def eval_step(state, batch, *, rng):
        del rng
        return task_accuracy(cfg, state.params, batch, task_names=diet_tasks)

    num_eval = config.eval.num_examples
    if num_eval <= 0 or num_eval % batch_size:
        raise ConfigError(
            f"eval.num_examples={num_eval} must be a positive multiple of train.batch_size="
            f"{batch_size} (the evaluation reads whole batches of the held-out stream)"
        )

    def dataset(split, *, shard, seed):
        # core.train's evaluation picks the recipe: "val" strings, never the lesions' "eval"
        strings = tasks.letter_strings(
            "val" if split == "eval" else "train", config.data.lexicon_size
        )
        if split == "eval":
            example = functools.partial(tasks.eval_example, strings=strings, curriculum=curriculum)
            return data.synthetic(
                example,
                global_batch=batch_size,
                seed=seed + EVAL_SEED_OFFSET,
                shard=shard,
                num_batches=num_eval // batch_size,
            )
        return data.synthetic(
            functools.partial(tasks.curriculum_example, strings=strings, curriculum=curriculum),
            global_batch=batch_size,
            seed=seed,
            shard=shard,
            indexed=True,
        )

    return Method(
        init=init,
        loss=functools.partial(loss_fn, cfg),
        dataset=dataset,
        eval_step=eval_step,
        sharding_rules=transformer.SHARDING_RULES,
    )
