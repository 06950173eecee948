"""Selective RoPE (paper 5) and the two small sequence models it is tested in.

Flax NNX inside, pure functions over plain pytrees outside (`core.nn.pure.PureModule`):

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

The code: `config` (ModelConfig), `rotary` (Selective RoPE: temperature, SelectiveRotary),
`gla` (the recurrence: scan and chunked), `mixer` (Mixer: attention or GLA with its position
code and decoding cache), this module (Model and the pure functions above).

Shape suffixes: B batch, T time, H heads, K head dim, R = K/2 rotation pairs, D d_model, F d_ff,
C classes, L layers.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P

from core.nn import layers
from core.nn.layers import RMSNorm, flat_dot_general
from core.nn.pure import PureModule
from methods.selective_rope.config import ModelConfig
from methods.selective_rope.mixer import Mixer
from methods.selective_rope.rotary import SelectiveRotary, temperature

# Megatron-style tensor parallelism over "model", as in core.nn.transformer: split heads (the
# output dim of q/k/v/g and gate/up), contract over them in the output projections.
SHARDING_RULES = (
    (r"(^|/)mixer/(q|k|v|g)/kernel$", P(None, "model")),
    (r"(^|/)mixer/o/kernel$", P("model", None)),
    (r"(^|/)mlp/(gate|up)/kernel$", P(None, "model")),
    (r"(^|/)mlp/down/kernel$", P("model", None)),
)


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


MODEL = PureModule(Model)
ROTARY = PureModule(SelectiveRotary)  # one layer's rotary alone (`phi`)


def init_params(cfg: ModelConfig, rng: jax.Array) -> dict:
    """Fresh parameters as a nested dict of arrays; `jax.eval_shape`-safe."""
    return MODEL.init(cfg, rng)


def apply(cfg: ModelConfig, params: dict, tokens_BT, *, mask_BT=None):
    """(logits_BTC float32, [final raw angle [B, H, R] or None per layer]).

    mask_BT: True on real tokens (default all); padding affects no real token's output.
    """
    if mask_BT is None:
        mask_BT = jnp.ones(tokens_BT.shape, bool)
    model = MODEL.bind(cfg, params)
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
    model = MODEL.bind(cfg, params)
    logits_BTC, _, caches = model(tokens_BT, mask_BT.astype(bool), caches)
    return logits_BTC, caches


def phi(cfg: ModelConfig, rotary_params: dict, x_BTD, *, mask_BT=None):
    """One layer's angle increments phi [B, T, H, R] (float32) from its mixer's input x, with
    `rotary_params = params["blocks"][i]["mixer"]["rotary"]`."""
    if mask_BT is None:
        mask_BT = jnp.ones(x_BTD.shape[:2], bool)
    rotary = ROTARY.bind(cfg, rotary_params)
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
    model = MODEL.bind(cfg, params)
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
