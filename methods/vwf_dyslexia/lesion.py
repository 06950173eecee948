"""Lesions: per-task accuracy of the VLM under many unit masks, in one compiled function.

A mask is a float [L, F] multiplied into every decoder MLP gate pre-activation along the unit
axis (`core.nn.vlm`, `gate_mask_LF`): 1 keeps a unit, 0 silences it (SiLU(0) * up = 0), any
other s scales it (the scale sweep). `accuracy` evaluates M masks [M, L, F] at once: the
per-task count of examples answered exactly right is `jax.vmap`ped over the masks inside one
jitted function, so the M lesioned models share each batch's dispatch and one compilation per
(M, batch) shape; `accuracy(..., chunk=1)` is the Python loop over masks the benchmark compares
it with (the same compiled function at M = 1).

Evaluation sets (`eval_set`) hold `n` examples of each task, drawn from the held-out letter
strings (`tasks.letter_strings("eval")`, "val" to choose a recipe) and a seed of their own.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from methods.vwf_dyslexia import stimuli, task_accuracy, tasks


def eval_set(
    n_per_task: int,
    seed: int,
    *,
    lexicon_size: int,
    fonts=stimuli.FONTS,
    task_names=tasks.TASKS,
    split: str = "eval",
    jitter: float = 1.0,
    spell: bool = False,
) -> dict:
    """{"image", "inputs", "targets", "mask", "task"}: n_per_task examples of each task in
    `task_names`, task by task, from held-out letter strings (`split` "eval", or "val" for
    choosing a recipe). lexicon_size: the trained model's (config.data.lexicon_size), so
    lexical decision asks about the words it was taught (0: unseen real words). jitter,
    spell: as the model was trained (`tasks.task_example`)."""
    strings = tasks.letter_strings(split, lexicon_size)
    examples = []
    for task in task_names:
        rng = np.random.default_rng([seed, tasks.ALL_TASKS.index(task)])
        examples += [
            tasks.task_example(rng, task, strings, fonts, jitter, spell) for _ in range(n_per_task)
        ]
    return stack(examples)


def stack(examples: list[dict]) -> dict:
    return {k: np.stack([e[k] for e in examples]) for k in examples[0]}


def batches(examples: dict, batch_size: int):
    """Whole batches of `examples` in order, the last padded with rows of "valid" 0 (one
    compiled shape; padding never counts)."""
    n = len(examples["task"])
    for start in range(0, n, batch_size):
        batch = {k: v[start : start + batch_size] for k, v in examples.items()}
        batch["valid"] = np.ones(len(batch["task"]), np.float32)
        pad = batch_size - len(batch["task"])
        yield {
            k: np.concatenate([v, np.zeros((pad, *v.shape[1:]), v.dtype)]) for k, v in batch.items()
        }


def unit_masks(selected_MLF, value: float = 0.0) -> np.ndarray:
    """float32 [M, L, F] (or [L, F]): `value` on the selected units, 1 elsewhere."""
    return np.where(np.asarray(selected_MLF, bool), np.float32(value), np.float32(1.0))


@functools.partial(jax.jit, static_argnums=0)
def _right_counts(cfg, params, batch, masks_MLF):
    """[M, tasks, 2]: (exactly right, examples) per mask and task on one batch."""

    def one(mask_LF):
        counts = task_accuracy(cfg, params, batch, mask_LF)
        return jnp.stack([jnp.stack(counts[f"accuracy/{t}"]) for t in tasks.ALL_TASKS])

    return jax.vmap(one)(masks_MLF)


def accuracy(cfg, params, examples: dict, masks_MLF, *, batch_size=256, chunk=None) -> dict:
    """{task: float [M]}: the fraction of each task's examples answered exactly right under
    each of the M masks. Batches are whole (the last one padded with weight 0); `chunk` masks
    go through the compiled function at a time (default all M at once)."""
    num_masks = len(masks_MLF)
    chunk = chunk or num_masks
    # Padded with intact masks to whole chunks: one compiled shape for every chunk.
    pad = -num_masks % chunk
    masks_MLF = np.concatenate([masks_MLF, np.ones((pad, *masks_MLF.shape[1:]))])
    masks_MLF = jnp.asarray(masks_MLF, jnp.float32)
    totals = np.zeros((num_masks + pad, len(tasks.ALL_TASKS), 2))
    for batch in batches(examples, batch_size):
        for m in range(0, num_masks, chunk):
            counts = _right_counts(cfg, params, batch, masks_MLF[m : m + chunk])
            totals[m : m + chunk] += np.asarray(counts)
    out = {}
    for i, task in enumerate(tasks.ALL_TASKS):
        if totals[0, i, 1] > 0:
            out[task] = totals[:num_masks, i, 0] / totals[:num_masks, i, 1]
    return out
