"""TPU (Mosaic) wrappers: D is the innermost grid axis, the z accumulator resident across it.

Forward: grid (B / BB, C / BC, D / BD), semantics FWD_SEMANTICS = ("parallel", "parallel",
"arbitrary"). The float32 z tile (BB, BC) is zeroed at d == 0, gets x[b, d-tile] W[c, d-tile]^T
added at every step and feeds the epilogue at the last d, which writes this column tile's
partial truncations (1, BB, N). The accumulator is the z output block itself when z is saved
for the backward (its index ignores d, so it stays in VMEM and is written back once), else a
VMEM scratch. By default BC covers all of C (1152 padded columns for R = 256, N = 5), so x is
read from HBM once.

Backward: grid (B / BB, C / BC), BWD_SEMANTICS = ("parallel", "parallel"): the epilogue's
backward (`kernel_body.backward_kernel`) per tile, nothing carried.

Blocks obey Mosaic's last-two-dims rule (multiples of (8, 128) or the full dims): BB a multiple
of 8 (16 for bfloat16 packing), BC and BD multiples of 128, N padded to 128 lanes so the y
and G blocks are lane-dense. Marking D "parallel" is a real bug (steps could run
out of order or on another core, zeroing or splitting the accumulator and running the epilogue
on a partial sum); `pltpu.InterpretParams` catches it.
"""

import functools

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from core.kernels.poly_probe.kernel_body import (
    backward_call,
    forward_epilogue,
    forward_out_shapes,
    project,
)

FWD_SEMANTICS = ("parallel", "parallel", "arbitrary")
BWD_SEMANTICS = ("parallel", "parallel")


def _fwd_kernel(x_ref, w_ref, prm_ref, s_ref, y_ref, acc_ref, *, num_orders):
    """acc_ref: the z output block (save_z) or a VMEM scratch, (BB, BC) float32."""
    d = pl.program_id(2)

    @pl.when(d == 0)
    def _init():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    acc_ref[...] += project(x_ref[...], w_ref[...])

    @pl.when(d == pl.num_programs(2) - 1)
    def _epilogue():
        y_ref[0] = forward_epilogue(acc_ref[...], prm_ref, s_ref, num_orders=num_orders)


def forward_tpu(
    x_BD,
    w_CD,
    prm_2C,
    s_CN,
    *,
    num_orders,
    block_b,
    block_c,
    block_d,
    save_z,
    interpret=False,
    dimension_semantics=None,
):
    """(y_PBN, z_BC or None); B % block_b == C % block_c == D % block_d == 0.

    `dimension_semantics` defaults to the module's FWD_SEMANTICS (read at call time, so a test
    can swap in a wrong one and check that `pltpu.InterpretParams` notices)."""
    (B, D), C, N = x_BD.shape, w_CD.shape[0], s_CN.shape[1]
    bb, bc, bd = block_b, block_c, block_d
    y_spec = pl.BlockSpec((1, bb, N), lambda b, c, d: (c, b, 0))
    z_spec = pl.BlockSpec((bb, bc), lambda b, c, d: (b, c))
    outs = pl.pallas_call(
        functools.partial(_fwd_kernel, num_orders=num_orders),
        grid=(B // bb, C // bc, D // bd),
        in_specs=[
            pl.BlockSpec((bb, bd), lambda b, c, d: (b, d)),
            pl.BlockSpec((bc, bd), lambda b, c, d: (c, d)),
            pl.BlockSpec((2, bc), lambda b, c, d: (0, c)),
            pl.BlockSpec((bc, N), lambda b, c, d: (c, 0)),
        ],
        out_specs=[y_spec, z_spec] if save_z else [y_spec],
        out_shape=forward_out_shapes(C // bc, save_z, x_BD, w_CD, prm_2C, s_CN),
        scratch_shapes=[] if save_z else [pltpu.VMEM((bb, bc), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=dimension_semantics or FWD_SEMANTICS
        ),
        interpret=interpret,
        name="poly_probe_fwd_tpu",
    )(x_BD, w_CD, prm_2C, s_CN)
    return outs[0], (outs[1] if save_z else None)


def backward_tpu(z_BC, g_BN, prm_2C, s_CN, *, num_orders, block_b, block_c, interpret=False):
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
        compiler_params=pltpu.CompilerParams(dimension_semantics=BWD_SEMANTICS),
        name="poly_probe_bwd_tpu",
    )
