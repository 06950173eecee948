"""A decoder-only transformer: Flax NNX inside, pure functions over plain pytrees outside.

    params = init_params(cfg, rng)                     # nested dict of float32 arrays
    logits_BTV, _ = apply(cfg, params, tokens_BT)      # training / scoring
    cache = init_cache(cfg, batch_size, max_len)       # decoding: prefill, then T=1 steps
    logits_BTV, cache = apply(cfg, params, tokens_BT, positions_BT=pos_BT, cache=cache)

Architecture: token embedding -> num_layers x [RMSNorm -> causal MHA -> residual; RMSNorm ->
SwiGLU MLP -> residual] -> RMSNorm -> untied output projection. No biases, no dropout. q, k and v
are separate projections so that tensor parallelism can split each over heads by sharding its
output dim (a fused [D, 3D] kernel split contiguously would hand whole q/k/v blocks to devices).

Precision: params in cfg.param_dtype (float32), matmuls in cfg.dtype; norms, attention scores,
softmax and the output logits in float32 (bfloat16 softmax and logits lose too much).

Shape suffixes: B batch, T new tokens, S key slots, H heads, K head dim, D d_model, F d_ff,
V vocab, L layers.
"""

import dataclasses
import functools
import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax
from jax.sharding import PartitionSpec as P

from core.nn import positions as positions_lib


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Hyperparameters; frozen and hashable so it can be a static jit argument."""

    vocab_size: int
    num_layers: int
    d_model: int
    num_heads: int
    d_ff: int
    max_len: int
    position: str = "rope"
    rope_base: float = 10000.0
    dtype: str = "float32"
    param_dtype: str = "float32"

    def __post_init__(self):
        for name in ("vocab_size", "num_layers", "d_model", "num_heads", "d_ff", "max_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
                raise ValueError(f"TransformerConfig.{name} must be a positive int, got {value!r}")
        if self.d_model % self.num_heads:
            raise ValueError(
                f"TransformerConfig.d_model={self.d_model} must be divisible by "
                f"num_heads={self.num_heads}"
            )
        try:
            positions_lib.check_kind(self.position)
        except ValueError as e:
            raise ValueError(f"TransformerConfig.position: {e}") from None
        if self.position == "rope" and self.head_dim % 2:
            raise ValueError(
                f"TransformerConfig.d_model/num_heads={self.head_dim} (head dim) must be even "
                "for position='rope'"
            )
        if not self.rope_base > 0:
            raise ValueError(f"TransformerConfig.rope_base must be > 0, got {self.rope_base!r}")
        for name in ("dtype", "param_dtype"):
            value = getattr(self, name)
            try:
                ok = jnp.issubdtype(jnp.dtype(value), jnp.floating)
            except TypeError:
                ok = False
            if not ok:
                raise ValueError(f"TransformerConfig.{name} must name a float dtype, got {value!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


class KVCache(NamedTuple):
    """Decoding state; a plain pytree that can be a `lax.while_loop` carry.

    Slots [0, index) are filled. key_mask is False on unfilled slots and on padding tokens, and
    attention never reads a slot whose key_mask is False.
    """

    k: jax.Array  # [L, B, S, H, K], rotary already applied
    v: jax.Array  # [L, B, S, H, K]
    key_mask: jax.Array  # [B, S] bool
    index: jax.Array  # int32 scalar: number of filled slots


# Tensor parallel (Megatron) layout over mesh axis "model": q/k/v, gate/up and the output
# projection split their output dim, the attention-out and MLP-down kernels their input dim, and
# the embedding its vocab dim. Suffix patterns ending in "$" (preceded by "/" or the start) so
# the same rule matches "blocks/0/attn/q/kernel" and "opt_state/0/mu/blocks/0/attn/q/kernel".
# RMSNorm scales (1-D) are deliberately unmatched: replicated, or FSDP'd by the core.
SHARDING_RULES = (
    (r"(^|/)embed/embedding$", P("model", None)),
    (r"(^|/)attn/(q|k|v)/kernel$", P(None, "model")),
    (r"(^|/)attn/o/kernel$", P("model", None)),
    (r"(^|/)mlp/(gate|up)/kernel$", P(None, "model")),
    (r"(^|/)mlp/down/kernel$", P("model", None)),
    (r"(^|/)lm_head/kernel$", P(None, "model")),
)


class RMSNorm(nnx.Module):
    """RMSNorm computed in float32 whatever the input dtype, output cast to `dtype`."""

    def __init__(self, dim: int, *, dtype, param_dtype, eps: float = 1e-6):
        self.scale = nnx.Param(jnp.ones((dim,), param_dtype))
        self.dtype = dtype
        self.eps = eps

    def __call__(self, x_BTD):
        x = x_BTD.astype(jnp.float32)
        x = x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps)
        return (x * self.scale[...].astype(jnp.float32)).astype(self.dtype)


def dense_factory(cfg, rngs: nnx.Rngs):
    """Bias-free linear layers in `cfg.dtype` compute and `cfg.param_dtype` parameters (any
    config with those two fields: other models, e.g. methods/selective_rope, share it)."""
    return functools.partial(
        nnx.Linear,
        use_bias=False,
        dtype=jnp.dtype(cfg.dtype),
        param_dtype=jnp.dtype(cfg.param_dtype),
        rngs=rngs,
    )


class Attention(nnx.Module):
    def __init__(self, cfg: TransformerConfig, rngs: nnx.Rngs):
        dense = dense_factory(cfg, rngs)
        D = cfg.d_model
        self.q, self.k, self.v, self.o = dense(D, D), dense(D, D), dense(D, D), dense(D, D)
        self.cfg = cfg

    def __call__(self, x_BTD, positions_BT, mask_BTS, cache_kv=None, layer: int = 0):
        """Causal self-attention. `mask_BTS` is the full mask (causal and key padding).

        Without a cache the keys are the T new tokens (S = T). With `cache_kv = (k_LBSHK,
        v_LBSHK, index)` the new keys/values are written at slots [index, index+T) of layer
        `layer` and the queries attend over all S slots; returns the updated (k, v) stacks.
        """
        cfg = self.cfg
        B, T, _ = x_BTD.shape
        H, K = cfg.num_heads, cfg.head_dim
        q_BTHK = self.q(x_BTD).reshape(B, T, H, K)
        k_BTHK = self.k(x_BTD).reshape(B, T, H, K)
        v_BTHK = self.v(x_BTD).reshape(B, T, H, K)
        q_BTHK, k_BTHK = positions_lib.apply_positions(
            cfg.position, q_BTHK, k_BTHK, positions_BT, base=cfg.rope_base
        )
        new_cache_kv = None
        if cache_kv is None:
            k_BSHK, v_BSHK = k_BTHK, v_BTHK
        else:
            k_LBSHK, v_LBSHK, index = cache_kv
            start = (layer, 0, index, 0, 0)
            k_LBSHK = lax.dynamic_update_slice(k_LBSHK, k_BTHK[None].astype(k_LBSHK.dtype), start)
            v_LBSHK = lax.dynamic_update_slice(v_LBSHK, v_BTHK[None].astype(v_LBSHK.dtype), start)
            new_cache_kv = (k_LBSHK, v_LBSHK)
            k_BSHK = k_LBSHK[layer].astype(q_BTHK.dtype)
            v_BSHK = v_LBSHK[layer].astype(q_BTHK.dtype)

        scores_BHTS = jnp.einsum(
            "bthk,bshk->bhts", q_BTHK, k_BSHK, preferred_element_type=jnp.float32
        ) * (K**-0.5)
        mask_B1TS = mask_BTS[:, None]
        scores_BHTS = jnp.where(mask_B1TS, scores_BHTS, jnp.finfo(jnp.float32).min)
        probs_BHTS = jax.nn.softmax(scores_BHTS, axis=-1)
        # A query with no valid key (a padding token at the start of a left-padded row) would
        # get a uniform average over padding; zero it instead. Elsewhere masked probs are
        # already exactly 0 (exp underflows), so this changes nothing for real tokens.
        probs_BHTS = jnp.where(mask_B1TS, probs_BHTS, 0.0)
        out_BTHK = jnp.einsum("bhts,bshk->bthk", probs_BHTS.astype(v_BSHK.dtype), v_BSHK)
        return self.o(out_BTHK.reshape(B, T, H * K)), new_cache_kv


class SwiGLU(nnx.Module):
    """down(silu(gate(x)) * up(x)); three [D, F]/[F, D] kernels, so d_ff ~ 8/3 d_model
    matches a 4x GELU MLP's parameter count."""

    def __init__(self, cfg: TransformerConfig, rngs: nnx.Rngs):
        dense = dense_factory(cfg, rngs)
        self.gate = dense(cfg.d_model, cfg.d_ff)
        self.up = dense(cfg.d_model, cfg.d_ff)
        self.down = dense(cfg.d_ff, cfg.d_model)

    def __call__(self, x_BTD):
        return self.down(jax.nn.silu(self.gate(x_BTD)) * self.up(x_BTD))


class Block(nnx.Module):
    def __init__(self, cfg: TransformerConfig, rngs: nnx.Rngs):
        norm = functools.partial(
            RMSNorm, dtype=jnp.dtype(cfg.dtype), param_dtype=jnp.dtype(cfg.param_dtype)
        )
        self.attn_norm = norm(cfg.d_model)
        self.attn = Attention(cfg, rngs)
        self.mlp_norm = norm(cfg.d_model)
        self.mlp = SwiGLU(cfg, rngs)

    def __call__(self, x_BTD, positions_BT, mask_BTS, cache_kv=None, layer: int = 0):
        y_BTD, cache_kv = self.attn(self.attn_norm(x_BTD), positions_BT, mask_BTS, cache_kv, layer)
        x_BTD = x_BTD + y_BTD
        x_BTD = x_BTD + self.mlp(self.mlp_norm(x_BTD))
        return x_BTD, cache_kv


class Transformer(nnx.Module):
    def __init__(self, cfg: TransformerConfig, rngs: nnx.Rngs):
        dtype, param_dtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        self.embed = nnx.Embed(
            cfg.vocab_size, cfg.d_model, dtype=dtype, param_dtype=param_dtype, rngs=rngs
        )
        self.blocks = nnx.List([Block(cfg, rngs) for _ in range(cfg.num_layers)])
        self.final_norm = RMSNorm(cfg.d_model, dtype=dtype, param_dtype=param_dtype)
        # float32 logits straight out of the matmul: bfloat16 logits would round by ~0.03.
        self.lm_head = nnx.Linear(
            cfg.d_model,
            cfg.vocab_size,
            use_bias=False,
            dtype=dtype,
            param_dtype=param_dtype,
            preferred_element_type=jnp.float32,
            rngs=rngs,
        )

    def __call__(
        self, tokens_BT, positions_BT, key_mask_BT, cache: KVCache | None = None, head=True
    ):
        T = tokens_BT.shape[1]
        x_BTD = self.embed(tokens_BT)
        if cache is None:
            causal_TS = jnp.arange(T)[:, None] >= jnp.arange(T)[None, :]
            key_mask_BS = key_mask_BT
            cache_kv = None
        else:
            S = cache.key_mask.shape[1]
            slots_T = cache.index + jnp.arange(T)
            causal_TS = jnp.arange(S)[None, :] <= slots_T[:, None]
            key_mask_BS = lax.dynamic_update_slice(cache.key_mask, key_mask_BT, (0, cache.index))
            cache_kv = (cache.k, cache.v)
        mask_BTS = causal_TS[None] & key_mask_BS[:, None, :]
        for layer, block in enumerate(self.blocks):
            if cache is not None:
                cache_kv = (*cache_kv, cache.index)
            x_BTD, cache_kv = block(x_BTD, positions_BT, mask_BTS, cache_kv, layer)
        if not head:  # the final hidden state, for probes (no cache, see `features`)
            return self.final_norm(x_BTD), None
        logits_BTV = self.lm_head(self.final_norm(x_BTD)).astype(jnp.float32)
        if cache is None:
            return logits_BTV, None
        k, v = cache_kv
        return logits_BTV, KVCache(k, v, key_mask_BS, cache.index + T)


@functools.lru_cache(maxsize=64)
def _graphdef(cfg: TransformerConfig):
    """The model's static structure, built abstractly (no parameter memory, no RNG work)."""
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, nnx.Rngs(0))))
    return graphdef


def init_params(cfg: TransformerConfig, rng: jax.Array) -> dict:
    """Fresh parameters as a nested dict of arrays, e.g. params["blocks"][0]["attn"]["q"]
    ["kernel"]. Safe under `jax.eval_shape(functools.partial(init_params, cfg), rng)`."""
    return nnx.to_pure_dict(nnx.state(Transformer(cfg, nnx.Rngs(params=rng))))


def apply(
    cfg: TransformerConfig,
    params: dict,
    tokens_BT: jax.Array,
    *,
    positions_BT: jax.Array | None = None,
    key_mask_BT: jax.Array | None = None,
    cache: KVCache | None = None,
) -> tuple[jax.Array, KVCache | None]:
    """Next-token logits (float32 [B, T, V]) and the advanced cache (None without one).

    positions_BT: rotary positions; default arange(T), offset by cache.index with a cache.
      Left-padded rows should pass cumsum(key_mask) - 1 so each row's first real token is 0.
    key_mask_BT: True on real tokens; no query ever attends to a False key. Default all True.
    cache: from `init_cache`; the T tokens go to slots [index, index+T), which must fit in
      the cache (inside jit an overflow cannot raise: `dynamic_update_slice` clamps the start).
    """
    model, positions_BT, key_mask_BT = _prepare(
        cfg, params, tokens_BT, positions_BT, key_mask_BT, cache
    )
    return model(tokens_BT, positions_BT, key_mask_BT, cache)


def features(cfg, params, tokens_BT, *, positions_BT=None, key_mask_BT=None) -> jax.Array:
    """The final normalised hidden state [B, T, D] (what the output projection reads), e.g.
    for a probe on a frozen model. Same arguments as `apply`, without a cache."""
    model, positions_BT, key_mask_BT = _prepare(cfg, params, tokens_BT, positions_BT, key_mask_BT)
    return model(tokens_BT, positions_BT, key_mask_BT, None, head=False)[0]


def _prepare(cfg, params, tokens_BT, positions_BT, key_mask_BT, cache=None):
    """The merged model and `apply`'s defaults for positions and the key mask."""
    B, T = tokens_BT.shape
    S = T if cache is None else cache.key_mask.shape[1]
    if cfg.max_len < S:
        raise ValueError(
            f"sequence/cache length {S} exceeds TransformerConfig.max_len={cfg.max_len}"
        )
    if positions_BT is None:
        start = 0 if cache is None else cache.index
        positions_BT = jnp.broadcast_to(start + jnp.arange(T, dtype=jnp.int32), (B, T))
    if key_mask_BT is None:
        key_mask_BT = jnp.ones((B, T), bool)
    return nnx.merge(_graphdef(cfg), params), positions_BT, key_mask_BT.astype(bool)


def init_cache(cfg: TransformerConfig, batch_size: int, max_len: int, dtype=None) -> KVCache:
    """An empty cache of `max_len` slots; k/v in `dtype` (default cfg.dtype)."""
    if max_len > cfg.max_len:
        raise ValueError(f"cache length {max_len} exceeds TransformerConfig.max_len={cfg.max_len}")
    dtype = jnp.dtype(dtype or cfg.dtype)
    shape = (cfg.num_layers, batch_size, max_len, cfg.num_heads, cfg.head_dim)
    return KVCache(
        k=jnp.zeros(shape, dtype),
        v=jnp.zeros(shape, dtype),
        key_mask=jnp.zeros((batch_size, max_len), bool),
        index=jnp.zeros((), jnp.int32),
    )


def num_params(params) -> int:
    """Total number of parameters (all leaves, embedding included)."""
    return sum(x.size for x in jax.tree_util.tree_leaves(params))


def flops_per_token(cfg: TransformerConfig, seq_len: int) -> float:
    """Training FLOPs (forward + backward) per token, the standard estimate (Kaplan et al.;
    PaLM appendix B):

        6 * N_matmul + 12 * num_layers * seq_len * d_model

    N_matmul = num_layers * (4 d_model^2 + 3 d_model d_ff) + d_model * vocab_size counts the
    weights that take part in a matmul (the embedding lookup and norms do not). The second
    term is the QK^T and AV products (2 matmuls x 2 FLOPs x 3 for fwd+bwd), counted over the
    full context even though the causal mask makes half of it zeros. Divide by 3 for inference.
    """
    D, F, L = cfg.d_model, cfg.d_ff, cfg.num_layers
    n_matmul = L * (4 * D * D + 3 * D * F) + D * cfg.vocab_size
    return float(6 * n_matmul + 12 * L * seq_len * D)
