"""Selective rotary through the Pallas kernels: layout, padding, and the `custom_vjp`.

`selective_rotary_pallas(q, k, phi, temp, offset, config)` has the reference's semantics
(offset required). The layout transform to `kernel_body`'s [B, 2, T, H*R] is one transposing
copy of q and k each way, done by XLA around the kernel (the kernel itself reads q, k, phi
once and writes q', k' once).

Backward (`pallas_call` has no autodiff), with residuals = the inputs only (the T x R angle
buffer is recomputed, not stored):
  * dq, dk in Pallas: the forward kernel applied to the cotangents with phi and offset
    negated, which negates S and so the angle, and R(a)^T = R(-a);
  * everything else in jnp (XLA fuses it): S recomputed by cumsum, then per pair
    g_angle = sum over q and k of (gs cos - gc sin), gc = g0 x0 + g1 x1, gs = g1 x0 - g0 x1,
    with x the *input* q or k; g_S = g_angle * temp, plus the final_state cotangent at the last
    step (final_state = S_T depends on every phi_t and on offset); d_phi = reverse cumsum of
    g_S, d_offset = sum_t g_S, d_temp = sum_{b,t,h} g_angle * S (no division by temp).
Higher-order AD through this path is not supported (the backward calls `pallas_call`).
"""

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from core.kernels import common
from core.kernels.selective_rotary import gpu, tpu
from core.kernels.selective_rotary.reference import check_shapes, cumulative_state

BACKENDS = ("tpu", "gpu")
DEFAULT_BLOCKS = {"tpu": (128, 512), "gpu": (32, 64)}  # (block_t, block_c); untuned


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Which wrapper runs, how, and its block sizes (None = DEFAULT_BLOCKS).

    interpret: False (compile for `backend`), True (Pallas HLO interpreter, runs grid steps in
    order), or a `pltpu.InterpretParams` (TPU semantics simulated; backend="tpu" only).
    """

    backend: str
    interpret: Any = False
    block_t: int | None = None
    block_c: int | None = None


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def choose_blocks(config: KernelConfig, T: int, C: int, narrow: bool) -> tuple[int, int]:
    """(BT, BC) for this backend; `narrow` = some operand is 2 bytes wide (bf16 packing)."""
    default_t, default_c = DEFAULT_BLOCKS[config.backend]
    block_t, block_c = config.block_t or default_t, config.block_c or default_c
    if config.backend == "tpu":
        sub = 16 if narrow else 8  # sublanes per (packed) vreg tile
        bt = min(_round_up(block_t, sub), _round_up(T, sub))
        if C % 128:
            return bt, C  # the full lane dim is always a legal block
        groups = C // 128
        g = max(d for d in range(1, groups + 1) if groups % d == 0 and 128 * d <= max(block_c, 128))
        return bt, 128 * g
    # Triton: powers of two, >= 16 for tl.dot.
    bt = max(16, min(_next_pow2(block_t), _next_pow2(T)))
    bc = max(16, min(_next_pow2(block_c), _next_pow2(C)))
    return bt, bc


def _to_lanes(x_BTHK, T_pad, C_pad):
    """[B, T, H, 2R] -> [B, 2, T_pad, C_pad]: halves on a leading axis, heads folded into lanes."""
    B, T, H, K = x_BTHK.shape
    R = K // 2
    x = x_BTHK.reshape(B, T, H, 2, R).transpose(0, 3, 1, 2, 4).reshape(B, 2, T, H * R)
    return jnp.pad(x, ((0, 0), (0, 0), (0, T_pad - T), (0, C_pad - H * R)))


def _from_lanes(x_B2TC, T, H, R):
    B = x_B2TC.shape[0]
    x = x_B2TC[:, :, :T, : H * R].reshape(B, 2, T, H, R)
    return x.transpose(0, 2, 3, 1, 4).reshape(B, T, H, 2 * R)


def rotate_pallas(q_BTHK, k_BTHK, phi_BTHR, temp_R, offset_BHR, config: KernelConfig):
    """Forward only: (q', k', final_state_BHR) through the kernel that `config` names."""
    if config.backend not in BACKENDS:
        raise ValueError(f"backend={config.backend!r} is unknown; expected one of {BACKENDS}")
    check_shapes(q_BTHK, k_BTHK, phi_BTHR, temp_R, offset_BHR)
    B, T, H, K = q_BTHK.shape
    R, C = K // 2, (K // 2) * H
    narrow = min(jnp.dtype(a.dtype).itemsize for a in (q_BTHK, k_BTHK, phi_BTHR)) < 4
    bt, bc = choose_blocks(config, T, C, narrow)
    T_pad, C_pad = _round_up(T, bt), _round_up(C, bc)
    # Zero padding is inert: padded steps come after the real ones (phi = 0 there), padded
    # lanes have phi = temp = offset = 0 and x = 0; both are sliced off below.
    phi_BTC = jnp.pad(phi_BTHR.reshape(B, T, C), ((0, 0), (0, T_pad - T), (0, C_pad - C)))
    temp_1C = jnp.pad(jnp.tile(temp_R.astype(jnp.float32), H), (0, C_pad - C))[None]
    offset_B1C = jnp.pad(
        offset_BHR.astype(jnp.float32).reshape(B, 1, C), ((0, 0),) * 2 + ((0, C_pad - C),)
    )
    wrapper = tpu.rotate_tpu if config.backend == "tpu" else gpu.rotate_gpu
    qo, ko, fin_B1C = wrapper(
        _to_lanes(q_BTHK, T_pad, C_pad),
        _to_lanes(k_BTHK, T_pad, C_pad),
        phi_BTC,
        temp_1C,
        offset_B1C,
        block_t=bt,
        block_c=bc,
        interpret=config.interpret,
    )
    final_BHR = fin_B1C[:, 0, :C].reshape(B, H, R)
    return _from_lanes(qo, T, H, R), _from_lanes(ko, T, H, R), final_BHR


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def selective_rotary_pallas(q_BTHK, k_BTHK, phi_BTHR, temp_R, offset_BHR, config: KernelConfig):
    """(q', k', final_state_BHR) by the Pallas kernel; differentiable in the first five args."""
    return rotate_pallas(q_BTHK, k_BTHK, phi_BTHR, temp_R, offset_BHR, config)


def _fwd(q_BTHK, k_BTHK, phi_BTHR, temp_R, offset_BHR, config):
    out = rotate_pallas(q_BTHK, k_BTHK, phi_BTHR, temp_R, offset_BHR, config)
    return out, (q_BTHK, k_BTHK, phi_BTHR, temp_R, offset_BHR)


def _angle_cotangent(x_BTHK, g_BTHK, cos_BTHR, sin_BTHR):
    """dL/d(angle) from one rotated tensor: gs cos - gc sin, with x the *input* (pre-rotation)."""
    R = x_BTHK.shape[-1] // 2
    x, g = x_BTHK.astype(jnp.float32), g_BTHK.astype(jnp.float32)
    x0, x1, g0, g1 = x[..., :R], x[..., R:], g[..., :R], g[..., R:]
    gc = g0 * x0 + g1 * x1
    gs = g1 * x0 - g0 * x1
    return gs * cos_BTHR - gc * sin_BTHR


def _bwd(config, residuals, cotangents):
    q_BTHK, k_BTHK, phi_BTHR, temp_R, offset_BHR = residuals
    gq_BTHK, gk_BTHK, gfinal_BHR = cotangents
    # Pallas: rotate the cotangents back by -angle (negated phi and offset give S -> -S).
    dq_BTHK, dk_BTHK, _ = rotate_pallas(gq_BTHK, gk_BTHK, -phi_BTHR, temp_R, -offset_BHR, config)
    # jnp: the angle's cotangent and its way back through the cumulative sum.
    temp_f32 = temp_R.astype(jnp.float32)
    S_BTHR = cumulative_state(phi_BTHR, offset_BHR)
    angle_BTHR = S_BTHR * temp_f32
    cos_BTHR, sin_BTHR = jnp.cos(angle_BTHR), jnp.sin(angle_BTHR)
    g_angle_BTHR = _angle_cotangent(q_BTHK, gq_BTHK, cos_BTHR, sin_BTHR) + _angle_cotangent(
        k_BTHK, gk_BTHK, cos_BTHR, sin_BTHR
    )
    g_S_BTHR = (g_angle_BTHR * temp_f32).at[:, -1].add(gfinal_BHR.astype(jnp.float32))
    d_phi_BTHR = jnp.cumsum(g_S_BTHR[:, ::-1], axis=1)[:, ::-1]
    d_offset_BHR = d_phi_BTHR[:, 0]  # = sum_t g_S
    d_temp_R = jnp.sum(g_angle_BTHR * S_BTHR, axis=(0, 1, 2))
    grads = (dq_BTHK, dk_BTHK, d_phi_BTHR, d_temp_R, d_offset_BHR)
    return tuple(common.like_primal(g, x) for g, x in zip(grads, residuals, strict=True))


selective_rotary_pallas.defvjp(_fwd, _bwd)
