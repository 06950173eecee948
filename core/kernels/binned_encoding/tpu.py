"""TPU (Mosaic) wrappers: the reduced axis is the innermost grid axis, outputs resident across it.

Forward: grid (N / BN, F / BF, M / BM), semantics FWD_SEMANTICS = ("parallel", "parallel",
"arbitrary"). The z block (BN, BF) keeps its index while m runs, so it stays in VMEM and is
the float32 accumulator: set to b1 at m == 0, then += f_tile @ W1[m-tile] per step, written
back to HBM once after the last m.

Backward: grid (P, M / BM, T), semantics BWD_SEMANTICS = ("parallel", "parallel",
"arbitrary"): partial p reduces its T pixel tiles (tiles p*T .. p*T + T - 1) into resident
dprm (1, 8, BM) and dW1 (1, BM, F) blocks, zeroed at t == 0; `kernel.py` sums the P partials
(P = 1 by default: the whole reduction happens here).

Blocks obey Mosaic's last-two-dims rule (multiples of (8, 128) or the full dims): BN is a
multiple of 8, BM of 128 (the f tile's lanes and the MXU contraction), BF of 128 or all of F.
Marking a reduced axis "parallel" is a real bug (steps could run out of order or on another
core, re-zeroing or splitting the accumulator); `pltpu.InterpretParams` catches it.
"""

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from core.kernels.binned_encoding.kernel_body import (
    backward_out_shapes,
    backward_tile,
    forward_out_shape,
    forward_tile,
)

FWD_SEMANTICS = ("parallel", "parallel", "arbitrary")
BWD_SEMANTICS = ("parallel", "parallel", "arbitrary")


def _fwd_kernel(xy_ref, prm_ref, w1_ref, b1_ref, z_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        z_ref[...] = jnp.broadcast_to(b1_ref[...].astype(jnp.float32), z_ref.shape)

    rows, cols = pl.ds(0, z_ref.shape[0]), pl.ds(0, w1_ref.shape[0])  # the whole blocks
    z_ref[...] += forward_tile(rows, cols, xy_ref, prm_ref, w1_ref)


def encode_dense_tpu(
    xy_2N1,
    prm_8M,
    w1_MF,
    b1_1F,
    *,
    block_n,
    block_m,
    block_f,
    interpret=False,
    dimension_semantics=None,
):
    """z [N, F] float32; N % block_n == M % block_m == F % block_f == 0.

    `dimension_semantics` defaults to the module's FWD_SEMANTICS (read at call time, so a test
    can swap in a wrong one and check that `pltpu.InterpretParams` notices)."""
    N, (M, F) = xy_2N1.shape[1], w1_MF.shape
    bn, bm, bf = block_n, block_m, block_f
    return pl.pallas_call(
        _fwd_kernel,
        grid=(N // bn, F // bf, M // bm),
        in_specs=[
            pl.BlockSpec((2, bn, 1), lambda n, f, m: (0, n, 0)),
            pl.BlockSpec((8, bm), lambda n, f, m: (0, m)),
            pl.BlockSpec((bm, bf), lambda n, f, m: (m, f)),
            pl.BlockSpec((1, bf), lambda n, f, m: (0, f)),
        ],
        out_specs=pl.BlockSpec((bn, bf), lambda n, f, m: (n, f)),
        out_shape=forward_out_shape(xy_2N1, prm_8M, w1_MF, b1_1F),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=dimension_semantics or FWD_SEMANTICS
        ),
        interpret=interpret,
        name="binned_encoding_fwd_tpu",
    )(xy_2N1, prm_8M, w1_MF, b1_1F)


def _bwd_kernel(xy_ref, prm_ref, w1_ref, g_ref, dprm_ref, dw1_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        dprm_ref[...] = jnp.zeros(dprm_ref.shape, jnp.float32)
        dw1_ref[...] = jnp.zeros(dw1_ref.shape, jnp.float32)

    rows, cols = pl.ds(0, g_ref.shape[0]), pl.ds(0, w1_ref.shape[0])
    dw1_MF, d_rows = backward_tile(rows, cols, xy_ref, prm_ref, w1_ref, g_ref)
    dw1_ref[0] += dw1_MF
    for r, d_1M in enumerate(d_rows):
        dprm_ref[0, pl.ds(r, 1), :] += d_1M


def encode_dense_bwd_tpu(
    xy_2N1,
    prm_8M,
    w1_MF,
    g_NF,
    *,
    block_n,
    block_m,
    num_partials,
    interpret=False,
    dimension_semantics=None,
):
    """(dprm [P, 8, M], dW1 [P, M, F]) partials, P = num_partials; N % (P * block_n) == 0 and
    M % block_m == 0. `dimension_semantics` defaults to BWD_SEMANTICS (read at call time)."""
    N, (M, F) = xy_2N1.shape[1], w1_MF.shape
    bn, bm, P = block_n, block_m, num_partials
    T = N // (bn * P)  # pixel tiles per partial
    return pl.pallas_call(
        _bwd_kernel,
        grid=(P, M // bm, T),
        in_specs=[
            pl.BlockSpec((2, bn, 1), lambda p, m, t: (0, p * T + t, 0)),
            pl.BlockSpec((8, bm), lambda p, m, t: (0, m)),
            pl.BlockSpec((bm, F), lambda p, m, t: (m, 0)),
            pl.BlockSpec((bn, F), lambda p, m, t: (p * T + t, 0)),
        ],
        out_specs=[
            pl.BlockSpec((1, 8, bm), lambda p, m, t: (p, 0, m)),
            pl.BlockSpec((1, bm, F), lambda p, m, t: (p, m, 0)),
        ],
        out_shape=backward_out_shapes(P, xy_2N1, prm_8M, w1_MF, g_NF),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=dimension_semantics or BWD_SEMANTICS
        ),
        interpret=interpret,
        name="binned_encoding_bwd_tpu",
    )(xy_2N1, prm_8M, w1_MF, g_NF)
