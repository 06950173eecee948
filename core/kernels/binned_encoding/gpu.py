"""GPU (Triton) wrappers: each program loops over its reduced axis with `fori_loop`.

Triton has no sequential grid carry and no scratch memory, so every reduction is a loop
carry inside one program, whose blocks span the whole reduced axis (loads and stores are
still (BN, BM)-sized slices of them):
  * forward: grid (N / BN, F / BF); each program loops over the M / BM bin tiles,
    accumulating f_tile @ W1[m-tile] onto b1 in a (BN, BF) float32 carry;
  * backward: grid (P, M / BM); program (p, m) loops over the T pixel tiles of partial p,
    carrying dW1 (BM, F) and seven (1, BM) per-bin sums; `kernel.py` sums the P partials.
    P > 1 by default (1024 pixels per partial) so that there are enough programs for the
    GPU's SMs: M / BM alone is ~15 for M = 456.
Triton needs power-of-two sizes for every load and store and `tl.dot` needs dims >= 16, so
BN, BM, BF and the padded F (the backward loads whole G rows) are powers of two >= 16.
`pltriton.CompilerParams` selects Triton; without it jax 0.10.2 picks Mosaic GPU.
"""

import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from core.kernels.binned_encoding.kernel_body import (
    GRAD_ROWS,
    backward_out_shapes,
    backward_tile,
    forward_out_shape,
    forward_tile,
)

NUM_WARPS, NUM_STAGES = 4, 2  # untuned: nothing here was compiled on a GPU
BWD_NUM_WARPS = 8  # the backward carries a (BM, F) dW1 tile: more registers across more warps


def _fwd_kernel(xy_ref, prm_ref, w1_ref, b1_ref, z_ref, *, bm):
    rows = pl.ds(0, z_ref.shape[0])

    def step(i, acc_NF):
        cols = pl.ds(pl.multiple_of(i * bm, bm), bm)
        return acc_NF + forward_tile(rows, cols, xy_ref, prm_ref, w1_ref)

    acc_NF = jnp.broadcast_to(b1_ref[...].astype(jnp.float32), z_ref.shape)
    z_ref[...] = lax.fori_loop(0, w1_ref.shape[0] // bm, step, acc_NF)


def encode_dense_gpu(xy_2N1, prm_8M, w1_MF, b1_1F, *, block_n, block_m, block_f, interpret=False):
    """z [N, F] float32; N % block_n == M % block_m == F % block_f == 0."""
    N, (M, F) = xy_2N1.shape[1], w1_MF.shape
    bn, bf = block_n, block_f
    return pl.pallas_call(
        functools.partial(_fwd_kernel, bm=block_m),
        grid=(N // bn, F // bf),
        in_specs=[
            pl.BlockSpec((2, bn, 1), lambda n, f: (0, n, 0)),
            pl.BlockSpec((8, M), lambda n, f: (0, 0)),
            pl.BlockSpec((M, bf), lambda n, f: (0, f)),
            pl.BlockSpec((1, bf), lambda n, f: (0, f)),
        ],
        out_specs=pl.BlockSpec((bn, bf), lambda n, f: (n, f)),
        out_shape=forward_out_shape(xy_2N1, prm_8M, w1_MF, b1_1F),
        compiler_params=pltriton.CompilerParams(num_warps=NUM_WARPS, num_stages=NUM_STAGES),
        interpret=interpret,
        name="binned_encoding_fwd_gpu",
    )(xy_2N1, prm_8M, w1_MF, b1_1F)


def _bwd_kernel(xy_ref, prm_ref, w1_ref, g_ref, dprm_ref, dw1_ref, *, bn, num_grads):
    bm, F = w1_ref.shape
    cols = pl.ds(0, bm)

    def step(i, carry):
        dw1_MF, d_rows = carry
        rows = pl.ds(pl.multiple_of(i * bn, bn), bn)
        tile_dw1_MF, tile_rows = backward_tile(rows, cols, xy_ref, prm_ref, w1_ref, g_ref)
        return dw1_MF + tile_dw1_MF, tuple(a + d for a, d in zip(d_rows, tile_rows, strict=True))

    zero_row = jnp.zeros((1, bm), jnp.float32)
    init = (jnp.zeros((bm, F), jnp.float32), (zero_row,) * num_grads)
    dw1_MF, d_rows = lax.fori_loop(0, g_ref.shape[0] // bn, step, init)
    dw1_ref[0] = dw1_MF
    for r, d_1M in enumerate(d_rows):
        dprm_ref[0, pl.ds(r, 1), :] = d_1M
    for r in range(num_grads, dprm_ref.shape[1]):  # the padding row(s)
        dprm_ref[0, pl.ds(r, 1), :] = zero_row


def encode_dense_bwd_gpu(
    xy_2N1, prm_8M, w1_MF, g_NF, *, block_n, block_m, num_partials, interpret=False
):
    """(dprm [P, 8, M], dW1 [P, M, F]) partials, P = num_partials; N % (P * block_n) == 0,
    M % block_m == 0 and F a power of two."""
    N, (M, F) = xy_2N1.shape[1], w1_MF.shape
    bm, P = block_m, num_partials
    R = N // P  # pixels per partial
    return pl.pallas_call(
        functools.partial(_bwd_kernel, bn=block_n, num_grads=len(GRAD_ROWS)),
        grid=(P, M // bm),
        in_specs=[
            pl.BlockSpec((2, R, 1), lambda p, m: (0, p, 0)),
            pl.BlockSpec((8, bm), lambda p, m: (0, m)),
            pl.BlockSpec((bm, F), lambda p, m: (m, 0)),
            pl.BlockSpec((R, F), lambda p, m: (p, 0)),
        ],
        out_specs=[
            pl.BlockSpec((1, 8, bm), lambda p, m: (p, 0, m)),
            pl.BlockSpec((1, bm, F), lambda p, m: (p, m, 0)),
        ],
        out_shape=backward_out_shapes(P, xy_2N1, prm_8M, w1_MF, g_NF),
        compiler_params=pltriton.CompilerParams(num_warps=BWD_NUM_WARPS, num_stages=NUM_STAGES),
        interpret=interpret,
        name="binned_encoding_bwd_gpu",
    )(xy_2N1, prm_8M, w1_MF, g_NF)
