"""TPU (Mosaic) wrapper: the sequential T axis is a grid axis with the carry in VMEM scratch.

Grid (B, C / BC, T / BT) with semantics ("parallel", "parallel", "arbitrary"): T is innermost
and "arbitrary", so each (b, lane block) visits its T tiles in order on one core and the fp32
carry of BC values survives between steps in a (1, BC) VMEM scratch, initialised from the
offset at t == 0. Blocks: (BT, BC) tiles with BT a multiple of 8 (16 for bf16 packing) and BC
a multiple of 128 or the full C, per Mosaic's last-two-dims rule. Marking T "parallel" is a
real bug (steps would run out of order or on another core); `pltpu.InterpretParams` catches it.
"""

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from core.kernels.selective_rotary.kernel_body import out_shapes, rotate_tile

SEMANTICS = ("parallel", "parallel", "arbitrary")


def _kernel(temp_ref, off_ref, phi_ref, q_ref, k_ref, qo_ref, ko_ref, fin_ref, carry_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        carry_ref[...] = off_ref[0].astype(jnp.float32)

    rows = pl.ds(0, phi_ref.shape[1])  # the whole (BT, BC) block
    carry_ref[...] = rotate_tile(
        rows, carry_ref[...], temp_ref, phi_ref, q_ref, k_ref, qo_ref, ko_ref
    )
    fin_ref[0] = carry_ref[...]  # the block stays resident across T; written back at its end


def rotate_tpu(
    q_B2TC,
    k_B2TC,
    phi_BTC,
    temp_1C,
    offset_B1C,
    *,
    block_t,
    block_c,
    interpret=False,
    dimension_semantics=None,
):
    """(q', k' [B, 2, T, C], final [B, 1, C] f32); T % block_t == 0 and C % block_c == 0.

    `dimension_semantics` defaults to the module's SEMANTICS (read at call time, so a test can
    swap in a wrong one and check that `pltpu.InterpretParams` notices).
    """
    B, _, T, C = q_B2TC.shape
    bt, bc = block_t, block_c
    x_spec = pl.BlockSpec((1, 2, bt, bc), lambda b, c, t: (b, 0, t, c))
    lane_spec = pl.BlockSpec((1, 1, bc), lambda b, c, t: (b, 0, c))
    return pl.pallas_call(
        _kernel,
        grid=(B, C // bc, T // bt),
        in_specs=[
            pl.BlockSpec((1, bc), lambda b, c, t: (0, c)),
            lane_spec,
            pl.BlockSpec((1, bt, bc), lambda b, c, t: (b, t, c)),
            x_spec,
            x_spec,
        ],
        out_specs=[x_spec, x_spec, lane_spec],
        out_shape=out_shapes(q_B2TC, k_B2TC, phi_BTC, temp_1C, offset_B1C),
        scratch_shapes=[pltpu.VMEM((1, bc), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=dimension_semantics or SEMANTICS),
        interpret=interpret,
        name="selective_rotary_tpu",
    )(temp_1C, offset_B1C, phi_BTC, q_B2TC, k_B2TC)
