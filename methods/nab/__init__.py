"""NAB (paper 3): Neural Adaptive Binning for sparse-view CT reconstruction.

Per-object fitting: an implicit neural representation (coordinates -> encoding -> MLP) is
trained so that the projections of the image it represents match a measured sparse-view
sinogram; no training data beyond that one measurement.

- `projector.py`: parallel-beam projector in JAX (`radon`, its exact adjoint `backproject`,
  `angles`), skimage's geometry, jittable and differentiable.
- `phantoms.py`: industrial (rotated rectangles), curved and Shepp-Logan test images, and
  `measure`: their sparse-view sinograms without the inverse crime, with Gaussian noise.
- `model.py`: the NAB and random-Fourier-feature encodings and the MLP (`render`).
- `baselines.py`: FBP and SART (scikit-image); `metrics.py`: PSNR and SSIM.

`make(config)` returns a `core.Method` whose batches are the measured views (all of them every
step) and whose loss is the mean squared sinogram residual:

    truth_NN, sino_DA, angles_A = problem(config)
    cfg = model_config(config)
    params, frozen = model.init_params(cfg, rng)
    loss, metrics = loss_fn(cfg, params, batch, extra={"frozen": frozen})
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from core import data, optim, precision, steps
from core.errors import ConfigError
from core.method import Method
from methods.nab import metrics as metrics_lib
from methods.nab import model, phantoms, projector


def model_config(config) -> model.ModelConfig:
    m = config.model
    try:
        return model.ModelConfig(
            size=m.size,
            encoding=m.encoding,
            num_features=m.num_features,
            hidden=m.hidden,
            depth=m.depth,
            steepness=tuple(float(s) for s in m.steepness),
            rff_sigma=float(m.rff_sigma),
            frozen=tuple(m.frozen),
            anneal=tuple(float(a) for a in m.anneal),
            theta_init=m.theta_init,
            mlp_init=m.mlp_init,
            impl=m.impl,
        )
    except ValueError as e:
        raise ConfigError(f"model: {e}") from None


@functools.lru_cache(maxsize=8)
def _problem(phantom: str, size: int, object_seed: int, views: int, noise: float, oversample: int):
    if phantom not in phantoms.PHANTOMS:
        raise ConfigError(f"data.phantom={phantom!r}; expected one of {list(phantoms.PHANTOMS)}")
    if views < 1:
        raise ConfigError(f"data.num_views must be >= 1, got {views}")
    truth_NN = phantoms.PHANTOMS[phantom](size, object_seed)
    sino_DA = phantoms.measure(
        truth_NN, views, noise=noise, seed=object_seed, oversample=oversample
    )
    return truth_NN, sino_DA, projector.angles(views)


def problem(config) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ground truth [N, N], measured sinogram [N, A], view angles [A] in degrees) of `config`."""
    d = config.data
    return _problem(
        d.phantom, config.model.size, d.object_seed, d.num_views, float(d.noise), d.oversample
    )


def loss_fn(cfg, params, batch, *, rng=None, extra=None):
    """Mean squared residual of the batch's views: (A render - y)^2 over detector bins."""
    del rng
    image_NN = model.render(cfg, params, extra["frozen"], extra.get("k_scale", 1.0))
    proj_DB = projector.radon(image_NN, batch["angle"], num_detectors=batch["proj"].shape[1])
    residual_BD = proj_DB.T - batch["proj"]
    return jnp.mean(residual_BD**2), {}


def make(config) -> Method:
    precision.compute_dtype(
        config.dtype,
        ("float32",),
        "bfloat16 not implemented: the INR fit and its Pallas encoding kernel are float32",
    )
    cfg = model_config(config)
    truth_NN, sino_DA, angles_A = problem(config)
    if config.train.batch_size != len(angles_A):
        raise ConfigError(
            f"train.batch_size={config.train.batch_size} must equal data.num_views="
            f"{len(angles_A)}: every step fits all views (full batch)"
        )

    def init(rng, batch_spec):
        del batch_spec
        params, frozen = model.init_params(cfg, rng)
        return {"params": params, "frozen": frozen}

    def dataset(split, *, shard, seed):
        del split, seed  # one fixed measurement, in view order
        views = {"angle": angles_A, "proj": np.ascontiguousarray(sino_DA.T)}
        return data.in_memory(views, global_batch=len(angles_A), seed=0, shard=shard, shuffle=False)

    def evaluate(state, *, seed):
        del seed
        image_NN = jax.jit(functools.partial(model.render, cfg))(
            state.params, state.extra["frozen"]
        )
        return metrics_lib.quality(np.asarray(image_NN), truth_NN)

    loss = functools.partial(loss_fn, cfg)
    tx = step = None
    k_scale = model.steepness_schedule(cfg, config.train.steps)
    if k_scale is not None:  # the loss sees extra["k_scale"] = k_scale(step)
        tx = optim.make(config.optim, config.train.steps)
        step = steps.with_schedules(steps.gradient_step(loss, tx), {"k_scale": k_scale})
    return Method(init=init, loss=loss, step=step, tx=tx, dataset=dataset, evaluate=evaluate)
