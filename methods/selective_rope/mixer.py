"""The token mixer of methods/selective_rope's models: causal softmax attention
(`core.nn.attention`) or gated linear attention (`gla`), with the configured position code
("none", "rope" or selective, `rotary`) and a per-layer decoding cache (`model.py` describes
the whole).

Shape suffixes: B batch, T time, S key slots, H heads, K head dim, R = K/2 rotation pairs,
D d_model.
"""

import math

import jax
import jax.numpy as jnp
from flax import nnx

from core.nn import attention
from core.nn.layers import RMSNorm, dense_factory, flat_dot_general
from methods.selective_rope import gla
from methods.selective_rope.config import ModelConfig
from methods.selective_rope.rotary import SelectiveRotary, causal_depthwise_conv


def _positions(mask_BT, start_B=None):
    """RoPE positions 0, 1, ... over real tokens (a left-padded row's first token is 0), counted
    from `start_B` real tokens already seen (decoding)."""
    seen_BT = jnp.cumsum(mask_BT.astype(jnp.int32), axis=1)
    if start_B is not None:
        seen_BT = seen_BT + start_B[:, None]
    return jnp.maximum(seen_BT - 1, 0)


class Mixer(nnx.Module):
    """Causal softmax attention or gated linear attention, with the configured position code."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        dense = dense_factory(cfg, rngs)
        D, H, K = cfg.d_model, cfg.num_heads, cfg.head_dim
        dtype, param_dtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        self.q, self.k, self.v, self.o = dense(D, D), dense(D, D), dense(D, D), dense(D, D)
        self.rotary = SelectiveRotary(cfg, rngs) if cfg.position == "selective" else None
        if cfg.model == "transformer" and cfg.qk_norm:
            self.q_norm = RMSNorm(K, dtype=dtype, param_dtype=param_dtype)
            self.k_norm = RMSNorm(K, dtype=dtype, param_dtype=param_dtype)
        if cfg.model == "gla":
            self.gk_down = dense(D, cfg.gate_rank)
            self.gk_up = nnx.Linear(
                cfg.gate_rank,
                H * K,
                use_bias=True,
                param_dtype=param_dtype,
                dot_general=flat_dot_general,
                rngs=rngs,
            )
            if cfg.output_gate:
                self.g = dense(D, D)
            self.g_norm = RMSNorm(K, dtype=jnp.float32, param_dtype=param_dtype)
            if cfg.short_conv:
                bound = 1.0 / math.sqrt(cfg.conv_size)
                self.qkv_conv = nnx.Param(
                    jax.random.uniform(
                        rngs.params(), (3, cfg.conv_size, D), param_dtype, -bound, bound
                    )
                )
        self.cfg = cfg

    def __call__(self, x_BTD, mask_BT, cache=None):
        """Returns (y_BTD, (final raw angle [B, H, R] for selective else None, new cache or
        None)), the (output, aux) pair `core.nn.layers.PreNormBlock` expects.

        With `cache` (one layer's entry of `init_cache`), x continues the sequence it holds."""
        cfg = self.cfg
        B, T, D = x_BTD.shape
        H, K = cfg.num_heads, cfg.head_dim
        new = None if cache is None else dict(cache)
        q_BTD, k_BTD, v_BTD = self.q(x_BTD), self.k(x_BTD), self.v(x_BTD)
        if cfg.model == "gla" and cfg.short_conv:  # fla's ShortConvolution(activation="silu")
            real_BT1 = mask_BT[..., None].astype(x_BTD.dtype)
            w_3WD = self.qkv_conv[...].astype(x_BTD.dtype)
            windows = (None,) * 3 if cache is None else tuple(cache["qkv_window"])
            convolved = [
                causal_depthwise_conv(a * real_BT1, w, window)
                for a, w, window in zip((q_BTD, k_BTD, v_BTD), w_3WD, windows, strict=True)
            ]
            q_BTD, k_BTD, v_BTD = (jax.nn.silu(y) for y, _ in convolved)
            if cache is not None:
                new["qkv_window"] = jnp.stack([window for _, window in convolved])
        q_BTHK = q_BTD.reshape(B, T, H, K)
        k_BTHK = k_BTD.reshape(B, T, H, K)
        v_BTHK = v_BTD.reshape(B, T, H, K)
        pre_norm = cfg.model == "transformer" and cfg.qk_norm and cfg.position != "selective"
        if pre_norm:  # the standard order for RoPE (and none)
            q_BTHK, k_BTHK = self.q_norm(q_BTHK), self.k_norm(k_BTHK)
        angle_BHR, positions_BT, state = None, None, None
        if cfg.position == "selective":
            positions = self.rotary  # a position function of x, its state in the cache
            if cache is not None:
                state = {"phi_window": cache["phi_window"], "angle": cache["angle"]}
        else:
            positions = cfg.position
            if cfg.position == "rope":
                positions_BT = _positions(mask_BT, None if cache is None else cache["seen"])
        q_BTHK, k_BTHK, state = attention.encode_positions(
            positions,
            q_BTHK,
            k_BTHK,
            positions_BT=positions_BT,
            rope_base=cfg.rope_base,
            x_BTD=x_BTD,
            key_mask_BT=mask_BT,
            state=state,
        )
        if cfg.position == "selective":
            angle_BHR = state["angle"]
            if cache is not None:
                new.update(state)
        if cache is not None:
            new["seen"] = cache["seen"] + jnp.sum(mask_BT, axis=1, dtype=jnp.int32)
        if cfg.model == "transformer":
            if cfg.qk_norm and not pre_norm:  # selective: qk-norm after the rotation
                q_BTHK, k_BTHK = self.q_norm(q_BTHK), self.k_norm(k_BTHK)
            if cache is None:
                mask_BTS = attention.make_mask("causal", mask_BT)
                k_BSHK, v_BSHK = k_BTHK, v_BTHK
            else:
                kv = attention.write_cache(cache, k_BTHK, v_BTHK, mask_BT)
                mask_BTS = attention.make_mask(
                    "causal", kv["kv_mask"], num_queries=T, index=cache["index"]
                )
                k_BSHK, v_BSHK = kv["k"], kv["v"]
                new.update(kv)
            out_BTHK = attention.attend(q_BTHK, k_BSHK, v_BSHK, mask_BTS, impl="xla")
        else:
            state_BHKV = None if cache is None else cache["state"]
            out_BTHK, state_BHKV = self._gla(x_BTD, q_BTHK, k_BTHK, v_BTHK, mask_BT, state_BHKV)
            if cache is not None:
                new["state"] = state_BHKV
        return self.o(out_BTHK.reshape(B, T, D)), (angle_BHR, new)

    def _gla(self, x_BTD, q_BTHK, k_BTHK, v_BTHK, mask_BT, state_BHKV=None):
        """(o_BTHK, the recurrence's final state)."""
        cfg = self.cfg
        B, T, D = x_BTD.shape
        H, K = cfg.num_heads, cfg.head_dim
        gk_BTHK = self.gk_up(self.gk_down(x_BTD)).astype(jnp.float32).reshape(B, T, H, K)
        real_BT11 = mask_BT[:, :, None, None].astype(jnp.float32)
        # Padding neither writes (k = 0) nor decays (log alpha = 0) the state.
        log_alpha_BTHK = jax.nn.log_sigmoid(gk_BTHK) / cfg.gate_normalizer * real_BT11
        args = (q_BTHK * K**-0.5, k_BTHK * real_BT11, v_BTHK, log_alpha_BTHK, state_BHKV)
        if cfg.gla_chunk:
            o_BTHK, state_BHKV = gla.gla_chunked(*args, chunk=cfg.gla_chunk)
        else:
            o_BTHK, state_BHKV = gla.gla_scan(*args)
        o_BTHK = self.g_norm(o_BTHK)
        if cfg.output_gate:
            o_BTHK = o_BTHK * jax.nn.silu(self.g(x_BTD).astype(jnp.float32)).reshape(B, T, H, K)
        return o_BTHK.astype(x_BTD.dtype), state_BHKV
