"""Parallel-beam CT projector in JAX: `radon` (A) and its exact adjoint `backproject` (A^T).

    theta = angles(16)                                   # float32 degrees, endpoint excluded
    sino_DA = radon(image_NN, theta)                     # [num_detectors, num_views]
    back_NN = backproject(sino_DA, theta, size=N)        # <A x, y> = <x, A^T y>

Geometry, in skimage's conventions (`skimage.transform.radon(image, theta, circle=True)`), read
off its source rather than guessed: the rotation axis is pixel (N//2, N//2) (row, col); the
sinogram's centre is detector bin `num_detectors // 2`; at view angle theta, detector offset s
and ray parameter t (both in pixels) sample the image at

    col = centre + cos(theta) s + sin(theta) t,   row = centre - sin(theta) s + cos(theta) t,

so theta = 0 sums each column over its rows. skimage rotates the image and sums rows (one
bilinear sample per integer t); here each ray is a line integral instead: `samples` midpoints
along t in [-L, L], L = the distance from the axis to the farthest image corner plus one pixel
(the bilinear fringe), each bilinear sample of the image (zero outside) times the step 2L/samples.
The default `samples = 2 N` keeps the step L/N under 1 pixel for N >= 6 (0.73 at N = 64).
The two agree up to interpolation and quadrature differences (measured in
tests/methods/test_nab_projector.py).

Everything is float32 and linear in the image, so `backproject` is `jax.linear_transpose` of
`radon` (a scatter-add), exact to float32 rounding. Views are vectorised with `vmap`; per view
the gather reads 4 * num_detectors * samples pixels (128^2, 16 views: ~2M, ~16 MB of indices
and weights).

Shape suffixes: N image side, D detector bins, A view angles, S samples per ray.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

_STATIC = ("num_detectors", "samples", "detector_spacing", "center")


def angles(num_views: int, *, start: float = 0.0, stop: float = 180.0) -> np.ndarray:
    """`num_views` evenly spaced view angles in degrees on [start, stop), float32.

    The endpoint is excluded because 180 degrees repeats 0 in parallel beam (mirrored); this is
    skimage's `np.linspace(0, 180, n, endpoint=False)`.
    """
    return np.linspace(start, stop, num_views, endpoint=False).astype(np.float32)


def _ray_half_length(size: int, center: float) -> float:
    """Farthest image corner (pixel edges at -0.5 and size - 0.5) from the axis, plus the one
    pixel beyond the edge where bilinear interpolation still blends in the border pixels."""
    reach = max(abs(-0.5 - center), abs(size - 0.5 - center))
    return math.sqrt(2.0) * reach + 1.0


def _bilinear(image_NN: jax.Array, row: jax.Array, col: jax.Array) -> jax.Array:
    """Bilinear samples of `image_NN` at float (row, col), zero outside: a gather times fixed
    weights, so linear in the image (what `jax.linear_transpose` needs). Each of the four
    corners outside the image contributes zero, as in skimage's `warp(mode="constant")`."""
    n_rows, n_cols = image_NN.shape
    row0, col0 = jnp.floor(row), jnp.floor(col)
    frac_r, frac_c = row - row0, col - col0
    row0, col0 = row0.astype(jnp.int32), col0.astype(jnp.int32)
    flat = image_NN.reshape(-1)
    out = jnp.zeros(row.shape, image_NN.dtype)
    for dr, wr in ((0, 1.0 - frac_r), (1, frac_r)):
        for dc, wc in ((0, 1.0 - frac_c), (1, frac_c)):
            r, c = row0 + dr, col0 + dc
            inside = (r >= 0) & (r < n_rows) & (c >= 0) & (c < n_cols)
            # Clipped indices keep the gather in bounds; the mask zeroes what they read.
            idx = jnp.clip(r, 0, n_rows - 1) * n_cols + jnp.clip(c, 0, n_cols - 1)
            out = out + jnp.where(inside, wr * wc, 0.0) * flat[idx]
    return out


@functools.partial(jax.jit, static_argnames=_STATIC)
def radon(
    image_NN: jax.Array,
    angles_deg: jax.Array,
    *,
    num_detectors: int | None = None,
    samples: int | None = None,
    detector_spacing: float = 1.0,
    center: float | None = None,
) -> jax.Array:
    """Parallel-beam projections of a square image: sinogram [num_detectors, num_views].

    Args:
      image_NN: the image, [N, N]; cast to float32.
      angles_deg: view angles in degrees, [A].
      num_detectors: detector bins (default N), centred on bin `num_detectors // 2`.
      samples: midpoint samples per ray (default 2 N; keep the step 2L/samples <= 1 pixel).
      detector_spacing: distance between detector bins in pixels (`phantoms.measure` projects
        an oversampled image with the coarse grid's spacing).
      center: (row = col) pixel coordinate of the rotation axis (default N // 2, skimage's).

    Returns:
      float32 [num_detectors, A]: line integrals in pixel units (a unit image across a ray of
      length l gives l), one column per view, as `skimage.transform.radon` lays them out.
    """
    image_NN = jnp.asarray(image_NN, jnp.float32)
    size = image_NN.shape[0]
    if image_NN.shape != (size, size):
        raise ValueError(f"radon needs a square image, got shape {image_NN.shape}")
    num_detectors = size if num_detectors is None else num_detectors
    samples = 2 * size if samples is None else samples
    center = float(size // 2) if center is None else center

    half = _ray_half_length(size, center)
    step = 2.0 * half / samples
    s_D = (jnp.arange(num_detectors, dtype=jnp.float32) - num_detectors // 2) * detector_spacing
    t_S = -half + (jnp.arange(samples, dtype=jnp.float32) + 0.5) * step

    def view(theta_deg):
        theta = jnp.deg2rad(theta_deg.astype(jnp.float32))
        cos, sin = jnp.cos(theta), jnp.sin(theta)
        col_DS = center + cos * s_D[:, None] + sin * t_S[None, :]
        row_DS = center - sin * s_D[:, None] + cos * t_S[None, :]
        return _bilinear(image_NN, row_DS, col_DS).sum(axis=1) * step

    sino_AD = jax.vmap(view)(jnp.asarray(angles_deg, jnp.float32))
    return sino_AD.T


@functools.partial(jax.jit, static_argnames=("size", *_STATIC))
def backproject(
    sino_DA: jax.Array,
    angles_deg: jax.Array,
    size: int,
    *,
    num_detectors: int | None = None,
    samples: int | None = None,
    detector_spacing: float = 1.0,
    center: float | None = None,
) -> jax.Array:
    """The exact adjoint A^T of `radon` (same geometry keywords): image [size, size], float32.

    The transpose of radon's linear map (a scatter-add of the gather), not a filtered or
    interpolated backprojection, so <radon(x), y> = <x, backproject(y)> to float32 rounding:
    what gradient-based reconstruction needs. `num_detectors` defaults to `size`.
    """
    forward = functools.partial(
        radon,
        angles_deg=angles_deg,
        num_detectors=num_detectors,
        samples=samples,
        detector_spacing=detector_spacing,
        center=center,
    )
    transpose = jax.linear_transpose(forward, jax.ShapeDtypeStruct((size, size), jnp.float32))
    (back_NN,) = transpose(jnp.asarray(sino_DA, jnp.float32))
    return back_NN
