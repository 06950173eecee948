"""NAB's projector against scikit-image's radon, its adjoint, and the phantoms and measurements.

Reference: `skimage.transform.radon(circle=True)` rotates the image (bilinear `warp`) and sums
rows; ours integrates along rays with bilinear samples. Both model the same geometry, so their
sinograms differ only by interpolation/quadrature (measured: relative L2 0.0044-0.0056 at
N = 32, 0.0021-0.0025 at N = 63/64; per-view centroids within 0.03 px). A wrong angle sign
gives relative L2 >= 0.43 and a half-pixel shift of the axis 0.055 at N = 64.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from skimage.transform import radon as skimage_radon

from methods.nab import phantoms, projector

ANGLE_SETS = {
    "4_views": projector.angles(4),  # multiples of 45 degrees: the axes and diagonals
    "16_views": projector.angles(16),
    "irregular": np.array([7.3, 33.0, 61.7, 100.1, 151.9, 179.0], np.float32),
}


def asymmetric_image(n: int) -> np.ndarray:
    """Off-centre ramp disc plus an off-centre bright square, zero outside the circle: no
    symmetry that would hide a flipped angle or axis."""
    rows, cols = np.mgrid[:n, :n].astype(np.float64)
    c = n // 2
    image = (np.hypot(rows - c - 0.1 * n, cols - c + 0.05 * n) < 0.3 * n) * (0.3 + 0.5 * cols / n)
    top, left, side = c - n // 4, c + n // 8, n // 10
    image[top : top + side, left : left + side] = 1.0
    image[np.hypot(rows - c, cols - c) > n // 2 - 1] = 0.0
    return image.astype(np.float32)


def blob(n: int) -> np.ndarray:
    """A Gaussian (sigma 1.5 px) off centre and off the pixel grid: one clear peak per view
    (its negligible tails outside the circle cut, as skimage's circle=True expects)."""
    rows, cols = np.mgrid[:n, :n]
    image = np.exp(-((rows - 0.31 * n) ** 2 + (cols - 0.65 * n) ** 2) / 4.5)
    image[np.hypot(rows - n // 2, cols - n // 2) > n // 2 - 1] = 0.0
    return image.astype(np.float32)


def reference(image: np.ndarray, theta: np.ndarray) -> np.ndarray:
    return skimage_radon(image.astype(np.float64), theta=theta.astype(np.float64), circle=True)


def centroids(sino_DA: np.ndarray) -> np.ndarray:
    """Per-view centre of mass along the detector, in bins: where each projection sits."""
    bins = np.arange(sino_DA.shape[0])[:, None]
    return (sino_DA * bins).sum(axis=0) / sino_DA.sum(axis=0)


def relative_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_angles_like_skimage():
    theta = projector.angles(12)
    assert theta.dtype == np.float32
    np.testing.assert_array_equal(theta, np.linspace(0, 180, 12, endpoint=False, dtype=np.float32))
    np.testing.assert_allclose(projector.angles(4, start=10.0, stop=50.0), [10, 20, 30, 40])


@pytest.mark.parametrize("n", [32, 63])
@pytest.mark.parametrize("angle_set", ANGLE_SETS)
def test_radon_matches_skimage(n, angle_set):
    theta = ANGLE_SETS[angle_set]
    image = asymmetric_image(n)
    ours = np.asarray(projector.radon(image, theta))
    ref = reference(image, theta)
    assert ours.shape == ref.shape == (n, len(theta))
    assert ours.dtype == np.float32
    # Same scale (line integrals in pixels, no factor) up to interpolation and quadrature:
    # measured <= 0.0056 (N = 32) and 0.0025 (N = 63); a half-pixel axis shift gives 0.055.
    assert relative_l2(ours, ref) < 0.01
    # Projections sit at the same detector position: measured <= 0.03 px apart; a half-pixel
    # shift moves them 0.5 px, a flipped angle several pixels.
    np.testing.assert_allclose(centroids(ours), centroids(ref), atol=0.1)
    # A single peak per view lands in the same bin, up to one bin where two neighbouring bins
    # nearly tie (measured: at most 1; a flipped angle moves it ~20 bins at N = 64).
    peak_ours = np.asarray(projector.radon(blob(n), theta)).argmax(axis=0)
    peak_ref = reference(blob(n), theta).argmax(axis=0)
    assert np.abs(peak_ours - peak_ref).max() <= 1


def test_comparison_catches_flipped_angle_and_shifted_axis():
    """The checks above have teeth: plausible geometry bugs fail them by a wide margin."""
    n, theta = 64, ANGLE_SETS["16_views"]
    image = asymmetric_image(n)
    ref = reference(image, theta)
    flipped = np.asarray(projector.radon(image, -theta))
    assert relative_l2(flipped, ref) > 0.3  # measured 0.51
    assert np.abs(centroids(flipped) - centroids(ref)).max() > 1.0
    peak_flipped = np.asarray(projector.radon(blob(n), -theta)).argmax(axis=0)
    assert np.abs(peak_flipped - reference(blob(n), theta).argmax(axis=0)).max() > 5
    shifted = np.asarray(projector.radon(image, theta, center=n // 2 - 0.5))
    assert relative_l2(shifted, ref) > 0.03  # measured 0.055
    assert np.abs(centroids(shifted) - centroids(ref)).max() > 0.3


@pytest.mark.parametrize(
    "n, num_views, geometry",
    [
        (32, 7, {}),
        # phantoms.measure's geometry: an oversampled image, coarse bins, off-grid axis.
        (48, 16, {"num_detectors": 24, "detector_spacing": 2.0, "center": 24.5}),
    ],
)
def test_backproject_is_the_adjoint(n, num_views, geometry):
    theta = projector.angles(num_views)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, n)).astype(np.float32)
    y = rng.standard_normal((geometry.get("num_detectors", n), num_views)).astype(np.float32)
    ax = np.asarray(projector.radon(x, theta, **geometry), np.float64)
    aty = np.asarray(projector.backproject(y, theta, n, **geometry), np.float64)
    lhs, rhs = np.vdot(ax, y), np.vdot(x, aty)
    # float32 rounding in A x and A^T y (sums of ~4 * 2N terms per entry), relative to the
    # Cauchy-Schwarz bound |<Ax, y>| <= |Ax| |y|; measured ~3e-8.
    assert abs(lhs - rhs) <= 1e-5 * np.linalg.norm(ax) * np.linalg.norm(y)


def test_radon_gradient_is_the_backprojected_residual():
    """Differentiable and jittable: grad of ||A x - y||^2 is 2 A^T (A x - y)."""
    n, theta = 32, projector.angles(8)
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.random((n, n)), jnp.float32)
    y = jnp.asarray(rng.random((n, 8)), jnp.float32)
    grad = jax.jit(jax.grad(lambda x: jnp.sum((projector.radon(x, theta) - y) ** 2)))(x)
    expected = 2 * projector.backproject(projector.radon(x, theta) - y, theta, n)
    # The same float32 operations in another program and order: rounding only (entries up to
    # ~300, measured max difference 5e-4).
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-3)


def four_fold_orientation(image: np.ndarray) -> tuple[float, float]:
    """Concentration (0..1) and dominant angle (degrees mod 90) of the edge directions,
    weighted by squared gradient: near 1 when the edges are those of rectangles sharing
    one rotation, small for curves."""
    gy, gx = np.gradient(image.astype(np.float64))
    weight = gx**2 + gy**2
    z = (weight * np.exp(4j * np.arctan2(gy, gx))).sum() / weight.sum()
    return abs(z), np.degrees(np.angle(z) / 4) % 90


@pytest.mark.parametrize("name", phantoms.PHANTOMS)
def test_phantom_basics(name):
    make = phantoms.PHANTOMS[name]
    image = make(48, 0)
    assert image.shape == (48, 48) and image.dtype == np.float32
    assert image.min() >= 0.0 and image.max() <= 1.0 and image.max() > 0.3
    rows, cols = np.mgrid[:48, :48]
    assert not image[(rows - 24) ** 2 + (cols - 24) ** 2 > 24**2].any()  # radon(circle=True)
    np.testing.assert_array_equal(make(48, 0), image)
    if name != "shepp_logan":  # the one fixed phantom
        assert not np.array_equal(make(48, 1), image)
    assert make(33, 2).shape == (33, 33)


def test_industrial_is_rectangles_at_varied_rotations():
    orientation = [four_fold_orientation(phantoms.industrial(64, seed)) for seed in range(8)]
    curved = [four_fold_orientation(phantoms.curved(64, seed))[0] for seed in range(8)]
    # Measured 0.53-0.86 for industrial, 0.14-0.28 for curved (grid anisotropy and slots).
    assert min(c for c, _ in orientation) > 0.45
    assert max(curved) < min(c for c, _ in orientation)
    # The object's rotation is random, not axis-aligned: the dominant edge angles (measured
    # 9-84 degrees over these seeds) spread widely.
    assert np.ptp([a for _, a in orientation]) > 30
    image = phantoms.industrial(64, 0)
    assert not np.allclose(image, np.rot90(image), atol=0.1)
    # Anti-aliased edges: supersampling leaves intermediate values, not just the fill levels.
    assert len(np.unique(image)) > 20


def test_measure_geometry_scale_and_noise():
    n, num_views = 64, 16
    image = phantoms.industrial(n, 3)
    clean = phantoms.measure(image, num_views, noise=0.0)
    assert clean.shape == (n, num_views) and clean.dtype == np.float32
    model = np.asarray(projector.radon(image, projector.angles(num_views)))
    # Same geometry and scale as the reconstruction operator: total mass per view within 0.5%
    # (a missing /oversample would be 2x) and centroids within 0.1 px (measured <= 0.03; a
    # quarter-pixel axis error gives 0.35) ...
    np.testing.assert_allclose(clean.sum(axis=0), model.sum(axis=0), rtol=5e-3)
    np.testing.assert_allclose(centroids(clean), centroids(model), atol=0.1)
    # ... but not the same numbers (no inverse crime): pixel squares vs bilinear differ at
    # edges, measured relative L2 ~0.01 at N = 64.
    assert 1e-3 < relative_l2(clean, model) < 0.03
    # oversample=1 is the model itself (float32 rounding of the same program).
    np.testing.assert_allclose(phantoms.measure(image, num_views, noise=0.0, oversample=1), model)

    noisy = phantoms.measure(image, num_views, noise=0.02, seed=5)
    np.testing.assert_array_equal(noisy, phantoms.measure(image, num_views, noise=0.02, seed=5))
    assert not np.array_equal(noisy, phantoms.measure(image, num_views, noise=0.02, seed=6))
    # Documented level: ||noise|| / ||clean|| = 0.02; over 1024 entries the estimate's
    # relative standard deviation is 1/sqrt(2 * 1024) = 2.2%, so 10% is > 4 sigma.
    np.testing.assert_allclose(relative_l2(noisy, clean), 0.02, rtol=0.1)
