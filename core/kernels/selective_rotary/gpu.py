"""GPU (Triton) wrapper: one program per (b, lane block) loops over T tiles with `fori_loop`.

Triton has no sequential grid carry and no scratch memory, so the carry is a `fori_loop`
value inside the program, and each program's block spans the whole (padded) T: grid
(B, C / BC), both independent. Triton needs power-of-two sizes for every load and store and
`tl.dot` needs dims >= 16, so BT and BC are powers of two >= 16 (`kernel.py` pads T to a
multiple of BT and C to a multiple of BC). `pltriton.CompilerParams` selects Triton; without
it jax 0.10.2 picks Mosaic GPU, which overflowed shared memory on this kind of kernel.
"""

import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from core.kernels.selective_rotary.kernel_body import out_shapes, rotate_tile

NUM_WARPS, NUM_STAGES = 4, 2  # untuned: nothing here was compiled on a GPU


def _kernel(temp_ref, off_ref, phi_ref, q_ref, k_ref, qo_ref, ko_ref, fin_ref, *, bt):
    def step(i, carry_1C):
        rows = pl.ds(pl.multiple_of(i * bt, bt), bt)
        return rotate_tile(rows, carry_1C, temp_ref, phi_ref, q_ref, k_ref, qo_ref, ko_ref)

    num_tiles = phi_ref.shape[1] // bt
    fin_ref[0] = lax.fori_loop(0, num_tiles, step, off_ref[0].astype(jnp.float32))


def rotate_gpu(q_B2TC, k_B2TC, phi_BTC, temp_1C, offset_B1C, *, block_t, block_c, interpret=False):
    """(q', k' [B, 2, T, C], final [B, 1, C] f32); T % block_t == 0 and C % block_c == 0."""
    B, _, T, C = q_B2TC.shape
    bc = block_c
    x_spec = pl.BlockSpec((1, 2, T, bc), lambda b, c: (b, 0, 0, c))
    lane_spec = pl.BlockSpec((1, 1, bc), lambda b, c: (b, 0, c))
    return pl.pallas_call(
        functools.partial(_kernel, bt=block_t),
        grid=(B, C // bc),
        in_specs=[
            pl.BlockSpec((1, bc), lambda b, c: (0, c)),
            lane_spec,
            pl.BlockSpec((1, T, bc), lambda b, c: (b, 0, c)),
            x_spec,
            x_spec,
        ],
        out_specs=[x_spec, x_spec, lane_spec],
        out_shape=out_shapes(q_B2TC, k_B2TC, phi_BTC, temp_1C, offset_B1C),
        compiler_params=pltriton.CompilerParams(num_warps=NUM_WARPS, num_stages=NUM_STAGES),
        interpret=interpret,
        name="selective_rotary_gpu",
    )(temp_1C, offset_B1C, phi_BTC, q_B2TC, k_B2TC)
