"""The truncated polynomial probe through the Pallas kernels: layout, padding, custom_vjp.

`poly_probe_pallas(x, w0, w1, U, lam, config)` has `reference.truncations`' semantics. Around
the kernels XLA only stacks w1 and U into W_all [C, D] (C = 1 + K R; one copy of the params),
builds the [2, C] lam/order table (the order row and the 0/1 matrix S are constants), pads,
sums the per-column-tile partials and adds w0. The forward is one kernel: the GEMM
Z = x W_all^T tiled over B and D (D accumulated in float32) with the epilogue fused, so Z never
reaches HBM unless the backward needs it.

Padding is inert: padded rows of x are zero and sliced off (their G is zero in the backward);
padded D columns are zero in x and W_all; padded columns of C have zero W_all rows, lam = 0
and order = 0 (zero S rows); padded truncations have zero S columns and zero G.

Backward (`pallas_call` has no autodiff). Residuals: the padded operands and Z [B, C] float32,
saved by the forward (the fwd rule runs the kernel with `save_z`; the primal call does not
write Z). Saved rather than recomputed: recomputing Z is a third B x C x D GEMM next to the
backward's two (+50% of its flops), while saving it costs one B x C float32 write and read
(4.6 KB a row at R = 256, N = 5, about half a bfloat16 row of x at D = 4096); the probe's
batches are rows of cached activations, so this memory is not what limits them.
  * Pallas (`kernel_body.backward_kernel`): g per column = G S^T (the reverse cumsum over
    orders), dZ = g (order lam) z^(order-1), per-row-tile sums of g z^order for dlam;
  * XLA: dW_all = dZ^T x (-> dw1, dU), dx = dZ W_all, both float32 at HIGHEST like the
    reference, and dw0 = sum G. These are plain dense GEMMs that XLA already runs near peak;
    fusing dx into the Pallas kernel would save only dZ's round trip through HBM.
No B x C x D intermediate exists anywhere. Higher-order AD through this path is not supported
(the backward calls `pallas_call`).
"""

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from core.kernels import common
from core.kernels.poly_probe import gpu, tpu
from core.kernels.poly_probe.reference import check_shapes

_F32 = jnp.float32
_HIGHEST = jax.lax.Precision.HIGHEST

BACKENDS = ("tpu", "gpu")
# Untuned: nothing here ran on a TPU or GPU. TPU: all of C in one tile (block_c >= 1152 covers
# R = 256, N = 5); at BB = 256, BD = 512, float32, each buffer holds x 0.5 MB, W 2.4 MB, z 1.2
# MB, S 0.6 MB: ~10 MB double-buffered, under the 16 MB default scoped VMEM of v4/v5e.
# GPU: a (64, 128) float32 accumulator per program, the usual Triton GEMM tile.
DEFAULT_BLOCKS = {
    "tpu": dict(block_b=256, block_c=2048, block_d=512),
    "gpu": dict(block_b=64, block_c=128, block_d=64),
}
FORWARD = {"tpu": tpu.forward_tpu, "gpu": gpu.forward_gpu}
BACKWARD = {"tpu": tpu.backward_tpu, "gpu": gpu.backward_gpu}


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Which wrapper runs, how, and its block sizes (None = DEFAULT_BLOCKS[backend]).

    interpret: False (compile for `backend`), True (Pallas HLO interpreter, runs grid steps in
    order), or a `pltpu.InterpretParams` (TPU semantics simulated; backend="tpu" only).
    block_b, block_c, block_d: the row, column (projection) and reduction tiles; the backward
    uses block_b and block_c too.
    """

    backend: str
    interpret: Any = False
    block_b: int | None = None
    block_c: int | None = None
    block_d: int | None = None

    def get(self, name):
        value = getattr(self, name)
        return DEFAULT_BLOCKS[self.backend][name] if value is None else value


class Layout(NamedTuple):
    """Tiles and padded sizes for one (B, C, D, N)."""

    bb: int
    bc: int
    bd: int
    B_pad: int
    C_pad: int
    D_pad: int
    N_pad: int


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _lane_tile(n_pad: int, limit: int) -> int:
    """The largest multiple of 128 dividing n_pad (itself a multiple of 128) up to `limit`."""
    groups = n_pad // 128
    return 128 * max(d for d in range(1, groups + 1) if groups % d == 0 and 128 * d <= limit)


def choose_layout(config: KernelConfig, B: int, C: int, D: int, N: int, narrow: bool) -> Layout:
    """Tiles per backend; `narrow` = x is 2 bytes wide (bfloat16 packs 16 rows per vreg).

    TPU: BB a multiple of 8 (16 if narrow); C and D padded to multiples of 128 lanes (an
    aligned MXU contraction and lane-dense z tiles; model widths are multiples of 128 anyway,
    so x is rarely copied) and BC, BD the largest 128-multiples dividing them up to block_c
    (all of C by default) and block_d; N padded to 128 lanes (lane-dense y and G blocks).
    GPU (Triton): BB, BC, BD powers of two >= 16, each axis padded to a multiple of its tile;
    N padded to a power of two >= 16 (the epilogue's `tl.dot` with S).
    """
    get = config.get
    if config.backend == "tpu":
        sub = 16 if narrow else 8
        bb = min(_round_up(get("block_b"), sub), _round_up(B, sub))
        C_pad = _round_up(C, 128)
        bc = _lane_tile(C_pad, max(get("block_c"), 128))
        D_pad = _round_up(D, 128)
        bd = _lane_tile(D_pad, max(get("block_d"), 128))
        N_pad = _round_up(N, 128)
    else:
        pow2 = lambda block, n: max(16, min(_next_pow2(block), _next_pow2(n)))
        bb, bc, bd = pow2(get("block_b"), B), pow2(get("block_c"), C), pow2(get("block_d"), D)
        C_pad, D_pad, N_pad = _round_up(C, bc), _round_up(D, bd), max(16, _next_pow2(N))
    return Layout(bb, bc, bd, _round_up(B, bb), C_pad, D_pad, N_pad)


def column_orders(K: int, R: int, C_pad: int) -> np.ndarray:
    """[C_pad] float32: 1 for the linear column, k for U[k-2]'s R columns, 0 for padding."""
    orders = np.concatenate([[1.0], np.repeat(np.arange(2, K + 2), R)])
    return np.pad(orders, (0, C_pad - orders.size)).astype(np.float32)


def cumulative_orders(orders_C: np.ndarray, N: int, N_pad: int) -> np.ndarray:
    """S [C_pad, N_pad] 0/1 float32: column c feeds truncation j iff 1 <= order[c] <= j + 1."""
    j = np.arange(N_pad)
    feeds = (orders_C[:, None] >= 1) & (orders_C[:, None] <= j + 1) & (j < N)
    return feeds.astype(np.float32)


def _pad2(a, rows, cols):
    return jnp.pad(a, ((0, rows - a.shape[0]), (0, cols - a.shape[1])))


class Operands(NamedTuple):
    """The kernels' padded inputs (see `kernel_body`'s layout)."""

    x_BD: jax.Array
    w_CD: jax.Array
    prm_2C: jax.Array
    s_CN: jax.Array


def _operands(x_BD, w1_D, U_KRD, lam_KR, lay: Layout) -> Operands:
    K, R, D = U_KRD.shape
    w_CD = jnp.concatenate([w1_D[None], U_KRD.reshape(K * R, D)])
    orders_C = column_orders(K, R, lay.C_pad)
    lam_C = jnp.concatenate([jnp.ones(1, _F32), lam_KR.astype(_F32).reshape(K * R)])
    lam_C = jnp.pad(lam_C, (0, lay.C_pad - lam_C.size))
    return Operands(
        x_BD=_pad2(x_BD, lay.B_pad, lay.D_pad),
        w_CD=_pad2(w_CD, lay.C_pad, lay.D_pad),
        prm_2C=jnp.stack([lam_C, jnp.asarray(orders_C)]),
        s_CN=jnp.asarray(cumulative_orders(orders_C, K + 1, lay.N_pad)),
    )


def _layout(config: KernelConfig, x_BD, U_KRD) -> Layout:
    if config.backend not in BACKENDS:
        raise ValueError(f"backend={config.backend!r} is unknown; expected one of {BACKENDS}")
    (B, D), (K, R, _) = x_BD.shape, U_KRD.shape
    narrow = jnp.dtype(x_BD.dtype).itemsize < 4
    return choose_layout(config, B, 1 + K * R, D, K + 1, narrow)


def forward(x_BD, w0, w1_D, U_KRD, lam_KR, config: KernelConfig, *, save_z=False):
    """(Y_BN float32, and if `save_z` the residuals (Operands, z_BC padded)) by the kernel."""
    check_shapes(x_BD, w0, w1_D, U_KRD, lam_KR)
    lay = _layout(config, x_BD, U_KRD)
    ops = _operands(x_BD, w1_D, U_KRD, lam_KR, lay)
    y_PBN, z_BC = FORWARD[config.backend](
        *ops,
        num_orders=U_KRD.shape[0] + 1,
        block_b=lay.bb,
        block_c=lay.bc,
        block_d=lay.bd,
        save_z=save_z,
        interpret=config.interpret,
    )
    B, N = x_BD.shape[0], U_KRD.shape[0] + 1
    Y_BN = jnp.sum(y_PBN, axis=0)[:B, :N] + jnp.asarray(w0, _F32)
    return Y_BN, ((ops, z_BC) if save_z else None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def poly_probe_pallas(x_BD, w0, w1_D, U_KRD, lam_KR, config: KernelConfig):
    """Y_BN by the Pallas kernel; differentiable in all five arrays (first order)."""
    return forward(x_BD, w0, w1_D, U_KRD, lam_KR, config)[0]


def _fwd(x_BD, w0, w1_D, U_KRD, lam_KR, config):
    Y_BN, (ops, z_BC) = forward(x_BD, w0, w1_D, U_KRD, lam_KR, config, save_z=True)
    return Y_BN, (x_BD, w0, w1_D, U_KRD, lam_KR, ops, z_BC)


def _bwd(config, residuals, g_BN):
    *primals, ops, z_BC = residuals
    x_BD, _, _, U_KRD, _ = primals
    (B, D), (K, R, _) = x_BD.shape, U_KRD.shape
    lay = _layout(config, x_BD, U_KRD)
    g_BN = jnp.asarray(g_BN, _F32)
    dz_BC, dlam_T1C = BACKWARD[config.backend](
        z_BC,
        _pad2(g_BN, lay.B_pad, lay.N_pad),
        ops.prm_2C,
        ops.s_CN,
        num_orders=K + 1,
        block_b=lay.bb,
        block_c=lay.bc,
        interpret=config.interpret,
    )
    contract_b = (((0,), (0,)), ((), ()))  # dZ^T x: over the rows
    dw_CD = jax.lax.dot_general(
        dz_BC, ops.x_BD.astype(_F32), contract_b, _HIGHEST, preferred_element_type=_F32
    )
    dx_BD = jnp.dot(dz_BC, ops.w_CD.astype(_F32), precision=_HIGHEST)
    KR = K * R
    grads = (
        dx_BD[:B, :D],
        jnp.sum(g_BN),  # every truncation includes w0
        dw_CD[0, :D],
        dw_CD[1 : 1 + KR, :D].reshape(K, R, D),
        jnp.sum(dlam_T1C, axis=(0, 1))[1 : 1 + KR].reshape(K, R),
    )
    return tuple(common.like_primal(g, p) for g, p in zip(grads, primals, strict=True))


poly_probe_pallas.defvjp(_fwd, _bwd)
