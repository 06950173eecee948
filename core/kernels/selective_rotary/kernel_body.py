"""The backend-neutral kernel body: one (T-tile x lane-block) step of selective rotary.

Layout (built by `kernel.py`, outside the kernel): heads are folded into the lane dimension,
C = H * R lanes with lane h * R + j = pair j of head h, and the two halves of every pair sit on
a leading axis, so a tile of either half is a dense (BT, BC) slab reached by indexing refs only:

    q_B2TC, k_B2TC   [B, 2, T, C]   x[:, 0] = dims j < R, x[:, 1] = dims j + R
    phi_BTC          [B, T, C]      a free reshape of phi_BTHR
    temp_1C          [1, C]         temp_R tiled over heads
    offset_B1C       [B, 1, C]      float32, the carried raw angle

Why this layout: the rotation is elementwise per (t, head, pair), so folding heads into lanes
fills the 128-lane TPU vregs even for small head dims (R = 32), and putting the halves on a
leading axis avoids lane-offset slices (uncertain on Mosaic) as well as value slicing and
`concatenate` (Triton cannot lower them).
"""

import jax
import jax.numpy as jnp
from jax import lax

from core.kernels import common

_F32 = jnp.float32


def rotate_tile(rows, carry_1C, temp_ref, phi_ref, q_ref, k_ref, qo_ref, ko_ref):
    """Rotates the tile `rows` (a `pl.ds` over the refs' T axis) of q and k; returns new carry.

    S = carry + inclusive cumsum over the tile of phi, computed as a lower-triangular ones
    matmul: Mosaic TPU has no cumsum, and on the MXU it is nearly free. HIGHEST precision
    keeps it exact float32 (the default is bf16 passes on TPU and TF32 on Triton, which would
    ruin angle sums that reach ~100 rad). sin/cos are exact (not approx: angles grow with T).
    """
    phi_TC = phi_ref[0, rows, :].astype(_F32)
    bt = phi_TC.shape[0]
    lower_TT = (
        lax.broadcasted_iota(jnp.int32, (bt, bt), 0) >= lax.broadcasted_iota(jnp.int32, (bt, bt), 1)
    ).astype(_F32)
    S_TC = (
        jnp.dot(lower_TT, phi_TC, precision=lax.Precision.HIGHEST, preferred_element_type=_F32)
        + carry_1C
    )
    angle_TC = S_TC * temp_ref[...].astype(_F32)
    cos_TC, sin_TC = jnp.cos(angle_TC), jnp.sin(angle_TC)
    for x_ref, o_ref in ((q_ref, qo_ref), (k_ref, ko_ref)):
        x0_TC = x_ref[0, 0, rows, :].astype(_F32)
        x1_TC = x_ref[0, 1, rows, :].astype(_F32)
        o_ref[0, 0, rows, :] = (x0_TC * cos_TC - x1_TC * sin_TC).astype(o_ref.dtype)
        o_ref[0, 1, rows, :] = (x0_TC * sin_TC + x1_TC * cos_TC).astype(o_ref.dtype)
    # The sum, not the tile's last row of S: value slicing does not lower on Triton.
    return carry_1C + jnp.sum(phi_TC, axis=0, keepdims=True)


def out_shapes(q_B2TC, k_B2TC, *others):
    """What both wrappers return: q' and k' like their inputs, final state [B, 1, C] float32.

    Inside `jax.shard_map(check_vma=True)` a `pallas_call`'s outputs must say over which mesh
    axes they vary: the union over all kernel inputs (`others` are the remaining ones). Outside
    shard_map that union is empty, which is also what Pallas expects there."""
    B, _, _, C = q_B2TC.shape
    vma = common.vma(q_B2TC, k_B2TC, *others)
    return [
        jax.ShapeDtypeStruct(q_B2TC.shape, q_B2TC.dtype, manual_axis_type=vma),
        jax.ShapeDtypeStruct(k_B2TC.shape, k_B2TC.dtype, manual_axis_type=vma),
        jax.ShapeDtypeStruct((B, 1, C), jnp.float32, manual_axis_type=vma),
    ]
