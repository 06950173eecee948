"""Cheap training probes of the `cpu` size, one change at a time (the README's table).

    python -m methods.vwf_dyslexia.probe tasks=shapes steps=300 lr=1e-3
    python -m methods.vwf_dyslexia.probe steps=1000 patch=8 merge=2

A bare AdamW loop (warm-up then cosine, global-norm clipping, as `core.train` sets it) on
fresh batches of the chosen tasks, logging the answer loss and the gradient norm reaching the
ViT, the merger and the decoder; at the end the held-out accuracy per task (`lesion.eval_set`,
`neval` examples each). Options (name=value): steps, lr, bs, tasks (comma-separated), patch,
merge (`core.nn.vlm` merger), warmup, neval, seed, clip, log, balance (1: each example's
answer tokens averaged first, so two-letter answers do not weigh double), old_background (1:
the images mapped back to background -1, ink 1, the layout before the fix), jitter (the letter
strings' size and place randomness, `stimuli.render_text`: 0 fixed, 1 full), eval_jitter
(-1: the training jitter), lexicon (the lexical-decision lexicon size; -1: the config's),
jitter_from, jitter_to, lexical_from (a `tasks.Curriculum`; jitter_to > 0 replaces jitter,
and lexical decision, if in tasks, joins at lexical_from), spell (1: the letter read-out
spells the whole string), lesions (1: the held-out accuracy also with whole decoder MLPs
silenced, each layer's and all of them: is the decoder MLP needed for a task at all?),
fonts ("wide": `stimuli.FONTS`,
twelve typefaces; "three": its first three, the training fonts until part 5),
vit_layers, layers, d_ff (the `cpu` size's ViT depth, decoder depth and SwiGLU width; -1: the
config's).
Held-out examples are from the "val" split (`tasks.SPLITS`): probes choose the recipe, and
the lesion evaluation's "eval" strings stay unseen by that choice. Letters are also scored
one answer token at a time (first, last).
"""

import functools
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from configs.vwf_dyslexia import get_config
from core.errors import ConfigError
from core.nn import vlm
from methods.vwf_dyslexia import (
    answer_logits,
    experiment,
    lesion,
    loss_fn,
    model_config,
    stimuli,
    task_accuracy,
    tasks,
)

DEFAULTS = dict(
    steps=300, lr=1e-3, bs=64, tasks=",".join(tasks.TASKS), patch=16, merge=1,
    warmup=30, neval=128, seed=0, clip=1.0, log=50, balance=0, old_background=0,
    jitter=1.0, eval_jitter=-1.0, lexicon=-1, jitter_from=0, jitter_to=0, lexical_from=0,
    spell=0, lesions=0, fonts="wide", vit_layers=-1, layers=-1, d_ff=-1,
)  # fmt: skip


def parse(argv) -> dict:
    opts = dict(DEFAULTS)
    for arg in argv:
        name, _, value = arg.partition("=")
        if name not in opts:
            raise ConfigError(f"unknown probe option {name!r}; expected any of {sorted(opts)}")
        opts[name] = type(DEFAULTS[name])(value)
    return opts


def balanced_loss(cfg, params, batch):
    logits_BTV = answer_logits(cfg, params, batch)
    log_probs_BTV = jax.nn.log_softmax(logits_BTV)
    nll_BT = -jnp.take_along_axis(log_probs_BTV, batch["targets"][..., None], -1)[..., 0]
    return ((nll_BT * batch["mask"]).sum(1) / batch["mask"].sum(1)).mean(), {}


def letter_token_accuracy(cfg, params, batch) -> dict:
    """The letter read-out's first and last answer tokens scored apart (a partial reader shows
    here while both-right stays near its prior)."""
    is_letters = np.asarray(batch["task"]) == tasks.TASKS.index("letters")
    sub = {k: v[is_letters] for k, v in batch.items()}
    predicted_BT = np.asarray(jnp.argmax(answer_logits(cfg, params, sub), -1))
    right_BT = predicted_BT == sub["targets"]
    first = np.argmax(sub["mask"], axis=1)
    last = first + sub["mask"].sum(1).astype(int) - 1
    rows = np.arange(len(first))
    return {
        "first": round(float(right_BT[rows, first].mean()), 3),
        "last": round(float(right_BT[rows, last].mean()), 3),
        "letter": round(float((right_BT * sub["mask"]).sum() / sub["mask"].sum()), 3),
    }


def main(opts: dict) -> dict:
    config = get_config("size=cpu")
    config.model.patch_size, config.model.merge = opts["patch"], opts["merge"]
    for field, option in (("vit_layers", "vit_layers"), ("num_layers", "layers"), ("d_ff", "d_ff")):
        if opts[option] > 0:
            config.model[field] = opts[option]
    cfg = model_config(config)
    names = opts["tasks"].split(",")
    spell = bool(opts["spell"])
    lexicon = config.data.lexicon_size if opts["lexicon"] < 0 else opts["lexicon"]
    strings = tasks.letter_strings("train", lexicon)
    eval_jitter = opts["jitter"] if opts["eval_jitter"] < 0 else opts["eval_jitter"]
    fonts = {"three": stimuli.FONTS[:3], "wide": stimuli.FONTS}[opts["fonts"]]
    held_out = lesion.eval_set(
        opts["neval"],
        123,
        lexicon_size=lexicon,
        fonts=fonts,
        task_names=names,
        split="val",
        jitter=eval_jitter,
        spell=spell,
    )

    def images(batch):
        return batch["image"] * 2 - 1 if opts["old_background"] else batch["image"]

    curriculum = tasks.Curriculum(1.0, opts["jitter_from"], opts["jitter_to"], opts["lexical_from"])

    def train_batch(step):
        jitter = curriculum.jitter_at(step) if opts["jitter_to"] else opts["jitter"]
        now = [t for t in names if t in curriculum.tasks(step)] or names
        first = step * opts["bs"]
        rngs = [np.random.default_rng([opts["seed"], first + j]) for j in range(opts["bs"])]
        batch = lesion.stack(
            [
                tasks.task_example(
                    r, now[int(r.integers(len(now)))], strings, fonts, jitter=jitter, spell=spell
                )
                for r in rngs
            ]
        )
        return {**batch, "image": images(batch)}

    warmup = min(opts["warmup"], opts["steps"] - 1)
    schedule = optax.warmup_cosine_decay_schedule(0, opts["lr"], warmup, opts["steps"])
    clip = optax.clip_by_global_norm(opts["clip"]) if opts["clip"] else optax.identity()
    tx = optax.chain(clip, optax.adamw(schedule, weight_decay=0.01))
    params = vlm.init_params(cfg, jax.random.key(opts["seed"]))
    opt_state = tx.init(params)
    loss = balanced_loss if opts["balance"] else loss_fn

    @jax.jit
    def step(params, opt_state, batch):
        (value, _), grads = jax.value_and_grad(functools.partial(loss, cfg), has_aux=True)(
            params, batch
        )
        updates, opt_state = tx.update(grads, opt_state, params)
        norms = {k: optax.global_norm(g) for k, g in grads.items()}
        return optax.apply_updates(params, updates), opt_state, value, norms

    start, losses = time.time(), []
    for i in range(opts["steps"]):
        params, opt_state, value, norms = step(params, opt_state, train_batch(i))
        losses.append(float(value))
        if (i + 1) % opts["log"] == 0:
            grad = " ".join(f"{k} {float(v):.3g}" for k, v in norms.items())
            rate = (i + 1) / (time.time() - start)
            print(f"{i + 1} loss {np.mean(losses[-opts['log'] :]):.3f} | grad {grad} | "
                  f"{rate:.2f} steps/s", flush=True)  # fmt: skip
    rate = opts["steps"] / (time.time() - start)
    scored = {**held_out, "image": images(held_out)}
    counts = task_accuracy(cfg, params, scored)
    accuracy = {k.split("/")[1]: round(float(r / n), 3) for k, (r, n) in counts.items() if n}
    if "letters" in names:
        accuracy |= letter_token_accuracy(cfg, params, scored)
    print("held-out accuracy", accuracy, f"| {rate:.2f} steps/s", flush=True)
    if "lexical" in names:  # reading in typefaces never trained on
        for font in stimuli.HELD_OUT_FONTS:
            unseen = lesion.eval_set(
                opts["neval"], 123, lexicon_size=lexicon, fonts=(font,), task_names=("lexical",),
                split="val", jitter=eval_jitter,
            )  # fmt: skip
            counts = task_accuracy(cfg, params, {**unseen, "image": images(unseen)})
            right, n = counts["accuracy/lexical"]
            accuracy[f"lexical {font}"] = round(float(right / n), 3)
        print("held-out fonts", {k: v for k, v in accuracy.items() if " " in k}, flush=True)
    if opts["lesions"]:
        accuracy["lesions"] = whole_mlp_lesions(cfg, params, scored)
    return accuracy


def whole_mlp_lesions(cfg, params, examples) -> dict:
    """Held-out accuracy per task with every gate unit of one decoder layer silenced (each
    layer in turn), and of all layers (`experiment.whole_layers`)."""
    selections = experiment.whole_layers(cfg.decoder.num_layers, cfg.decoder.d_ff)
    masks = lesion.unit_masks(np.stack(list(selections.values())))
    acc = lesion.accuracy(cfg, params, examples, masks, batch_size=128)
    out = {}
    for i, name in enumerate(selections):
        out[name] = {t: round(float(acc[t][i]), 3) for t in acc}
        print(name, out[name], flush=True)
    return out


if __name__ == "__main__":
    main(parse(sys.argv[1:]))
