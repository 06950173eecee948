"""GPU (Triton) wrappers: each program loops over D with `fori_loop`, z in a loop carry.

Triton has no sequential grid carry and no scratch memory, so the D reduction is a
`fori_loop` carry inside one program whose x and W blocks span all of D (loads are still
(BB, BD) and (BC, BD) slices of them):
  * forward: grid (B / BB, C / BC); program (b, c) accumulates its float32 z tile (BB, BC)
    over the D tiles, then runs the epilogue into this column tile's partial truncations
    (`kernel.py` sums the C / BC partials). C is tiled, unlike on TPU: a (BB, all of C) float32
    carry would not fit in registers (1152 columns for R = 256, N = 5);
  * backward: grid (B / BB, C / BC), `kernel_body.backward_kernel` per tile, no loop.
Triton needs power-of-two sizes for every load and store and `tl.dot` needs dims >= 16, so BB,
BC, BD and the padded N are powers of two >= 16. `pltriton.CompilerParams` selects Triton;
without it jax 0.10.2 picks Mosaic GPU, which overflowed shared memory on this kind of kernel.
"""

import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from core.kernels.poly_probe.kernel_body import (
    backward_call,
    forward_epilogue,
    forward_out_shapes,
    project,
)

# Untuned: nothing here was compiled on a GPU. 8 warps, not 4: the epilogues keep three to five
# (BB, BC) float32 arrays live (z, its powers, g, dZ), 32 registers per thread each at 8 warps.
NUM_WARPS, NUM_STAGES = 8, 2


def _fwd_kernel(x_ref, w_ref, prm_ref, s_ref, y_ref, *z_ref, bd, num_orders):
    def step(i, acc_BC):
        cols = pl.ds(pl.multiple_of(i * bd, bd), bd)
        return acc_BC + project(x_ref[:, cols], w_ref[:, cols])

    acc_BC = jnp.zeros((x_ref.shape[0], w_ref.shape[0]), jnp.float32)
    z_BC = lax.fori_loop(0, x_ref.shape[1] // bd, step, acc_BC)
    y_ref[0] = forward_epilogue(z_BC, prm_ref, s_ref, num_orders=num_orders)
    if z_ref:  # save_z
        z_ref[0][...] = z_BC


def forward_gpu(
    x_BD, w_CD, prm_2C, s_CN, *, num_orders, block_b, block_c, block_d, save_z, interpret=False
):
    """(y_PBN, z_BC or None); B % block_b == C % block_c == D % block_d == 0."""
    (B, D), C, N = x_BD.shape, w_CD.shape[0], s_CN.shape[1]
    bb, bc = block_b, block_c
    y_spec = pl.BlockSpec((1, bb, N), lambda b, c: (c, b, 0))
    z_spec = pl.BlockSpec((bb, bc), lambda b, c: (b, c))
    outs = pl.pallas_call(
        functools.partial(_fwd_kernel, bd=block_d, num_orders=num_orders),
        grid=(B // bb, C // bc),
        in_specs=[
            pl.BlockSpec((bb, D), lambda b, c: (b, 0)),
            pl.BlockSpec((bc, D), lambda b, c: (c, 0)),
            pl.BlockSpec((2, bc), lambda b, c: (0, c)),
            pl.BlockSpec((bc, N), lambda b, c: (c, 0)),
        ],
        out_specs=[y_spec, z_spec] if save_z else [y_spec],
        out_shape=forward_out_shapes(C // bc, save_z, x_BD, w_CD, prm_2C, s_CN),
        compiler_params=pltriton.CompilerParams(num_warps=NUM_WARPS, num_stages=NUM_STAGES),
        interpret=interpret,
        name="poly_probe_fwd_gpu",
    )(x_BD, w_CD, prm_2C, s_CN)
    return outs[0], (outs[1] if save_z else None)


def backward_gpu(z_BC, g_BN, prm_2C, s_CN, *, num_orders, block_b, block_c, interpret=False):
    """(dz_BC, dlam_T1C); B % block_b == C % block_c == 0 (`kernel_body.backward_call`)."""
    return backward_call(
        z_BC,
        g_BN,
        prm_2C,
        s_CN,
        num_orders=num_orders,
        block_b=block_b,
        block_c=block_c,
        interpret=interpret,
        compiler_params=pltriton.CompilerParams(num_warps=NUM_WARPS, num_stages=NUM_STAGES),
        name="poly_probe_bwd_gpu",
    )
