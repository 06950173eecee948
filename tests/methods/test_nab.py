"""NAB (paper 3): the coordinate frame, the encodings, frozen ablations, the sinogram loss, the
metrics and the classical baselines."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import nab as nab_config
from core import train
from core.errors import ConfigError
from core.kernels import binned_encoding
from methods import nab
from methods.nab import baselines, metrics, model, phantoms, projector
from tests.methods.mesh_check import losses_on_mesh

KEY = jax.random.PRNGKey(0)


def _small(**changes):
    base = dict(size=32, num_features=16, hidden=16, depth=2)
    return model.ModelConfig(**{**base, **changes})


def test_pixel_coords_share_the_phantoms_frame():
    """Pixel (row, col) sits at ((col - n//2) / (n//2), (row - n//2) / (n//2)): x along columns,
    y along rows, origin on the projector's rotation axis. A transposed or flipped frame would
    put a bin's bump at the mirrored pixel."""
    n = 32
    coords = model.pixel_coords(n).reshape(n, n, 2)
    np.testing.assert_allclose(coords[n // 2, n // 2], [0.0, 0.0])
    np.testing.assert_allclose(coords[3, 20], [(20 - 16) / 16, (3 - 16) / 16])
    cfg = _small(size=n, steepness=(1.0,))
    params, frozen = model.init_params(cfg, KEY)
    bins = model.bins_of(params, frozen)
    # One narrow bin centred on pixel (3, 20), the rest switched off (lam = 0).
    bins = {**bins, "lam": bins["lam"].at[1:].set(0.0), "u": bins["u"].at[0].set(0.25)}
    bins = {**bins, "v": bins["v"].at[0].set(-13 / 16), "h": bins["h"].at[0].set(1 / 16)}
    bins = {**bins, "w": bins["w"].at[0].set(1 / 16), "k": bins["k"].at[0].set(64.0)}
    features = binned_encoding.encode(
        jnp.asarray(model.pixel_coords(n)), binned_encoding.Bins(**bins)
    )
    assert np.unravel_index(int(jnp.argmax(features[:, 0])), (n, n)) == (3, 20)


def test_frozen_bin_parameters_stay_out_of_the_trainable_params():
    cfg = _small(frozen=("u", "v"))
    params, frozen = model.init_params(cfg, KEY)
    assert set(params["bins"]) == {"h", "w", "theta", "k", "lam"}
    assert set(frozen["bins"]) == {"u", "v"}
    grads = jax.grad(lambda p: jnp.sum(model.render(cfg, p, frozen) ** 2))(params)
    assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grads["bins"]))
    rff_params, rff_frozen = model.init_params(_small(encoding="rff"), KEY)
    assert "bins" not in rff_params and rff_frozen["B"].shape == (8, 2)


@pytest.mark.parametrize("sigma", [0.5, 2.0])
def test_rff_features_estimate_the_gaussian_kernel_of_their_sigma(sigma):
    """B ~ N(0, sigma^2) in cycles per unit: E[phi(x) . phi(y)] / H = E[cos 2 pi b . (x - y)]
    = exp(-2 pi^2 sigma^2 |x - y|^2). Offsets are picked where that kernel is 0.9, 0.5 and
    0.1, so a missing 2 pi (kernel > 0.97 at all three) or sigma^2 / 1/sigma for sigma (at
    sigma != 1) lands many standard errors away."""
    H = 8192
    cfg = _small(encoding="rff", num_features=2 * H, rff_sigma=sigma)
    _, frozen = model.init_params(cfg, KEY)
    target_K = np.array([0.9, 0.5, 0.1])
    dist_K = np.sqrt(-np.log(target_K) / (2 * np.pi**2 * sigma**2))
    direction = np.array([0.6, -0.8])  # any unit vector: the kernel is isotropic
    origin = np.array([0.1, 0.2])
    coords = np.concatenate([origin[None], origin + dist_K[:, None] * direction]).astype("f4")
    phi_PM = np.asarray(model.rff_features(jnp.asarray(coords), frozen["B"]), np.float64)
    estimate_K = phi_PM[1:] @ phi_PM[0] / H
    np.testing.assert_allclose(phi_PM[0] @ phi_PM[0] / H, 1.0, rtol=1e-5)  # cos^2 + sin^2
    # H iid terms cos(2 pi b . d), variance (1 - k^2)^2 / 2: five standard errors of the mean
    tolerance_K = 5 * (1 - target_K**2) / np.sqrt(2 * H)
    assert np.all(np.abs(estimate_K - target_K) < tolerance_K), (estimate_K, tolerance_K)


def test_initial_steepness_is_set_in_pixels():
    cfg = _small(size=64, steepness=(1.5, 3.0))
    bins = model.init_bins(cfg, KEY)
    np.testing.assert_allclose(bins["k"][:4] * cfg.pixel, [1.5, 3.0, 1.5, 3.0], rtol=1e-6)


def test_steepness_anneals_geometrically_to_the_configured_k():
    """anneal=(0.25, 0.5) over 100 steps: k x 0.25 at step 0, x 0.5 at step 25, x 1 from step
    50 on; training sees the factor (the loss of a smoke run with it is that of
    render(k_scale=0.25) at step 0) and logs it; the trained model renders with x 1."""
    cfg = _small(anneal=(0.25, 0.5))
    k_scale = model.steepness_schedule(cfg, 100)
    np.testing.assert_allclose([k_scale(s) for s in (0, 25, 50, 90)], [0.25, 0.5, 1, 1], 1e-6)
    assert model.steepness_schedule(_small(), 100) is None  # anneal (1, 0): nothing to do
    config = nab_config.get_config("size=smoke")
    config.model.anneal = (0.25, 0.5)
    method = nab.make(config)
    state = train.init(config, method, devices=jax.devices()[:1]).state
    batch = next(method.dataset("train", shard=(0, 1), seed=0))
    _, metrics = method.step(state, batch, rng=KEY)
    cfg = nab.model_config(config)
    soft = model.render(cfg, state.params, state.extra["frozen"], 0.25)
    expected = np.mean((np.asarray(projector.radon(soft, batch["angle"])) - batch["proj"].T) ** 2)
    np.testing.assert_allclose(float(metrics["loss"]), expected, rtol=1e-5)  # as in the test below
    assert float(metrics["k_scale"]) == 0.25


def test_uniform_theta_init_covers_a_quarter_turn():
    theta = np.asarray(
        model.init_bins(_small(num_features=400, theta_init="uniform"), KEY)["theta"]
    )
    assert theta.min() >= 0 and theta.max() < np.pi / 2 and np.ptp(theta) > 1.4
    assert not np.any(model.init_bins(_small(theta_init="zero"), KEY)["theta"])


def test_loss_is_the_mean_squared_sinogram_residual():
    config = nab_config.get_config("size=smoke")
    method = nab.make(config)
    cfg = nab.model_config(config)
    state = method.init(KEY, None)
    batch = next(method.dataset("train", shard=(0, 1), seed=0))
    loss, _ = method.loss(state["params"], batch, extra={"frozen": state["frozen"]})
    image = model.render(cfg, state["params"], state["frozen"])
    _, sino_DA, angles = nab.problem(config)
    expected = np.mean((np.asarray(projector.radon(image, angles)) - sino_DA) ** 2)
    # float32 line integrals of size ~10 squared and averaged: rtol 1e-5.
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    np.testing.assert_array_equal(batch["angle"], angles)  # all views, in order, every step


def test_config_errors_name_the_field():
    config = nab_config.get_config("size=smoke")
    config.train.batch_size = 4
    with pytest.raises(ConfigError, match="train.batch_size=4 must equal data.num_views=8"):
        nab.make(config)
    with pytest.raises(ConfigError, match="encoding='fourier' is unknown"):
        nab_config.get_config("encoding=fourier")
    config = nab_config.get_config("size=smoke")
    config.model.frozen = ("centre",)
    with pytest.raises(ConfigError, match="frozen has unknown names"):
        nab.make(config)
    config = nab_config.get_config("size=smoke")
    config.model.anneal = (0.0, 0.5)
    with pytest.raises(ConfigError, match="anneal must be"):
        nab.make(config)


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # skimage's PSNR of 0 error
def test_quality_matches_the_psnr_formula_and_masks_outside_the_circle():
    truth = phantoms.industrial(32, 0)
    noisy = truth + 0.05 * np.random.default_rng(0).standard_normal(truth.shape)
    inside = metrics.circle_mask(32)
    clipped = np.clip(noisy, 0.0, 1.0)
    mse = np.mean(np.where(inside, clipped - truth, 0.0) ** 2)
    np.testing.assert_allclose(metrics.quality(noisy, truth)["psnr"], 10 * np.log10(1 / mse))
    outside_junk = np.where(inside, truth, 0.7)
    assert metrics.quality(outside_junk, truth)["psnr"] == np.inf


def test_classical_baselines_reconstruct_the_measured_object():
    """From 32 noisy views of a 64 x 64 industrial phantom, FBP and SART recover it clearly
    better than an empty image, and SART (with the [0, 1] constraint) beats FBP."""
    truth = phantoms.industrial(64, 1)
    angles = projector.angles(32)
    sino = phantoms.measure(truth, 32, noise=0.01, seed=1)
    empty = metrics.quality(np.zeros_like(truth), truth)["psnr"]
    fbp = metrics.quality(baselines.fbp(sino, angles, 64), truth)["psnr"]
    sart = metrics.quality(baselines.sart(sino, angles, 64), truth)["psnr"]
    assert fbp > empty + 5 and sart > fbp


def test_kernel_trains_on_a_sharded_mesh():
    """impl="interpret" and "tiled" on a data=2 x fsdp=2 x model=2 mesh: the fused kernel (and
    its tiles scanned) runs under `sharded_op` (pixels over data and fsdp; XLA cannot
    partition a Pallas call; the interpreted kernel is plain HLO XLA could, hence the
    shard_map check) and three steps give the jnp reference's losses. float32 sums in another
    order: rtol 1e-5."""
    losses = {}
    for impl in ("xla", "interpret", "tiled"):
        config = nab_config.get_config("size=smoke")
        config.mesh.shape = (2, 2, 2)
        config.model.impl = impl
        losses[impl], sharded = losses_on_mesh(config, nab.make)
        assert sharded == (impl != "xla")
    np.testing.assert_allclose(losses["interpret"], losses["xla"], rtol=1e-5)
    np.testing.assert_allclose(losses["tiled"], losses["xla"], rtol=1e-5)
