"""Selective RoPE: the angle increments phi from x and the cumulative rotation of q and k (the
position function `mixer.Mixer` hands to `core.nn.attention.encode_positions`):

    x_hat = per-head L2-normalised x                  [B, T, H, D/H]
    phi   = proj(x_hat)                               low-rank D->r->H*R, or per-head weight-normed
    phi   = conv4(phi) (causal, depthwise, no bias) -> optional SiLU -> + exp(b) -> * sigmoid(gate)
    q', k' = rotate half-split pairs by temp_j * cumsum_t(phi)   (core.kernels.selective_rotary)

with the fixed temperature temp_j (`temperature`). Padding never advances the angle: raw phi is
zeroed there before the conv and the op zeroes it again after.

Shape suffixes: B batch, T time, H heads, K head dim, R = K/2 rotation pairs, D d_model,
W conv width, C conv channels.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from core.kernels import selective_rotary
from core.kernels.common import kernel_mesh
from core.mesh import data_axes
from core.nn.layers import dense_factory, flat_dot_general
from methods.selective_rope.config import ModelConfig


def temperature(cfg: ModelConfig) -> np.ndarray:
    """The fixed per-pair temperature temp_j, j = 0..R-1 (float32 [R]).

    "rope": temp_max / theta^(2j/K) (theta = 1: every pair temp_max; state tracking).
    "rfa": temp_max * tan(theta_j / 2) / max_j tan(theta_j / 2), theta_j = linspace(0, theta*pi, R)
           (the spectrum the paper derives from random Fourier features; pair 0 never rotates).
    """
    K = cfg.head_dim
    R = K // 2
    if cfg.temp_type == "rope":
        return (cfg.temp_max / cfg.temp_theta ** (2.0 * np.arange(R) / K)).astype(np.float32)
    angles = np.linspace(0.0, cfg.temp_theta * np.pi, R)
    tan_half = np.sqrt((1 - np.cos(angles)) / (1 + np.cos(angles)))
    return (cfg.temp_max * tan_half / tan_half.max()).astype(np.float32)


def l2_normalize(x, axis=-1, eps=1e-6):
    """x / sqrt(sum x^2 + eps), in float32 (fla's l2_norm)."""
    x = x.astype(jnp.float32)
    return x * lax.rsqrt(jnp.sum(x * x, axis=axis, keepdims=True) + eps)


def causal_depthwise_conv(x_BTC, w_WC, window_BWC=None):
    """y_t = sum_i w[i] * x[t - (W-1) + i] (a causal short conv), with the W-1 inputs before x
    taken from `window_BWC` (decoding) or zeros (a sequence start).

    Returns (y_BTC, the last W-1 inputs: the window for the next call)."""
    W = w_WC.shape[0]
    T = x_BTC.shape[1]
    if window_BWC is None:
        x_pad = jnp.pad(x_BTC, ((0, 0), (W - 1, 0), (0, 0)))
    else:
        x_pad = jnp.concatenate([window_BWC.astype(x_BTC.dtype), x_BTC], axis=1)
    return sum(x_pad[:, i : i + T] * w_WC[i] for i in range(W)), x_pad[:, T:]


class SelectiveRotary(nnx.Module):
    """phi from x and the cumulative rotation of q and k (see the module docstring)."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        dense = dense_factory(cfg, rngs)
        D, H, R = cfg.d_model, cfg.num_heads, cfg.head_dim // 2
        param_dtype = jnp.dtype(cfg.param_dtype)
        if cfg.phi_parametrization == "low-rank":
            self.phi_down = dense(D, cfg.phi_rank)
            self.phi_up = dense(cfg.phi_rank, H * R)
        else:  # per-head weight-normed: W_h = s_h * V_h / ||V_h||_columns
            bound = math.sqrt(6.0 / (D // H))  # kaiming uniform (a=0), as in the authors' code
            self.phi_v = nnx.Param(
                jax.random.uniform(rngs.params(), (H, D // H, R), param_dtype, -bound, bound)
            )
            self.phi_s = nnx.Param(jnp.ones((H,), param_dtype))
        # PyTorch Conv1d's default init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = kernel size.
        bound = 1.0 / math.sqrt(cfg.conv_size)
        self.conv = nnx.Param(
            jax.random.uniform(rngs.params(), (cfg.conv_size, H * R), param_dtype, -bound, bound)
        )
        if cfg.use_bias:  # exp(0) = 1: a RoPE-like constant angular velocity at init
            self.bias = nnx.Param(jnp.zeros((H, R), param_dtype))
        if cfg.use_gate:
            self.gate = nnx.Linear(
                D,
                H,
                use_bias=True,
                param_dtype=param_dtype,
                dot_general=flat_dot_general,
                rngs=rngs,
            )
        self.cfg = cfg

    def phi(self, x_BTD, mask_BT, window_BWC=None):
        """The per-step angle increment phi [B, T, H, R] (float32), zero on padding, and the
        conv's window for the next call (`causal_depthwise_conv`)."""
        cfg = self.cfg
        B, T, D = x_BTD.shape
        H, R = cfg.num_heads, cfg.head_dim // 2
        x_hat_BTHd = l2_normalize(x_BTD.reshape(B, T, H, D // H))
        if cfg.phi_parametrization == "low-rank":
            phi_BTC = self.phi_up(self.phi_down(x_hat_BTHd.reshape(B, T, D)))
        else:
            V_HdR = self.phi_v[...].astype(jnp.float32)
            W_HdR = self.phi_s[...][:, None, None] * l2_normalize(V_HdR, axis=1, eps=1e-12)
            phi_BTC = jnp.einsum("bthi,hio->btho", x_hat_BTHd, W_HdR).reshape(B, T, H * R)
        phi_BTC = phi_BTC.astype(jnp.float32) * mask_BT[..., None]
        phi_BTC, window_BWC = causal_depthwise_conv(
            phi_BTC, self.conv[...].astype(jnp.float32), window_BWC
        )
        if cfg.conv_silu:
            phi_BTC = jax.nn.silu(phi_BTC)
        phi_BTHR = phi_BTC.reshape(B, T, H, R)
        if cfg.use_bias:
            phi_BTHR = phi_BTHR + jnp.exp(self.bias[...].astype(jnp.float32))
        if cfg.use_gate:  # after the bias: the gate scales exp(b) too
            gate_BTH = jax.nn.sigmoid(self.gate(x_hat_BTHd.reshape(B, T, D)).astype(jnp.float32))
            phi_BTHR = phi_BTHR * gate_BTH[..., None]
        return phi_BTHR * mask_BT[:, :, None, None], window_BWC

    def __call__(self, q_BTHK, k_BTHK, *, x_BTD, key_mask_BT, state=None, positions_BT=None):
        """A `core.nn.attention` position function: (q', k', state'). state (decoding; None at
        a sequence start) is {"phi_window", "angle"}: the conv's window and the raw angle so
        far; state' holds the new window and the final raw angle [B, H, R]."""
        del positions_BT  # the angle is a function of x, not of the index
        window_BWC, offset_BHR = (
            (None, None) if state is None else (state["phi_window"], state["angle"])
        )
        phi_BTHR, window_BWC = self.phi(x_BTD, key_mask_BT, window_BWC)
        temp_R = jnp.asarray(temperature(self.cfg))
        q_BTHK, k_BTHK, angle_BHR = _rotate(self.cfg.rotary_impl)(
            q_BTHK, k_BTHK, phi_BTHR, temp_R, offset_BHR, key_mask_BT
        )
        return q_BTHK, k_BTHK, {"phi_window": window_BWC, "angle": angle_BHR}


def _rotate(impl: str):
    """`selective_rotary.op`, or, when it runs a Pallas kernel while a multi-device mesh is being
    traced for (core.train sets it), `sharded_op` over the mesh's batch axes and "model" (heads,
    as SHARDING_RULES split them): XLA cannot partition a kernel by itself."""
    mesh = kernel_mesh(selective_rotary.uses_kernel(impl))
    if mesh is None:
        return functools.partial(selective_rotary.op, impl=impl)
    heads = "model" if "model" in mesh.axis_names else None
    return functools.partial(
        selective_rotary.sharded_op,
        mesh=mesh,
        batch_axes=data_axes(mesh),
        head_axes=heads,
        impl=impl,
    )
