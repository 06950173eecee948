"""Selective RoPE (paper 5) and the two small sequence models it is tested in.

Flax NNX inside, pure functions over plain pytrees outside (as in `core/nn/transformer.py`):

    cfg = matched(ModelConfig(vocab_size=3, num_classes=3, model="gla", position="rope"))
    params = init_params(cfg, rng)                              # nested dict of float32 arrays
    logits_BTC, angles = apply(cfg, params, tokens_BT, mask_BT=None)
    caches = init_cache(cfg, batch_size, max_len)               # decoding, any chunk size:
    logits_BTC, caches = decode(cfg, params, tokens_BT, caches)  # = apply over the whole

Models (`cfg.model`), each `num_layers` x [RMSNorm -> mixer -> residual; RMSNorm -> SwiGLU ->
residual] -> RMSNorm -> linear classifier over `num_classes` labels at every position (the
block, norms and MLP from `core.nn.layers`):
  "transformer": causal softmax attention, `core.nn.attention` with selective rotary as its
                 position function (optional RMS qk-norm: before the rotation for RoPE and
                 none, after it for selective, as the authors' code does);
  "gla":         gated linear attention, S_t = diag(alpha_t) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t
                 (q scaled by K^-1/2), alpha = exp(logsigmoid(gk(x)) / 16) per key channel with a
                 low-rank gk (D -> 16 -> H*K, bias), then a per-head RMSNorm gated by swish(g(x))
                 and an output projection. In float32, in GLA's chunked form (chunks of 8 in
                 parallel, a `lax.scan` over chunks; `gla_chunk=0`: a `lax.scan` over time).
Position encodings (`cfg.position`), applied to q and k before the softmax/recurrence:
  "none", "rope" (positions 0..T-1 of real tokens, `core.nn.positions.rope`) and "selective":
    x_hat = per-head L2-normalised x                  [B, T, H, D/H]
    phi   = proj(x_hat)                               low-rank D->r->H*R, or per-head weight-normed
    phi   = conv4(phi) (causal, depthwise, no bias) -> optional SiLU -> + exp(b) -> * sigmoid(gate)
    q', k' = rotate half-split pairs by temp_j * cumsum_t(phi)   (core.kernels.selective_rotary)
  with the temperature temp_j = temp_max / theta^(2j/K) ("rope") or the tan spectrum ("rfa"),
  fixed (a constant, not a parameter).

Padding (`mask_BT` False) never advances the angle: raw phi is zeroed there before the conv (so a
left-padded row's conv sees zeros, as at a sequence start) and the op zeroes it again after; GLA
writes nothing and does not decay on padding, and attention never reads a padded key. So real
tokens' outputs do not depend on padding (tested).

Matched parameter counts: the selective variant's extra parameters (phi projection, conv, bias,
gate) are given to the RoPE/none variants as extra SwiGLU width (`matched`), i.e. capacity that
carries no position information.

Shape suffixes: B batch, T time, H heads, K head dim, R = K/2 rotation pairs, D d_model, F d_ff,
C classes, L layers.
"""

import dataclasses
import functools
import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax
from jax.sharding import PartitionSpec as P

from core.kernels import selective_rotary
from core.kernels.common import kernel_mesh
from core.mesh import data_axes
from core.nn import attention, layers
from core.nn.layers import RMSNorm, dense_factory, flat_dot_general

MODELS = ("gla", "transformer")
POSITIONS = ("selective", "rope", "none")
PHI_PARAMETRIZATIONS = ("low-rank", "full-rank")
TEMP_TYPES = ("rope", "rfa")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters; frozen and hashable (a static jit argument and an lru_cache key)."""

    vocab_size: int
    num_classes: int
    model: str = "gla"
    position: str = "selective"
    num_layers: int = 1
    d_model: int = 64
    num_heads: int = 4
    d_ff: int = 128
    # Selective RoPE
    phi_parametrization: str = "low-rank"
    phi_rank: int = 16
    conv_size: int = 4
    conv_silu: bool = False
    use_bias: bool = True
    use_gate: bool = False
    temp_type: str = "rope"
    temp_theta: float = 1.0
    temp_max: float = 1.0
    rotary_impl: str = "auto"
    # RoPE
    rope_base: float = 10000.0
    # softmax transformer
    qk_norm: bool = True
    # GLA
    gate_rank: int = 16
    gate_normalizer: float = 16.0
    output_gate: bool = True
    short_conv: bool = True  # GLA: causal depthwise conv (kernel 4) + SiLU on q, k and v
    gla_chunk: int = 8  # chunk length of the chunked form; 0: the sequential scan
    dtype: str = "float32"
    param_dtype: str = "float32"

    def __post_init__(self):
        for name in ("vocab_size", "num_classes", "num_layers", "d_model", "num_heads", "d_ff"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        for name, value, allowed in (
            ("model", self.model, MODELS),
            ("position", self.position, POSITIONS),
            ("phi_parametrization", self.phi_parametrization, PHI_PARAMETRIZATIONS),
            ("temp_type", self.temp_type, TEMP_TYPES),
        ):
            if value not in allowed:
                raise ValueError(
                    f"ModelConfig.{name}={value!r} is unknown; expected one of: "
                    f"{', '.join(allowed)}"
                )
        if self.d_model % self.num_heads:
            raise ValueError(
                f"ModelConfig.d_model={self.d_model} must be divisible by "
                f"num_heads={self.num_heads}"
            )
        if self.position != "none" and self.head_dim % 2:
            raise ValueError(
                f"ModelConfig head dim d_model/num_heads={self.head_dim} must be even for "
                f"position={self.position!r}"
            )
        if self.temp_type == "rope" and not self.temp_theta >= 1.0:
            raise ValueError("ModelConfig.temp_theta must be >= 1 for temp_type='rope'")
        if self.temp_type == "rfa" and not 0.0 < self.temp_theta < 1.0:
            raise ValueError("ModelConfig.temp_theta must be in (0, 1) for temp_type='rfa'")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


# Megatron-style tensor parallelism over "model", as in core.nn.transformer: split heads (the
# output dim of q/k/v/g and gate/up), contract over them in the output projections.
SHARDING_RULES = (
    (r"(^|/)mixer/(q|k|v|g)/kernel$", P(None, "model")),
    (r"(^|/)mixer/o/kernel$", P("model", None)),
    (r"(^|/)mlp/(gate|up)/kernel$", P(None, "model")),
    (r"(^|/)mlp/down/kernel$", P("model", None)),
)


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


def gla_scan(q_BTHK, k_BTHK, v_BTHV, log_alpha_BTHK, state_BHKV=None):
    """Gated linear attention by a sequential scan (float32):

        S_t = diag(exp(log_alpha_t)) S_{t-1} + k_t v_t^T,    o_t = S_t^T q_t.

    Returns (o_BTHV, final state S_T [B, H, K, V]). Scaling q is the caller's job.
    """
    B, T, H, K = q_BTHK.shape
    V = v_BTHV.shape[-1]
    if state_BHKV is None:
        state_BHKV = jnp.zeros((B, H, K, V), jnp.float32)

    def step(S_BHKV, xs):
        q, k, v, log_alpha = xs
        S_BHKV = jnp.exp(log_alpha)[..., None] * S_BHKV + k[..., None] * v[..., None, :]
        return S_BHKV, jnp.einsum("bhk,bhkv->bhv", q, S_BHKV)

    time_major = [
        jnp.moveaxis(a.astype(jnp.float32), 1, 0) for a in (q_BTHK, k_BTHK, v_BTHV, log_alpha_BTHK)
    ]
    final, o_TBHV = lax.scan(step, state_BHKV, time_major)
    return jnp.moveaxis(o_TBHV, 0, 1), final


def gla_chunked(q_BTHK, k_BTHK, v_BTHV, log_alpha_BTHK, state_BHKV=None, *, chunk: int = 16):
    """The same recurrence as `gla_scan`, in GLA's chunked form (float32): within a chunk of C
    steps, o_i = sum_{j<=i} sum_k q_ik k_jk exp(g_ik - g_jk) v_j + (q_i * exp(g_i)) S_start, with
    g the in-chunk inclusive cumsum of log alpha (every exponent <= 0, so nothing overflows);
    a `lax.scan` over chunks carries S. T is zero-padded to a multiple of C (no write, no decay).
    """
    B, T, H, K = q_BTHK.shape
    V = v_BTHV.shape[-1]
    C = min(chunk, T)
    n = -(-T // C)
    if state_BHKV is None:
        state_BHKV = jnp.zeros((B, H, K, V), jnp.float32)

    def chunks(x):  # [B, T, H, X] -> [n, B, H, C, X]
        x = jnp.pad(x.astype(jnp.float32), ((0, 0), (0, n * C - T), (0, 0), (0, 0)))
        return x.reshape(B, n, C, H, -1).transpose(1, 0, 3, 2, 4)

    q, k, v, log_alpha = map(chunks, (q_BTHK, k_BTHK, v_BTHV, log_alpha_BTHK))
    g = jnp.cumsum(log_alpha, axis=3)  # [n, B, H, C, K], decreasing within a chunk
    causal_CC = jnp.tril(jnp.ones((C, C), bool))[:, :, None]
    diff = g[:, :, :, :, None, :] - g[:, :, :, None, :, :]  # (i, j): g_i - g_j <= 0 for j <= i
    decay = jnp.where(causal_CC, jnp.exp(jnp.where(causal_CC, diff, 0.0)), 0.0)
    scores = jnp.einsum("nbhik,nbhjk,nbhijk->nbhij", q, k, decay)
    o_intra = jnp.einsum("nbhij,nbhjv->nbhiv", scores, v)
    q_from_start = q * jnp.exp(g)  # decay from the chunk's start to i
    g_last = g[:, :, :, -1:]  # [n, B, H, 1, K]
    k_to_end = k * jnp.exp(g_last - g)  # decay from j to the chunk's end

    def step(S_BHKV, xs):
        q_c, k_c, v_c, g_last_c = xs
        o_c = jnp.einsum("bhik,bhkv->bhiv", q_c, S_BHKV)
        S_BHKV = jnp.exp(g_last_c[:, :, 0])[..., None] * S_BHKV + jnp.einsum(
            "bhjk,bhjv->bhkv", k_c, v_c
        )
        return S_BHKV, o_c

    final, o_inter = lax.scan(step, state_BHKV, (q_from_start, k_to_end, v, g_last))
    o = (o_intra + o_inter).transpose(1, 0, 3, 2, 4).reshape(B, n * C, H, V)
    return o[:, :T], final


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
            o_BTHK, state_BHKV = gla_chunked(*args, chunk=cfg.gla_chunk)
        else:
            o_BTHK, state_BHKV = gla_scan(*args)
        o_BTHK = self.g_norm(o_BTHK)
        if cfg.output_gate:
            o_BTHK = o_BTHK * jax.nn.silu(self.g(x_BTD).astype(jnp.float32)).reshape(B, T, H, K)
        return o_BTHK.astype(x_BTD.dtype), state_BHKV


class Model(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        dtype, param_dtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        self.embed = nnx.Embed(
            cfg.vocab_size, cfg.d_model, dtype=dtype, param_dtype=param_dtype, rngs=rngs
        )
        self.blocks = nnx.List(
            [
                layers.PreNormBlock(cfg, Mixer(cfg, rngs), rngs, mixer_name="mixer")
                for _ in range(cfg.num_layers)
            ]
        )
        self.final_norm = RMSNorm(cfg.d_model, dtype=dtype, param_dtype=param_dtype)
        self.head = nnx.Linear(
            cfg.d_model,
            cfg.num_classes,
            use_bias=True,
            dtype=dtype,
            param_dtype=param_dtype,
            preferred_element_type=jnp.float32,
            dot_general=flat_dot_general,
            rngs=rngs,
        )

    def __call__(self, tokens_BT, mask_BT, caches=None):
        """(logits_BTC, final angle per layer, new caches or None)."""
        x_BTD = self.embed(tokens_BT)
        angles, new_caches = [], []
        for i, block in enumerate(self.blocks):
            x_BTD, (angle_BHR, cache), _ = block(
                x_BTD, mask_BT, None if caches is None else caches[i]
            )
            angles.append(angle_BHR)
            new_caches.append(cache)
        logits_BTC = self.head(self.final_norm(x_BTD)).astype(jnp.float32)
        return logits_BTC, angles, None if caches is None else new_caches


@functools.lru_cache(maxsize=64)
def _graphdef(cfg: ModelConfig):
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: Model(cfg, nnx.Rngs(0))))
    return graphdef


def init_params(cfg: ModelConfig, rng: jax.Array) -> dict:
    """Fresh parameters as a nested dict of arrays; `jax.eval_shape`-safe."""
    return nnx.to_pure_dict(nnx.state(Model(cfg, nnx.Rngs(params=rng))))


def apply(cfg: ModelConfig, params: dict, tokens_BT, *, mask_BT=None):
    """(logits_BTC float32, [final raw angle [B, H, R] or None per layer]).

    mask_BT: True on real tokens (default all); padding affects no real token's output.
    """
    if mask_BT is None:
        mask_BT = jnp.ones(tokens_BT.shape, bool)
    model = nnx.merge(_graphdef(cfg), params)
    logits_BTC, angles, _ = model(tokens_BT, mask_BT.astype(bool))
    return logits_BTC, angles


def init_cache(cfg: ModelConfig, batch_size: int, max_len: int = 0) -> list[dict]:
    """Per layer, the state that `decode` carries between calls, for a fresh sequence:
    "seen" real tokens [B] (RoPE positions); selective: the phi conv's window [B, W-1, H*R] and
    the raw angle [B, H, R]; GLA: the recurrent state [B, H, K, K] and the q/k/v conv windows
    [3, B, W-1, D]; transformer: `max_len` key and value slots [B, S, H, K], which slots hold
    a real token [B, S] and the next slot to write (a scalar)."""
    B, D, H, K = batch_size, cfg.d_model, cfg.num_heads, cfg.head_dim
    W, dtype = cfg.conv_size, jnp.dtype(cfg.dtype)
    if cfg.model == "transformer" and max_len <= 0:
        raise ValueError(f"init_cache: a transformer needs max_len >= 1 (got {max_len})")
    cache = {"seen": jnp.zeros((B,), jnp.int32)}
    if cfg.position == "selective":
        cache["phi_window"] = jnp.zeros((B, W - 1, H * (K // 2)), jnp.float32)
        cache["angle"] = jnp.zeros((B, H, K // 2), jnp.float32)
    if cfg.model == "gla":
        cache["state"] = jnp.zeros((B, H, K, K), jnp.float32)
        if cfg.short_conv:
            cache["qkv_window"] = jnp.zeros((3, B, W - 1, D), dtype)
    else:
        cache["k"] = jnp.zeros((B, max_len, H, K), dtype)
        cache["v"] = jnp.zeros((B, max_len, H, K), dtype)
        cache["kv_mask"] = jnp.zeros((B, max_len), bool)
        cache["index"] = jnp.zeros((), jnp.int32)
    return [dict(cache) for _ in range(cfg.num_layers)]


def decode(cfg: ModelConfig, params: dict, tokens_BT, caches: list[dict], *, mask_BT=None):
    """Continue the sequences held by `caches` (from `init_cache` or a previous call) with
    tokens_BT, any number of tokens at a time: (logits_BTC, new caches). Feeding a sequence in
    pieces gives the logits `apply` gives for the whole (tested); padding is skipped as there.

    A transformer's cache has a fixed number of slots: writing past them raises when the index
    is concrete (outside jit); under jit the caller keeps `index + T <= max_len`."""
    if mask_BT is None:
        mask_BT = jnp.ones(tokens_BT.shape, bool)
    if cfg.model == "transformer":
        index, slots = caches[0]["index"], caches[0]["k"].shape[1]
        if not isinstance(index, jax.core.Tracer) and int(index) + tokens_BT.shape[1] > slots:
            raise ValueError(
                f"decode: the cache has {slots} slots, {int(index)} used; "
                f"{tokens_BT.shape[1]} more tokens do not fit (init_cache(max_len=...))"
            )
    model = nnx.merge(_graphdef(cfg), params)
    logits_BTC, _, caches = model(tokens_BT, mask_BT.astype(bool), caches)
    return logits_BTC, caches


@functools.lru_cache(maxsize=64)
def _rotary_graphdef(cfg: ModelConfig):
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: SelectiveRotary(cfg, nnx.Rngs(0))))
    return graphdef


def phi(cfg: ModelConfig, rotary_params: dict, x_BTD, *, mask_BT=None):
    """One layer's angle increments phi [B, T, H, R] (float32) from its mixer's input x, with
    `rotary_params = params["blocks"][i]["mixer"]["rotary"]`."""
    if mask_BT is None:
        mask_BT = jnp.ones(x_BTD.shape[:2], bool)
    rotary = nnx.merge(_rotary_graphdef(cfg), rotary_params)
    return rotary.phi(x_BTD, mask_BT.astype(bool))[0]


def steady_increments(cfg: ModelConfig, params: dict, tokens) -> np.ndarray:
    """The first layer's angle step temp_j * phi (radians, [len(tokens), H, R]) in a long run of
    each token. Its input x is a function of the token alone, and without SiLU phi is linear in
    it, so this is exactly what one occurrence of the token adds to the angle in any context.
    A pair solves parity for all lengths when a 1-bit adds pi (mod 2 pi) more than a 0-bit."""
    if cfg.position != "selective":
        raise ValueError(f"steady_increments needs position='selective', not {cfg.position!r}")
    run = cfg.conv_size + 1  # past the conv's start-up
    tokens_NT = jnp.repeat(jnp.asarray(tokens, jnp.int32)[:, None], run, axis=1)
    model = nnx.merge(_graphdef(cfg), params)
    block = model.blocks[0]
    mask_NT = jnp.ones(tokens_NT.shape, bool)
    phi_NTHR, _ = block.mixer.rotary.phi(block.mixer_norm(model.embed(tokens_NT)), mask_NT)
    return np.asarray(phi_NTHR[:, -1]) * temperature(cfg)


def num_params(params) -> int:
    return sum(x.size for x in jax.tree_util.tree_leaves(params))


@functools.lru_cache(maxsize=64)
def count_params(cfg: ModelConfig) -> int:
    """The parameter count of `cfg`, from shapes only."""
    return num_params(jax.eval_shape(functools.partial(init_params, cfg), jax.random.PRNGKey(0)))


def matched(cfg: ModelConfig) -> ModelConfig:
    """`cfg` with the parameter count of its selective variant: RoPE and none get the selective
    variant's extra parameters as extra SwiGLU width (3 * d_model per unit, rounded), so all
    three differ by less than 1.5 * d_model * num_layers parameters."""
    if cfg.position == "selective":
        return cfg
    extra = count_params(dataclasses.replace(cfg, position="selective")) - count_params(cfg)
    units = round(extra / (3 * cfg.d_model * cfg.num_layers))
    return dataclasses.replace(cfg, d_ff=cfg.d_ff + units)
