"""Q&C (paper 17): post-training quantisation meets feature caching in a diffusion transformer,
with TAP calibration and variance compensation. Nothing of the method is trained: it transforms
a trained model.

`make(config) -> core.Method` for either stage (`config.quant_cache.stage`):

    train      a class-conditional DDPM DiT on scikit-learn digits (`core.nn.dit`, plain DiT:
               no decoder blocks), eps-prediction MSE at a uniform step of the T-step chain
               (`core.diffusion.ddpm_noised`); held-out eps MSE as the eval stream
    transform  an evaluate-only run over `train.init_from` (needs_init_from=True): every
               setting in `quant_cache.settings` (`settings.py`: fp, w4a8, c2, w4a8+c2+tap+vc,
               ...) sampled and scored with FD-digits (`pipeline.py`)

The model reads time as t / T (DDPM step index over the chain length) so `core.nn.dit`'s
time_scale of 1000 spans DiT's usual integer-step frequencies.
"""

import functools

import jax.numpy as jnp

from core import data, diffusion, digits
from core.errors import ConfigError
from core.method import Method
from core.nn import dit, dit_config
from core.precision import compute_dtype


def model_config(config) -> dit.DiTConfig:
    return dit_config.from_fields(
        config.model,
        image_size=8,
        channels=1,
        num_classes=digits.NUM_CLASSES,
        dtype=compute_dtype(config.dtype),
    )


def schedule(config) -> diffusion.DDPMSchedule:
    d = config.ddpm
    return diffusion.ddpm_schedule(d.num_steps, d.beta_start, d.beta_end)


def model_time(t_B, num_steps: int):
    """The DDPM step index as the model's time input, t / T in [0, 1)."""
    return t_B.astype(jnp.float32) / num_steps


def init(cfg, rng, batch_spec):
    del batch_spec
    return {"params": dit.init_params(cfg, rng)}


def eps_error_B(cfg, sched, params, batch, rng):
    """Per-example eps-prediction MSE at a uniform step of the chain."""
    x_t, t_B, eps = diffusion.ddpm_noised(rng, batch["image"], sched)
    pred, _ = dit.apply(cfg, params, x_t, model_time(t_B, sched.num_steps), batch["label"])
    return jnp.mean((pred - eps) ** 2, axis=(1, 2, 3))


def loss(cfg, sched, params, batch, *, rng, extra):
    del extra
    return jnp.mean(eps_error_B(cfg, sched, params, batch, rng)), {}


def eval_step(cfg, sched, state, batch, *, rng):
    err_B = eps_error_B(cfg, sched, state.params, batch, rng)
    mask = batch["mask"].astype(jnp.float32)
    return {"eps_loss": (jnp.sum(err_B * mask), jnp.sum(mask))}


def check(config) -> None:
    stage = config.quant_cache.stage
    if stage not in ("train", "transform"):
        raise ConfigError(f"quant_cache.stage={stage!r}; expected train or transform")


def make(config) -> Method:
    check(config)
    cfg, sched = model_config(config), schedule(config)
    if config.quant_cache.stage == "transform":
        from methods.quant_cache import pipeline, settings  # the transform's evaluator

        settings.parse_list(config.quant_cache.settings)  # a bad name: one line, now

        return Method(
            init=functools.partial(init, cfg),
            evaluate=pipeline.evaluator(config, cfg, sched),
            needs_init_from=True,
        )
    splits = digits.load_splits()
    batch = config.train.batch_size

    def dataset(which, *, shard, seed):
        if which == "eval":
            arrays = {"image": splits.validation.images, "label": splits.validation.labels}
            return data.one_pass(arrays, global_batch=batch, shard=shard)
        arrays = {"image": splits.train.images, "label": splits.train.labels}
        return data.in_memory(arrays, global_batch=batch, seed=seed, shard=shard)

    return Method(
        init=functools.partial(init, cfg),
        loss=functools.partial(loss, cfg, sched),
        dataset=dataset,
        eval_step=functools.partial(eval_step, cfg, sched),
    )
