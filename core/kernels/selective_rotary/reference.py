"""Selective rotary embedding: the pure-jnp specification every kernel is tested against.

Selective RoPE (paper 5) rotates each query/key pair j by an input-dependent *cumulative* angle

    S_t   = offset + sum_{s <= t} phi_s            (inclusive, float32, per head and pair)
    a_t   = S_t * temp_j
    q'_j  = q_j cos a_t - q_{j+R} sin a_t,    q'_{j+R} = q_j sin a_t + q_{j+R} cos a_t

(half-split pairs: pair j is dims j and j + R, R = K / 2), the same for k. With phi = 1 and temp =
RoPE's frequencies this is RoPE at positions 1..T. `final_state` = offset + sum_t phi is the raw
(pre-temperature) angle carried to the next chunk or decoding step.

Shapes: q_BTHK, k_BTHK [B, T, H, K]; phi_BTHR [B, T, H, R]; temp_R [R]; offset_BHR [B, H, R].
Padding must not advance the angle: zero phi there (see `api.op`'s `mask_BT`).
"""

import jax.numpy as jnp


def cumulative_state(phi_BTHR, offset_BHR=None):
    """S_BTHR = offset + inclusive cumsum over t of phi: the raw angle, float32."""
    S_BTHR = jnp.cumsum(phi_BTHR.astype(jnp.float32), axis=1)
    if offset_BHR is not None:
        S_BTHR = S_BTHR + offset_BHR.astype(jnp.float32)[:, None]
    return S_BTHR


def cumulative_angle(phi_BTHR, temp_R, offset_BHR=None):
    """(angle_BTHR = S * temp, final_state_BHR = S at the last step), both float32."""
    S_BTHR = cumulative_state(phi_BTHR, offset_BHR)
    return S_BTHR * temp_R.astype(jnp.float32), S_BTHR[:, -1]


def rotate_half_split(x_BTHK, angle_BTHR):
    """Rotate pair (j, j + R) of x by angle[..., j]; computed in float32, returned in x's dtype."""
    R = x_BTHK.shape[-1] // 2
    x = x_BTHK.astype(jnp.float32)
    x1, x2 = x[..., :R], x[..., R:]
    cos, sin = jnp.cos(angle_BTHR), jnp.sin(angle_BTHR)
    out = jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
    return out.astype(x_BTHK.dtype)


def check_shapes(q_BTHK, k_BTHK, phi_BTHR, temp_R=None, offset_BHR=None):
    """Raises a one-line ValueError unless the shapes fit [B, T, H, K] with R = K / 2."""
    if q_BTHK.shape != k_BTHK.shape or q_BTHK.shape[-1] % 2:
        raise ValueError(f"q {q_BTHK.shape} and k {k_BTHK.shape} must match with an even K")
    if phi_BTHR.shape != (*q_BTHK.shape[:-1], q_BTHK.shape[-1] // 2):
        raise ValueError(f"phi {phi_BTHR.shape} must be [B, T, H, K/2] for q {q_BTHK.shape}")
    B, _, H, K = q_BTHK.shape
    if temp_R is not None and temp_R.shape != (K // 2,):
        raise ValueError(f"temp {temp_R.shape} must be [R] = ({K // 2},) for q {q_BTHK.shape}")
    if offset_BHR is not None and offset_BHR.shape != (B, H, K // 2):
        raise ValueError(f"offset {offset_BHR.shape} must be [B, H, R] for q {q_BTHK.shape}")


def selective_rotary_reference(q_BTHK, k_BTHK, phi_BTHR, temp_R, offset_BHR=None):
    """(q', k', final_state_BHR): the rotated queries and keys and the carried raw angle."""
    check_shapes(q_BTHK, k_BTHK, phi_BTHR)
    angle_BTHR, final_BHR = cumulative_angle(phi_BTHR, temp_R, offset_BHR)
    return rotate_half_split(q_BTHK, angle_BTHR), rotate_half_split(k_BTHK, angle_BTHR), final_BHR
