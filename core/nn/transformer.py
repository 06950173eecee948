"""A decoder-only transformer: Flax NNX inside, pure functions over plain pytrees outside.

    params = init_params(cfg, rng)                     # nested dict of float32 arrays
    logits_BTV, _ = apply(cfg, params, tokens_BT)      # training / scoring
    cache = init_cache(cfg, batch_size, max_len)       # decoding: prefill, then T=1 steps
    logits_BTV, cache = apply(cfg, params, tokens_BT, positions_BT=pos_BT, cache=cache)
    logits_BTV, _ = apply(cfg, params, embeddings_BTD=x_BTD)   # embeddings in (soft tokens)
    out = forward(cfg, params, tokens_BT, capture=("blocks/0", "final_norm"))
    out.logits_BTV, out.captured["blocks/0"]           # intermediates the caller named
    pol = policy(cfg)                                  # the `core.nn.policy.Policy` of cfg

Architecture: token embedding -> num_layers x [RMSNorm -> MHA or GQA -> residual; RMSNorm ->
SwiGLU MLP -> residual] -> RMSNorm -> untied or tied output projection (`core.nn.layers`,
`core.nn.attention`): a Llama. No biases, no dropout. Llama's options are config fields
(`core.nn.transformer_config`): num_kv_heads (grouped-query attention, a smaller KV cache),
tie_embeddings (logits = final_norm(h) @ embed.embedding.T, no lm_head parameter), rope_layout
("half" or "interleaved" rotary pairs) and norm_eps. The attention mask (cfg.attention_mask:
causal by default; bidirectional, block or segment from `block_ids_BT`), the position encoding
(cfg.position: "rope", "none" or a position function) and the attention implementation
(cfg.attention_impl) are config fields; the defaults are the causal LM this module has always
been, with the same numbers and the same parameter paths.

Precision: params in cfg.param_dtype (float32), matmuls in cfg.dtype; norms, attention scores,
softmax and the output logits in float32 (bfloat16 softmax and logits lose too much).

Capture names (`forward(..., capture=...)`, see `capture_names`): "embed" (the input
embeddings), "blocks/<i>/attn" and "blocks/<i>/mlp" (a block's two residual updates),
"blocks/<i>/mlp/gate" (the SwiGLU gate before SiLU [B, T, F], after `gate_mask_LF`),
"blocks/<i>" (the residual stream after block i), "final_norm" (what the output projection
reads, = `features`).

Unit lesions: `forward(..., gate_mask_LF=m)` multiplies layer i's gate pre-activation by m[i]
along the unit axis (F, the last), at every position and every cached step; one compiled
function serves every mask (vmap over masks). Without a mask no product is traced.

Shape suffixes: B batch, T new tokens, S key slots, H heads, K head dim, D d_model, F d_ff,
V vocab, L layers.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax
from jax.sharding import PartitionSpec as P

from core.nn import attention, layers
from core.nn.policy import Policy
from core.nn.pure import PureModule
from core.nn.transformer_config import (  # noqa: F401 (transformer.<name>)
    TransformerConfig,
    flops_per_token,
)

# Re-exported: methods built these from here before core.nn.layers existed.
RMSNorm, SwiGLU, dense_factory = layers.RMSNorm, layers.SwiGLU, layers.dense_factory


class KVCache(NamedTuple):
    """Decoding state; a plain pytree that can be a `lax.while_loop` carry.

    Slots [0, index) are filled. key_mask is False on unfilled slots and on padding tokens, and
    attention never reads a slot whose key_mask is False.
    """

    k: jax.Array  # [L, B, S, G, K] (G = cfg.kv_heads), rotary already applied
    v: jax.Array  # [L, B, S, G, K]
    key_mask: jax.Array  # [B, S] bool
    index: jax.Array  # int32 scalar: number of filled slots


# Tensor parallel (Megatron) layout over mesh axis "model": q/k/v, gate/up and the output
# projection split their output dim, the attention-out and MLP-down kernels their input dim, and
# the embedding its vocab dim. Suffix patterns ending in "$" (preceded by "/" or the start) so
# the same rule matches "blocks/0/attn/q/kernel" and "opt_state/0/mu/blocks/0/attn/q/kernel".
# RMSNorm scales (1-D) are deliberately unmatched: replicated, or FSDP'd by the core. A rule
# whose mesh axis does not divide the dim is dropped (core.sharding): GQA's k/v kernels
# [D, kv_heads * K] stay replicated over a "model" axis that does not divide kv_heads * K; one
# that divides kv_heads * K but not kv_heads splits a head over devices (SmolLM2's [576, 192]
# over 2, 4 or 8 devices; its q [576, 576], 9 heads, alike): correct, XLA moves the data, but
# not the Megatron one-head-per-device layout, which needs "model" to divide kv_heads.
# Tied embeddings have no lm_head: the embedding's vocab split serves the output projection.
SHARDING_RULES = (
    (r"(^|/)embed/embedding$", P("model", None)),
    (r"(^|/)attn/(q|k|v)/kernel$", P(None, "model")),
    (r"(^|/)attn/o/kernel$", P("model", None)),
    (r"(^|/)mlp/(gate|up)/kernel$", P(None, "model")),
    (r"(^|/)mlp/down/kernel$", P("model", None)),
    (r"(^|/)lm_head/kernel$", P(None, "model")),
)


class Transformer(nnx.Module):
    def __init__(self, cfg: TransformerConfig, rngs: nnx.Rngs):
        dtype, param_dtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        self.embed = nnx.Embed(
            cfg.vocab_size, cfg.d_model, dtype=dtype, param_dtype=param_dtype, rngs=rngs
        )
        mha = functools.partial(
            attention.MultiHeadAttention, positions=cfg.position, impl=cfg.attention_impl
        )
        self.blocks = nnx.List(
            [layers.PreNormBlock(cfg, mha(cfg, rngs), rngs) for _ in range(cfg.num_layers)]
        )
        self.final_norm = layers.norm_factory(cfg)(cfg.d_model)
        # float32 logits straight out of the matmul: bfloat16 logits would round by ~0.03.
        if not cfg.tie_embeddings:  # tied: no parameter (embed.embedding serves, `project`)
            self.lm_head = nnx.Linear(
                cfg.d_model,
                cfg.vocab_size,
                use_bias=False,
                dtype=dtype,
                param_dtype=param_dtype,
                preferred_element_type=jnp.float32,
                dot_general=layers.flat_dot_general,
                rngs=rngs,
            )
        self.cfg = cfg

    def project(self, h_BTD):
        """The output projection of a final-normed state: float32 logits [B, T, V]."""
        if not self.cfg.tie_embeddings:
            return self.lm_head(h_BTD).astype(jnp.float32)
        # h @ E^T in cfg.dtype with float32 accumulation, as lm_head computes its matmul.
        embedding_DV = self.embed.embedding[...].astype(h_BTD.dtype).T
        contract = (((h_BTD.ndim - 1,), (0,)), ((), ()))
        return layers.flat_dot_general(
            h_BTD, embedding_DV, contract, preferred_element_type=jnp.float32
        ).astype(jnp.float32)

    def __call__(
        self,
        x_BTD,
        positions_BT,
        key_mask_BT,
        cache=None,
        *,
        block_ids_BT=None,
        capture=(),
        head=True,
        gate_mask_LF=None,
    ):
        """(logits_BTV or None, new cache or None, captured dict) from input embeddings."""
        T = x_BTD.shape[1]
        captured = {}

        def keep(name, value):
            if name in capture:
                captured[name] = value

        keep("embed", x_BTD)
        if cache is None:
            index, key_mask_BS, cache_kv = 0, key_mask_BT, None
        else:
            index = cache.index
            key_mask_BS = lax.dynamic_update_slice(cache.key_mask, key_mask_BT, (0, index))
            cache_kv = (cache.k, cache.v)
        mask_BTS = attention.make_mask(
            self.cfg.attention_mask,
            key_mask_BS,
            num_queries=T,
            index=index,
            block_ids_BT=block_ids_BT,
        )
        for layer, block in enumerate(self.blocks):
            if cache is not None:
                cache_kv = (*cache_kv, index)
            x_BTD, cache_kv, sub = block(
                x_BTD,
                positions_BT,
                mask_BTS,
                cache_kv,
                layer,
                key_mask_BT=key_mask_BT,
                gate_mask_F=None if gate_mask_LF is None else gate_mask_LF[layer],
            )
            keep(f"blocks/{layer}/attn", sub["attn"])
            keep(f"blocks/{layer}/mlp", sub["mlp"])
            keep(f"blocks/{layer}/mlp/gate", sub["mlp/gate"])
            keep(f"blocks/{layer}", x_BTD)
        h_BTD = self.final_norm(x_BTD)
        keep("final_norm", h_BTD)
        logits_BTV = self.project(h_BTD) if head else None
        new_cache = None if cache is None else KVCache(*cache_kv, key_mask_BS, index + T)
        return logits_BTV, new_cache, captured


MODULE = PureModule(Transformer)
_graphdef = MODULE.graphdef  # the static structure per cfg (tests merge params into it)


def init_params(cfg: TransformerConfig, rng: jax.Array) -> dict:
    """Fresh parameters as a nested dict of arrays, e.g. params["blocks"][0]["attn"]["q"]
    ["kernel"]. Safe under `jax.eval_shape(functools.partial(init_params, cfg), rng)`."""
    return MODULE.init(cfg, rng)


class Output(NamedTuple):
    logits_BTV: jax.Array | None  # float32 [B, T, V]; None with head=False
    cache: KVCache | None  # the advanced cache (None without one)
    captured: dict  # capture name -> array, for the names the caller asked for


def capture_names(cfg: TransformerConfig) -> tuple[str, ...]:
    """Every name `forward(..., capture=...)` accepts (module docstring)."""
    per_block = [
        (f"blocks/{i}/attn", f"blocks/{i}/mlp", f"blocks/{i}/mlp/gate", f"blocks/{i}")
        for i in range(cfg.num_layers)
    ]
    return ("embed", *(name for names in per_block for name in names), "final_norm")


def embed(cfg: TransformerConfig, params: dict, tokens_BT: jax.Array) -> jax.Array:
    """The token embeddings [B, T, D] in cfg.dtype, exactly what `apply` feeds its first block
    (a soft token is a probability-weighted sum of rows of params["embed"]["embedding"])."""
    module = MODULE.bind(cfg, params).embed
    return module(tokens_BT)


def forward(
    cfg: TransformerConfig,
    params: dict,
    tokens_BT: jax.Array | None = None,
    *,
    embeddings_BTD: jax.Array | None = None,
    positions_BT: jax.Array | None = None,
    key_mask_BT: jax.Array | None = None,
    block_ids_BT: jax.Array | None = None,
    cache: KVCache | None = None,
    capture=(),
    head: bool = True,
    gate_mask_LF: jax.Array | None = None,
) -> Output:
    """`apply` with the intermediates named in `capture` (`capture_names`) returned in
    `Output.captured`; head=False skips the output projection (logits None); gate_mask_LF
    [num_layers, d_ff] multiplies every MLP's gate pre-activation along the unit axis (the
    module docstring's unit lesions)."""
    unknown = sorted(set(capture) - set(capture_names(cfg)))
    if unknown:
        raise ValueError(
            f"unknown capture name(s) {', '.join(unknown)}; expected any of: "
            + ", ".join(capture_names(cfg))
        )
    if (tokens_BT is None) == (embeddings_BTD is None):
        raise ValueError("pass exactly one of tokens_BT and embeddings_BTD")
    model = MODULE.bind(cfg, params)
    x_BTD = model.embed(tokens_BT) if embeddings_BTD is None else embeddings_BTD
    x_BTD = x_BTD.astype(jnp.dtype(cfg.dtype))
    B, T, _ = x_BTD.shape
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
    if gate_mask_LF is not None and gate_mask_LF.shape != (cfg.num_layers, cfg.d_ff):
        raise ValueError(
            f"gate_mask_LF has shape {tuple(gate_mask_LF.shape)}, expected "
            f"(num_layers, d_ff) = {(cfg.num_layers, cfg.d_ff)}"
        )
    logits_BTV, cache, captured = model(
        x_BTD,
        positions_BT,
        key_mask_BT.astype(bool),
        cache,
        block_ids_BT=block_ids_BT,
        capture=tuple(capture),
        head=head,
        gate_mask_LF=gate_mask_LF,
    )
    return Output(logits_BTV, cache, captured)


def apply(
    cfg: TransformerConfig,
    params: dict,
    tokens_BT: jax.Array | None = None,
    *,
    embeddings_BTD: jax.Array | None = None,
    positions_BT: jax.Array | None = None,
    key_mask_BT: jax.Array | None = None,
    block_ids_BT: jax.Array | None = None,
    cache: KVCache | None = None,
) -> tuple[jax.Array, KVCache | None]:
    """Next-token logits (float32 [B, T, V]) and the advanced cache (None without one).

    tokens_BT or embeddings_BTD [B, T, D] (e.g. `embed`'s output, or a soft token's
      probability-weighted embedding): exactly one of them.
    positions_BT: rotary positions; default arange(T), offset by cache.index with a cache.
      Left-padded rows should pass cumsum(key_mask) - 1 so each row's first real token is 0.
    key_mask_BT: True on real tokens; no query ever attends to a False key. Default all True.
    block_ids_BT: integer block ids, for cfg.attention_mask "block" or "segment".
    cache: from `init_cache`; the T tokens go to slots [index, index+T), which must fit in
      the cache (inside jit an overflow cannot raise: `dynamic_update_slice` clamps the start).
    """
    out = forward(
        cfg,
        params,
        tokens_BT,
        embeddings_BTD=embeddings_BTD,
        positions_BT=positions_BT,
        key_mask_BT=key_mask_BT,
        block_ids_BT=block_ids_BT,
        cache=cache,
    )
    return out.logits_BTV, out.cache


def next_token_loss(cfg, params, batch, *, rng=None, extra=None):
    """Masked cross-entropy of `targets` given `inputs`, averaged over masked positions, with
    the token accuracy there: the loss of a Method training this LM on batches of `inputs`,
    `targets`, `mask` [B, T] (`functools.partial(next_token_loss, cfg)`)."""
    del rng, extra
    logits_BTV, _ = apply(cfg, params, batch["inputs"])
    mask_BT = batch["mask"].astype(jnp.float32)
    log_probs_BTV = jax.nn.log_softmax(logits_BTV)
    nll_BT = -jnp.take_along_axis(log_probs_BTV, batch["targets"][..., None], axis=-1)[..., 0]
    denom = jnp.maximum(mask_BT.sum(), 1.0)
    correct_BT = (jnp.argmax(logits_BTV, -1) == batch["targets"]).astype(jnp.float32)
    metrics = {
        "accuracy": (correct_BT * mask_BT).sum() / denom,
        "num_tokens": jnp.asarray(batch["inputs"].size, jnp.float32),
    }
    return (nll_BT * mask_BT).sum() / denom, metrics


def features(cfg, params, tokens_BT, *, positions_BT=None, key_mask_BT=None) -> jax.Array:
    """The final normalised hidden state [B, T, D] (what the output projection reads), e.g.
    for a probe on a frozen model. Same arguments as `apply`, without a cache."""
    out = forward(
        cfg,
        params,
        tokens_BT,
        positions_BT=positions_BT,
        key_mask_BT=key_mask_BT,
        capture=("final_norm",),
        head=False,
    )
    return out.captured["final_norm"]


def init_cache(cfg: TransformerConfig, batch_size: int, max_len: int, dtype=None) -> KVCache:
    """An empty cache of `max_len` slots for cfg.kv_heads heads; k/v in `dtype` (default
    cfg.dtype)."""
    if max_len > cfg.max_len:
        raise ValueError(f"cache length {max_len} exceeds TransformerConfig.max_len={cfg.max_len}")
    dtype = jnp.dtype(dtype or cfg.dtype)
    shape = (cfg.num_layers, batch_size, max_len, cfg.kv_heads, cfg.head_dim)
    return KVCache(
        k=jnp.zeros(shape, dtype),
        v=jnp.zeros(shape, dtype),
        key_mask=jnp.zeros((batch_size, max_len), bool),
        index=jnp.zeros((), jnp.int32),
    )


@functools.lru_cache(maxsize=64)
def policy(cfg: TransformerConfig) -> Policy:
    """The LM as a `core.nn.policy.Policy` (what core.nn.sampler and core.grpo take). Cached
    per cfg, so the same cfg gives the same (hashable) object and jit compiles once."""
    return Policy(
        apply=functools.partial(apply, cfg),
        init_cache=functools.partial(init_cache, cfg),
        embed=functools.partial(embed, cfg),
    )


def num_params(params) -> int:
    """Total number of parameters (all leaves, embedding included)."""
    return sum(x.size for x in jax.tree_util.tree_leaves(params))


def head(cfg: TransformerConfig, params: dict, x_BTD: jax.Array) -> jax.Array:
    """The output head on a residual stream: the final norm, then the output projection
    (float32 logits [B, T, V]). On a block's output (the "blocks/<i>" capture) this is the
    logit lens; on the last block's output it gives `apply`'s logits."""
    model = MODULE.bind(cfg, params)
    return model.project(model.final_norm(x_BTD))
