"""The backend-neutral kernel body: the projection GEMM tile and the fp32 epilogues.

Layout (built by `kernel.py`, outside the kernel), C = 1 + K R columns, one per projection:

    x_BD       [B, D]      activations, their own dtype
    w_CD       [C, D]      W_all: row 0 = w1, row 1 + (k-2) R + r = U[k-2, r] (params' dtype)
    prm_2C     [2, C]      float32 rows PRM_ROWS: lam (1 for the linear column) and the order
                           (1 for the linear column, k for U[k-2]); padded columns 0, 0
    s_CN       [C, N]      float32 0/1: S[c, j] = 1 if 1 <= order[c] <= j + 1 (and j < N)
    y_PBN      [P, B, N]   truncations without w0, one partial per column tile (P = C / BC)
    z_BC       [B, C]      the projections x W_all^T, float32 (the backward's residual)
    g_BN       [B, N]      dL/dY (backward), float32
    dz_BC      [B, C]      dL/dZ, float32
    dlam_T1C   [T, 1, C]   dL/dlam (per column; the linear column's is discarded), one partial
                           per row tile (T = B / BB)

Why this layout: the order structure lives in two per-column rows and one constant matrix, so
no kernel ever slices a value per order (Triton cannot lower value slices, Mosaic's lane
slices are best avoided) and a column tile may cut through orders:
  * powers: q = z^(order-1), p = z^order by `where(order >= k, q z, q)` for k = 2..N, the
    reference's repeated multiplication column by column (the same rounding);
  * forward: t = lam p, and the cumulative sum over orders *and* the sum over r are one
    matmul, Y = t S (Mosaic has no cumsum; on the MXU this is nearly free, N << D);
  * backward: the reverse cumsum g_k = sum_{m >= k} G[:, m] is G S^T, one value per column;
    then dZ = g (order lam) z^(order-1) (= g on the linear column) and dlam = sum_b g z^order.
Padded columns have lam = order = 0 and zero S rows and W rows, so they add exact zeros.

All matmuls run at HIGHEST precision with float32 accumulation: the default is bfloat16
passes on TPU and TF32 on Triton, ~1e-3 relative, far off the reference's float32. Operands of
the GEMM are cast to their common dtype (bfloat16 x bfloat16 is exact in float32 and fast).
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from core.kernels import common

_F32 = jnp.float32
_HIGHEST = lax.Precision.HIGHEST
_NT = (((1,), (1,)), ((), ()))  # a @ b^T: contract both last axes

PRM_ROWS = ("lam", "order")


def project(x_BD, w_CD):
    """z tile = x w^T [BB, BC] float32 (the caller accumulates over D tiles)."""
    dtype = jnp.promote_types(x_BD.dtype, w_CD.dtype)
    x_BD, w_CD = x_BD.astype(dtype), w_CD.astype(dtype)
    return lax.dot_general(x_BD, w_CD, _NT, _HIGHEST, preferred_element_type=_F32)


def powers(z_BC, order_1C, num_orders: int):
    """(z^(order-1), z^order) per column, by repeated multiplication (1 and z for order <= 1)."""
    q_BC = jnp.ones_like(z_BC)
    for k in range(2, num_orders + 1):
        q_BC = jnp.where(order_1C >= k, q_BC * z_BC, q_BC)
    return q_BC, q_BC * z_BC


def forward_epilogue(z_BC, prm_ref, s_ref, *, num_orders: int):
    """This column tile's share of every truncation (w0 excluded): (lam z^order) S, [BB, N]."""
    lam_1C, order_1C = prm_ref[0:1, :], prm_ref[1:2, :]
    _, p_BC = powers(z_BC, order_1C, num_orders)
    return jnp.dot(lam_1C * p_BC, s_ref[...], precision=_HIGHEST, preferred_element_type=_F32)


def backward_kernel(z_ref, g_ref, prm_ref, s_ref, dz_ref, dlam_ref, *, num_orders: int):
    """One (BB, BC) tile: dZ, and this row tile's per-column sums for dlam. Nothing is reduced
    across grid steps (every axis is parallel); the GEMMs dW = dZ^T x and dx = dZ W_all run in
    XLA (`kernel.py`)."""
    z_BC = z_ref[...]
    lam_1C, order_1C = prm_ref[0:1, :], prm_ref[1:2, :]
    g_BC = lax.dot_general(  # g_k = sum_{m >= k} G[:, m], per column: G S^T
        g_ref[...], s_ref[...], _NT, _HIGHEST, preferred_element_type=_F32
    )
    q_BC, p_BC = powers(z_BC, order_1C, num_orders)
    dz_ref[...] = g_BC * (order_1C * lam_1C) * q_BC
    dlam_ref[0] = jnp.sum(g_BC * p_BC, axis=0, keepdims=True)


def forward_out_shapes(num_col_tiles: int, save_z: bool, x_BD, w_CD, prm_2C, s_CN):
    """y_PBN float32 and, if `save_z`, z_BC float32; varying like the inputs."""
    (B, _), (C, _), N = x_BD.shape, w_CD.shape, s_CN.shape[1]
    vma = common.vma(x_BD, w_CD, prm_2C, s_CN)
    y = jax.ShapeDtypeStruct((num_col_tiles, B, N), _F32, manual_axis_type=vma)
    z = jax.ShapeDtypeStruct((B, C), _F32, manual_axis_type=vma)
    return [y, z] if save_z else [y]


def backward_out_shapes(num_row_tiles: int, z_BC, g_BN, prm_2C, s_CN):
    """dz_BC and dlam_T1C float32, varying like the inputs."""
    vma = common.vma(z_BC, g_BN, prm_2C, s_CN)
    return [
        jax.ShapeDtypeStruct(z_BC.shape, _F32, manual_axis_type=vma),
        jax.ShapeDtypeStruct((num_row_tiles, 1, z_BC.shape[1]), _F32, manual_axis_type=vma),
    ]


def backward_call(z_BC, g_BN, prm_2C, s_CN, *, num_orders, block_b, block_c, interpret, **call):
    """The backward's pallas_call, the same on both backends (every grid axis is parallel, so
    nothing differs but `call`: the backend's compiler_params and the kernel's name).
    (dz_BC, dlam_T1C); B % block_b == C % block_c == 0."""
    (B, C), N = z_BC.shape, g_BN.shape[1]
    bb, bc = block_b, block_c
    tile = pl.BlockSpec((bb, bc), lambda b, c: (b, c))
    return pl.pallas_call(
        functools.partial(backward_kernel, num_orders=num_orders),
        grid=(B // bb, C // bc),
        in_specs=[
            tile,
            pl.BlockSpec((bb, N), lambda b, c: (b, 0)),
            pl.BlockSpec((2, bc), lambda b, c: (0, c)),
            pl.BlockSpec((bc, N), lambda b, c: (c, 0)),
        ],
        out_specs=[tile, pl.BlockSpec((1, 1, bc), lambda b, c: (b, 0, c))],
        out_shape=backward_out_shapes(B // bb, z_BC, g_BN, prm_2C, s_CN),
        interpret=interpret,
        **call,
    )(z_BC, g_BN, prm_2C, s_CN)
