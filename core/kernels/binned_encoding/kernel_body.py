"""The backend-neutral kernel body: one (N-tile x M-tile) step of the fused NAB encoder.

Layout (built by `kernel.py`, outside the kernel):

    xy_2N1     [2, N, 1]   xy[0] = x, xy[1] = y: each a (BN, 1) column reached by indexing
    prm_8M     [8, M]      rows PARAM_ROWS = u, v, h, w, cos(theta), sin(theta), k, lam
    w1_MF      [M, F]      float32
    b1_1F      [1, F]      float32
    g_NF       [N, F]      the cotangent dL/dz (backward)
    dprm_P8M   [P, 8, M]   per-bin gradient partials, rows GRAD_ROWS (row 7 zero), P partials
    dw1_PMF    [P, M, F]   dW1 partials

Why this layout: a feature tile is an outer "product" of a pixel column (BN, 1) and bin rows
(1, BM), so the per-bin parameters sit with M on the lane (last) axis; eight rows fill a
TPU (8, 128) tile exactly (seven parameters with theta replaced by its cosine and sine,
computed once outside the kernel). The coordinates are two leading-axis columns, so neither
backend slices lanes or values (Triton cannot lower value slices).

All matmuls run at HIGHEST precision with float32 accumulation: the default is bfloat16
passes on TPU and TF32 on Triton, ~1e-3 relative, far off the reference's float32.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from core.kernels import common

_F32 = jnp.float32
_HIGHEST = lax.Precision.HIGHEST

PARAM_ROWS = ("u", "v", "h", "w", "cos", "sin", "k", "lam")
GRAD_ROWS = ("u", "v", "h", "w", "theta", "k", "lam")  # of dprm; its row 7 stays zero


class TileTerms(NamedTuple):
    """What one (BN, BM) tile computes before the features; the backward reuses all of it."""

    xr: jax.Array  # x' (BN, BM)
    yr: jax.Array  # y'
    t1: jax.Array  # tanh(k (x' + h/2))
    t2: jax.Array  # tanh(k (x' - h/2))
    s1: jax.Array  # tanh(k (y' + w/2))
    s2: jax.Array  # tanh(k (y' - w/2))
    half_h: jax.Array  # h / 2 (1, BM)
    half_w: jax.Array  # w / 2
    cos: jax.Array
    sin: jax.Array
    k: jax.Array
    lam: jax.Array


def bin_terms(rows, cols, xy_ref, prm_ref) -> TileTerms:
    """The tanh terms of pixels `rows` (a `pl.ds` over xy's N axis) and bins `cols` (over M).

    Static slices only, so the same code reads Pallas refs and plain arrays (`cpu.py` passes
    arrays and `slice(None)`)."""
    x_N1 = xy_ref[0, rows, :].astype(_F32)
    y_N1 = xy_ref[1, rows, :].astype(_F32)
    u, v, h, w, cos, sin, k, lam = (
        prm_ref[r : r + 1, cols].astype(_F32) for r in range(len(PARAM_ROWS))
    )
    dx = x_N1 - u
    dy = y_N1 - v
    xr = cos * dx - sin * dy
    yr = sin * dx + cos * dy
    half_h, half_w = 0.5 * h, 0.5 * w
    return TileTerms(
        xr=xr,
        yr=yr,
        t1=jnp.tanh(k * (xr + half_h)),
        t2=jnp.tanh(k * (xr - half_h)),
        s1=jnp.tanh(k * (yr + half_w)),
        s2=jnp.tanh(k * (yr - half_w)),
        half_h=half_h,
        half_w=half_w,
        cos=cos,
        sin=sin,
        k=k,
        lam=lam,
    )


def _boxes(t: TileTerms):
    """(gamma, mu): the same float32 operations as `reference.soft_box` (x 0.5 is exact)."""
    return 0.5 * t.t1 - 0.5 * t.t2, 0.5 * t.s1 - 0.5 * t.s2


def forward_tile(rows, cols, xy_ref, prm_ref, w1_ref):
    """f_tile @ W1[cols]: this tile's (BN, BF) contribution to z, float32.

    f is built in registers/VMEM and never leaves the kernel: that is the point of fusing."""
    t = bin_terms(rows, cols, xy_ref, prm_ref)
    gamma, mu = _boxes(t)
    f_NM = t.lam * gamma * mu
    w1_MF = w1_ref[cols, :].astype(_F32)
    return jnp.dot(f_NM, w1_MF, precision=_HIGHEST, preferred_element_type=_F32)


def backward_tile(rows, cols, xy_ref, prm_ref, w1_ref, g_ref):
    """(dW1 contribution (BM, F), seven per-bin partial sums (1, BM) in GRAD_ROWS order).

    The tanh terms are recomputed (cheap; nothing N x M is stored). With Gf = G W1^T,
    a = Gf mu, b = Gf gamma (lam factored out) and d1 = 1 - t1^2 etc.:
      dlam = sum Gf gamma mu
      dh   = lam k/4 sum a (d1 + d2)              dw = lam k/4 sum b (e1 + e2)
      dk   = lam/2 sum a (d1 (x'+h/2) - d2 (x'-h/2)) + b (e1 (y'+w/2) - e2 (y'-w/2))
      gx   = lam k/2 a (d1 - d2) = dL/dx',        gy = lam k/2 b (e1 - e2) = dL/dy'
      du   = -cos sum gx - sin sum gy,  dv = sin sum gx - cos sum gy,  dtheta = sum x' gy - y' gx
    Per-bin constants (lam, k, cos, sin) multiply the column sums, not every element.
    Padded pixels have G = 0 and padded bins zero W1 rows, so both contribute exact zeros.
    """
    t = bin_terms(rows, cols, xy_ref, prm_ref)
    gamma, mu = _boxes(t)
    g_NF = g_ref[rows, :].astype(_F32)
    w1_MF = w1_ref[cols, :].astype(_F32)
    f_NM = t.lam * gamma * mu
    contract_f = (((1,), (1,)), ((), ()))  # G W1^T: over F
    gf_NM = lax.dot_general(g_NF, w1_MF, contract_f, _HIGHEST, preferred_element_type=_F32)
    contract_n = (((0,), (0,)), ((), ()))  # f^T G: over the tile's pixels
    dw1_MF = lax.dot_general(f_NM, g_NF, contract_n, _HIGHEST, preferred_element_type=_F32)

    def colsum(z_NM):
        return jnp.sum(z_NM, axis=0, keepdims=True)

    a = gf_NM * mu
    b = gf_NM * gamma
    d1, d2 = 1.0 - t.t1 * t.t1, 1.0 - t.t2 * t.t2
    e1, e2 = 1.0 - t.s1 * t.s1, 1.0 - t.s2 * t.s2
    gx = a * (d1 - d2)  # dL/dx' / (lam k / 2)
    gy = b * (e1 - e2)
    sum_gx, sum_gy = colsum(gx), colsum(gy)
    half_k = 0.5 * t.k
    d_lam = colsum(a * gamma)
    d_h = (0.5 * half_k * t.lam) * colsum(a * (d1 + d2))
    d_w = (0.5 * half_k * t.lam) * colsum(b * (e1 + e2))
    d_k = (0.5 * t.lam) * colsum(
        a * (d1 * (t.xr + t.half_h) - d2 * (t.xr - t.half_h))
        + b * (e1 * (t.yr + t.half_w) - e2 * (t.yr - t.half_w))
    )
    scale = half_k * t.lam
    d_u = -scale * (t.cos * sum_gx + t.sin * sum_gy)
    d_v = scale * (t.sin * sum_gx - t.cos * sum_gy)
    d_theta = scale * colsum(t.xr * gy - t.yr * gx)
    return dw1_MF, (d_u, d_v, d_h, d_w, d_theta, d_k, d_lam)


def forward_out_shape(xy_2N1, prm_8M, w1_MF, b1_1F):
    """z [N, F] float32, varying like the inputs."""
    shape = (xy_2N1.shape[1], w1_MF.shape[1])
    vma = common.vma(xy_2N1, prm_8M, w1_MF, b1_1F)
    return jax.ShapeDtypeStruct(shape, _F32, manual_axis_type=vma)


def backward_out_shapes(num_partials, xy_2N1, prm_8M, w1_MF, g_NF):
    """(dprm [P, 8, M], dW1 [P, M, F]) float32, varying like the inputs."""
    M, F = w1_MF.shape
    vma = common.vma(xy_2N1, prm_8M, w1_MF, g_NF)
    return [
        jax.ShapeDtypeStruct((num_partials, 8, M), _F32, manual_axis_type=vma),
        jax.ShapeDtypeStruct((num_partials, M, F), _F32, manual_axis_type=vma),
    ]
