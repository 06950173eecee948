"""Neural adaptive binning (paper 3, NAB): the pure-jnp specification every kernel is tested by.

Bins. `Bins` holds seven float32 [M] arrays, one entry per bin i: centre (u, v), side lengths
(h, w), rotation theta, steepness k and height lam. A NamedTuple so that it is a pytree whose
gradient has the same fields (the method trains all seven); `as_bins` also accepts a mapping
with those seven keys. Sides are used as given: keeping h, w > 0 (softplus, abs) is the
caller's job. Units: k is in inverse coordinate units, so a bin's edge spans ~1/k coordinate
units (with pixel centres a pixel apart, k * pixel ~ 1-5 keeps edges learnable).

For pixel n at c_n = (x_n, y_n) and bin i, in the bin's rotated frame

    x' = cos(theta)(x - u) - sin(theta)(y - v),     y' = sin(theta)(x - u) + cos(theta)(y - v)
    gamma = tanh(k (x' + h/2))/2 - tanh(k (x' - h/2))/2    (a soft box of width h along x')
    mu    = tanh(k (y' + w/2))/2 - tanh(k (y' - w/2))/2    (a soft box of width w along y')
    f[n, i] = lam * gamma * mu

and the fused first layer is z = f @ W1 + b1. As k -> inf (lam = 1) f tends to the 0/1
indicator of the rotated rectangle. Differences of tanh, not products of sigmoids: the paper's
form, symmetric in x' -> -x'; float32 is enough for the cancellation at large k |x'|.

Shapes: coords_N2 [N, 2] (x, y); bins: seven [M]; w1_MF [M, F]; b1_F [F]; f_NM [N, M];
z_NF [N, F]. All computed in float32; the matmul at HIGHEST precision, so the reference is the
same float32 spec on every backend (TPU's default would be bfloat16 passes).
"""

from collections.abc import Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp

_F32 = jnp.float32


class Bins(NamedTuple):
    """The M bins' parameters, each float32 [M] (see the module docstring)."""

    u: jax.Array  # centre x
    v: jax.Array  # centre y
    h: jax.Array  # side along the rotated x'
    w: jax.Array  # side along the rotated y'
    theta: jax.Array  # rotation (radians)
    k: jax.Array  # steepness (1 / coordinate units)
    lam: jax.Array  # height


def as_bins(bins) -> Bins:
    """`bins` as a `Bins`: a Bins is returned as is, a mapping must have exactly its seven keys."""
    if isinstance(bins, Bins):
        return bins
    if isinstance(bins, Mapping):
        if set(bins) != set(Bins._fields):
            raise ValueError(f"bins has keys {sorted(bins)}; expected {list(Bins._fields)}")
        return Bins(**bins)
    raise ValueError(f"bins must be a Bins or a mapping of {Bins._fields}, not {type(bins)}")


def check_shapes(coords_N2, bins: Bins, w1_MF=None, b1_F=None) -> None:
    """Raises a one-line ValueError naming the shapes unless they fit the module docstring's."""
    if len(coords_N2.shape) != 2 or coords_N2.shape[1] != 2:
        raise ValueError(f"coords {tuple(coords_N2.shape)} must be [N, 2]")
    shapes = {name: tuple(getattr(bins, name).shape) for name in Bins._fields}
    if len(set(shapes.values())) != 1 or len(shapes["u"]) != 1:
        raise ValueError(f"bins must be seven [M] arrays of one M, got shapes {shapes}")
    (M,) = shapes["u"]
    if w1_MF is not None and (len(w1_MF.shape) != 2 or w1_MF.shape[0] != M):
        raise ValueError(f"w1 {tuple(w1_MF.shape)} must be [M, F] with M = {M} bins")
    if b1_F is not None and w1_MF is not None and tuple(b1_F.shape) != (w1_MF.shape[1],):
        raise ValueError(f"b1 {tuple(b1_F.shape)} must be [F] = ({w1_MF.shape[1]},) for w1")


def soft_box(z, width, k):
    """tanh(k (z + width/2))/2 - tanh(k (z - width/2))/2: ~1 inside |z| < width/2, ~0 outside."""
    half = 0.5 * width
    return 0.5 * jnp.tanh(k * (z + half)) - 0.5 * jnp.tanh(k * (z - half))


def encode(coords_N2, bins) -> jax.Array:
    """f_NM: the NAB features of every pixel, float32 [N, M]."""
    bins = as_bins(bins)
    check_shapes(coords_N2, bins)
    b = Bins(*(jnp.asarray(p, _F32) for p in bins))
    coords = jnp.asarray(coords_N2, _F32)
    dx_NM = coords[:, 0:1] - b.u
    dy_NM = coords[:, 1:2] - b.v
    cos_M, sin_M = jnp.cos(b.theta), jnp.sin(b.theta)
    xr_NM = cos_M * dx_NM - sin_M * dy_NM
    yr_NM = sin_M * dx_NM + cos_M * dy_NM
    return b.lam * soft_box(xr_NM, b.h, b.k) * soft_box(yr_NM, b.w, b.k)


def encode_dense(coords_N2, bins, w1_MF, b1_F) -> jax.Array:
    """z_NF = encode(coords, bins) @ w1 + b1: the first MLP layer's pre-activation, float32."""
    bins = as_bins(bins)
    check_shapes(coords_N2, bins, w1_MF, b1_F)
    f_NM = encode(coords_N2, bins)
    z_NF = jnp.dot(f_NM, jnp.asarray(w1_MF, _F32), precision=jax.lax.Precision.HIGHEST)
    return z_NF + jnp.asarray(b1_F, _F32)
