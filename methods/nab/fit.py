"""One experiment unit: an INR fitted to one object's sinogram, or the classical methods on it,
scored for `methods/nab/experiment.py`.

    out = fit.train_and_evaluate(config, run_dir)  # psnr, ssim, val_snr_db, final_loss, image
    out = fit.classical(config)                    # {"fbp": {psnr, ssim}, "sart": {...}}

The selection criterion needs no ground truth: `heldout_views` measures the object at as many
further angles, halfway between the training views (with their own noise draw), and
`val_snr_db` is how well the fitted image predicts them: 10 log10(|y|^2 / |A x - y|^2) on those
views. Sparse-view artefacts (streaks, blur between views) are what it sees. The experiment
selects on it for development objects only; PSNR/SSIM against the ground truth are reported
for every fit (on a development object they are a diagnostic, never a selection input).

The experiment caches these values by config and by the hash of the files a fit depends on
(`FIT_SOURCES`: not experiment.py, report.py or bench.py, so editing a grid keeps every point
already fitted).
"""

import functools
import time

import jax
import numpy as np

from core import results, train
from methods import nab
from methods.nab import baselines, metrics, model, phantoms, projector

VALIDATION_NOISE = 1  # the held-out views' noise stream: default_rng((object_seed, 1))
FIT_SOURCES = results.run_sources("nab")  # core/, configs, methods/nab/ but the readers


def heldout_views(config) -> tuple[np.ndarray, np.ndarray]:
    """(sinogram [N, A], angles [A] in degrees) at `data.num_views` angles offset by half the
    angular step from the training views, measured like them but with another noise draw."""
    d = config.data
    truth_NN, _, _ = nab.problem(config)
    offset = 90.0 / d.num_views
    sino_DA = phantoms.measure(
        truth_NN,
        d.num_views,
        noise=float(d.noise),
        seed=(d.object_seed, VALIDATION_NOISE),
        oversample=d.oversample,
        offset=offset,
    )
    return sino_DA, projector.angles(d.num_views, start=offset, stop=180.0 + offset)


def heldout_snr_db(image_NN, sino_DA, angles_A) -> float:
    """10 log10(|y|^2 / |A x - y|^2) over the held-out views (higher is better)."""
    predicted_DA = np.asarray(projector.radon(image_NN, angles_A, num_detectors=sino_DA.shape[0]))
    residual = np.mean((predicted_DA.astype(np.float64) - sino_DA) ** 2)
    return float(10 * np.log10(np.mean(sino_DA.astype(np.float64) ** 2) / residual))


def train_and_evaluate(config, run_dir: str) -> dict:
    """Train one INR on one device; its image's quality, held-out-view score and final loss."""
    start = time.perf_counter()
    result = train.run(config, nab.make(config), run_dir, devices=jax.devices()[:1])
    cfg = nab.model_config(config)
    image_NN = np.asarray(
        jax.jit(functools.partial(model.render, cfg))(
            result.state.params, result.state.extra["frozen"]
        )
    )
    truth_NN, _, _ = nab.problem(config)
    losses = [row["loss"] for row in result.history if "loss" in row]
    return {
        **metrics.quality(image_NN, truth_NN),
        "val_snr_db": heldout_snr_db(image_NN, *heldout_views(config)),
        "final_loss": float(losses[-1]),
        "seconds": time.perf_counter() - start,
        "image": np.round(image_NN, 4).tolist(),  # for the figure; not in the results rows
    }


def classical(config) -> dict:
    """FBP and SART (scikit-image) on the object's measured sinogram, and the loss of an
    empty image (the data's mean square)."""
    truth_NN, sino_DA, angles_A = nab.problem(config)
    out = {"data": {"mean_square": float(np.mean(sino_DA.astype(np.float64) ** 2))}}
    for name, reconstruct in (("fbp", baselines.fbp), ("sart", baselines.sart)):
        image_NN = reconstruct(sino_DA, angles_A, config.model.size)
        out[name] = {**metrics.quality(image_NN, truth_NN), "image": np.round(image_NN, 4).tolist()}
    return out
