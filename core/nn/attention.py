"""Multi-head softmax attention with the mask, the position encoding and the implementation as
arguments, and an optional KV cache.

    mask_BTS = make_mask("causal", key_mask_BS)                       # or "block", ...
    q_BTHK, k_BTHK, state = encode_positions("rope", q_BTHK, k_BTHK, positions_BT=pos_BT)
    out_BTHK = attend(q_BTHK, k_BSHK, v_BSHK, mask_BTS, impl="xla")

`MultiHeadAttention` (q/k/v/o projections around these) is what `core.nn.transformer` uses; a
model with its own projections or positions (methods/selective_rope; methods/tpc's MiniLM,
whose BERT q/k/v/o carry biases) calls the functions.

Masks (`make_mask(kind, ...)`), always ANDed with the key padding mask (no query ever reads a
key whose key_mask is False):
  "causal":        key slot <= query slot (a decoder LM).
  "bidirectional": every filled key (an encoder, an embedding model, a diffusion transformer).
  "block":         block-causal from integer block ids: a key is visible when its block id is
                   <= the query's. Ids that do not decrease along the sequence give per-block
                   bidirectional attention over all earlier blocks: a prefix-LM is ids 0 on
                   the prefix and 1, 2, ... after it; block diffusion is ids t // block_size.
  "segment":       only keys of the query's own block id (packed independent sequences, or
                   bidirectional blocks that never see each other).
With a KV cache the T new queries sit at slots [index, index + T): every cached key (slot <
index) is visible to them, and the kind applies among the new tokens. That is exact for
"causal", and for "block" and "bidirectional" when a block arrives in one call (a decoder
cannot revise what earlier queries saw); "segment" has no cached form (ValueError).

Positions (`encode_positions(positions, ...)`): a kind name, "none", "rope" or "rope2d"
(`core.nn.positions`; "rope2d" takes positions [B, T, 2]: row, column), or a function a method
supplies,

    positions(q_BTHK, k_BTHK, *, positions_BT, x_BTD, key_mask_BT, state) -> (q, k, state)

e.g. selective rotary, whose angles are a cumulative sum of a projection of x: `state` is what
decoding carries from call to call (the angle offset, a conv window; None without a cache).

Implementations (`attend(..., impl=)`):
  "xla":         einsum scores in float32 (preferred_element_type), masked with the float32
                 minimum, float32 softmax, probabilities re-masked to exactly 0, einsum with v.
                 The transformer's formulation since the start: exact, the default.
                 `precision=` (e.g. HIGHEST) goes to its two einsums (default: jax's).
  "dot_product": `jax.nn.dot_product_attention` with the boolean mask (implementation=None:
                 jax picks; in jax 0.10.2 that is its XLA path, scores in float32 for float32
                 and bfloat16 inputs). On CPU in float32 it matches "xla" within float32
                 rounding (tests/core/test_attention.py states the bound).
  "auto":        "dot_product" on GPU (where jax can substitute a fused kernel as it gains one),
                 "xla" on CPU and TPU (exact; XLA:TPU fuses the einsum form itself).
Either way a query with no visible key (a left-padding token) gets an output of exactly 0
rather than an average over padding.

Grouped-query attention: k and v may have G heads, G dividing the H query heads; query head h
reads kv head h // (H // G) (`attend`; `MultiHeadAttention` with cfg.num_kv_heads).

Shape suffixes: B batch, T new tokens (queries), S key slots, H heads, G kv heads, K head dim,
D d_model.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from core.mesh import traced_platform
from core.nn import layers
from core.nn import positions as positions_lib

MASKS = ("causal", "bidirectional", "block", "segment")
IMPLS = ("xla", "dot_product", "auto")


def check_mask(kind: str) -> None:
    if kind not in MASKS:
        raise ValueError(f"unknown attention mask {kind!r}; expected one of: {', '.join(MASKS)}")


def check_impl(impl: str) -> None:
    if impl not in IMPLS:
        raise ValueError(f"unknown attention impl {impl!r}; expected one of: {', '.join(IMPLS)}")


def check_positions(positions) -> None:
    """A kind name from core.nn.positions or a function (see the module docstring)."""
    if not callable(positions):
        positions_lib.check_kind(positions)


def make_mask(
    kind: str,
    key_mask_BS: jax.Array,
    *,
    num_queries: int | None = None,
    index=0,
    block_ids_BT: jax.Array | None = None,
) -> jax.Array:
    """The boolean attention mask [B, T, S]: True where query t may read key slot s.

    key_mask_BS: True on filled, real keys (with a cache: the cache's key mask after writing
      the new tokens). num_queries: T (default S, no cache). index: the first new slot (the
      cache's index before this call; 0 without a cache). block_ids_BT: the new tokens'
      integer block ids, for "block" and "segment".
    """
    check_mask(kind)
    B, S = key_mask_BS.shape
    T = S if num_queries is None else num_queries
    slots_T = index + jnp.arange(T)
    slots_S = jnp.arange(S)
    if kind == "causal":
        visible_BTS = (slots_S[None, :] <= slots_T[:, None])[None]
    elif kind == "bidirectional":
        visible_BTS = (slots_S < index + T)[None, None, :]
    else:
        if block_ids_BT is None:
            raise ValueError(f"attention mask {kind!r} needs block_ids_BT")
        if block_ids_BT.shape != (B, T):
            raise ValueError(f"block_ids_BT has shape {block_ids_BT.shape}, expected {(B, T)}")
        if kind == "segment" and not (isinstance(index, int) and index == 0):
            raise ValueError("attention mask 'segment' has no cached form (cached keys' ids)")
        # The new tokens' ids placed at their slots; cached slots (< index) are always visible.
        ids_BS = jax.lax.dynamic_update_slice(
            jnp.zeros((B, S), block_ids_BT.dtype), block_ids_BT, (0, index)
        )
        new_S = (slots_S >= index) & (slots_S < index + T)
        q_BT1, k_B1S = block_ids_BT[:, :, None], ids_BS[:, None, :]
        same_block = (k_B1S == q_BT1) if kind == "segment" else (k_B1S <= q_BT1)
        visible_BTS = (slots_S < index)[None, None, :] | (new_S[None, None, :] & same_block)
    return jnp.broadcast_to(visible_BTS & key_mask_BS[:, None, :], (B, T, S))


def encode_positions(
    positions,
    q_BTHK,
    k_BTHK,
    *,
    positions_BT=None,
    rope_base: float = 10000.0,
    rope_layout: str = "half",
    x_BTD=None,
    key_mask_BT=None,
    state=None,
):
    """(q_BTHK, k_BTHK, state) with positions encoded; a kind name or a method's function.
    k may have fewer heads than q (grouped-query attention). rope_layout: "rope"'s pair layout
    (`core.nn.positions.rope`); a position function gets neither it nor rope_base."""
    if callable(positions):
        return positions(
            q_BTHK,
            k_BTHK,
            positions_BT=positions_BT,
            x_BTD=x_BTD,
            key_mask_BT=key_mask_BT,
            state=state,
        )
    q_BTHK, k_BTHK = positions_lib.apply_positions(
        positions, q_BTHK, k_BTHK, positions_BT, base=rope_base, layout=rope_layout
    )
    return q_BTHK, k_BTHK, state


def resolve_impl(impl: str) -> str:
    """ "auto" -> "dot_product" on GPU, "xla" elsewhere (see the module docstring)."""
    check_impl(impl)
    if impl != "auto":
        return impl
    return "dot_product" if traced_platform() == "gpu" else "xla"


def attend(q_BTHK, k_BSGK, v_BSGK, mask_BTS, *, impl: str = "xla", precision=None):
    """softmax(q k^T / sqrt(K), masked) v per head: [B, T, H, K] in v's dtype.

    k and v have G heads, G dividing H: G = H is multi-head attention; G < H is grouped-query
    attention, query head h reading kv head h // (H // G) (Hugging Face's and llama.cpp's
    grouping), computed as a grouped einsum without repeating k and v per query head.
    Rows of mask_BTS with no True entry give exactly 0. `precision` (a `jax.lax.Precision`)
    goes to "xla"'s two einsums: HIGHEST keeps float32 exact where an accelerator would
    otherwise multiply in TF32 / bfloat16 passes (a port checked against float32 reference
    numbers). None, the default, is jax's default precision.
    """
    impl = resolve_impl(impl)
    B, T, H, K = q_BTHK.shape
    G = k_BSGK.shape[2]
    if H % G or v_BSGK.shape[2] != G:
        raise ValueError(
            f"attend: {H} query heads need a kv head count dividing them, got k "
            f"{k_BSGK.shape[2]} and v {v_BSGK.shape[2]} heads"
        )
    mask_B1TS = mask_BTS[:, None]
    if impl == "dot_product":
        if precision is not None:  # jax.nn.dot_product_attention takes no precision
            raise ValueError(f"attend: precision={precision} needs impl='xla'")
        # jax groups query heads over kv heads itself (head h reads kv head h // (H // G)).
        out_BTHK = jax.nn.dot_product_attention(
            q_BTHK, k_BSGK.astype(q_BTHK.dtype), v_BSGK.astype(q_BTHK.dtype), mask=mask_B1TS
        )
        # jax averages v over a row with no visible key; zero it as "xla" does.
        any_key_BT11 = jnp.any(mask_BTS, axis=-1)[:, :, None, None]
        return jnp.where(any_key_BT11, out_BTHK, 0).astype(v_BSGK.dtype)
    if G == H:  # multi-head: the formulation since the start (same numbers, bit for bit)
        scores_BHTS = jnp.einsum(
            "bthk,bshk->bhts",
            q_BTHK,
            k_BSGK,
            precision=precision,
            preferred_element_type=jnp.float32,
        ) * (K**-0.5)
        probs_BHTS = _masked_softmax(scores_BHTS, mask_B1TS).astype(v_BSGK.dtype)
        return jnp.einsum("bhts,bshk->bthk", probs_BHTS, v_BSGK, precision=precision)
    # Grouped: query head h = g * R + r (R = H // G query heads per kv head g).
    q_BTGRK = q_BTHK.reshape(B, T, G, H // G, K)
    scores_BGRTS = jnp.einsum(
        "btgrk,bsgk->bgrts",
        q_BTGRK,
        k_BSGK,
        precision=precision,
        preferred_element_type=jnp.float32,
    ) * (K**-0.5)
    probs_BGRTS = _masked_softmax(scores_BGRTS, mask_B1TS[:, None]).astype(v_BSGK.dtype)
    out_BTGRK = jnp.einsum("bgrts,bsgk->btgrk", probs_BGRTS, v_BSGK, precision=precision)
    return out_BTGRK.reshape(B, T, H, K)


def _masked_softmax(scores, mask):
    """Float32 softmax over the last axis where `mask` (broadcast to scores) is True; exactly 0
    elsewhere."""
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    # A query with no valid key (a padding token at the start of a left-padded row) would
    # get a uniform average over padding; zero it instead. Elsewhere masked probs are
    # already exactly 0 (exp underflows), so this changes nothing for real tokens.
    return jnp.where(mask, probs, 0.0)


class MultiHeadAttention(nnx.Module):
    """q, k, v, o projections (bias-free; q and o [D, D], k and v [D, G * K] with G kv heads)
    around `encode_positions` and `attend`;
    qk_norm=True adds an RMSNorm over each head's features of q and of k (one scale [K] each,
    shared by the heads, as DDT / SD3 / FLUX): every score is then at most sqrt(K) times the
    largest entries of the two scales (sqrt(K) at init), whatever the input's size.

    cfg needs d_model, num_heads, dtype, param_dtype (and rope_base for "rope"); optional
    fields: num_kv_heads (G; None or absent = num_heads: multi-head attention, fewer:
    grouped-query attention, see `attend`), rope_layout ("half" when absent,
    `core.nn.positions.rope`), norm_eps (qk_norm's, `layers.norm_factory`). q, k and v
    are separate projections so tensor parallelism can split each over heads by sharding its
    output dim (a fused [D, 3D] kernel split contiguously would hand whole q/k/v blocks to
    devices). `positions` and `impl` are fixed at construction; the mask comes per call
    (`make_mask`, built once per forward and shared by the layers).
    """

    def __init__(
        self,
        cfg,
        rngs: nnx.Rngs,
        *,
        positions: str | Callable = "rope",
        impl: str = "xla",
        qk_norm: bool = False,
    ):
        check_positions(positions)
        check_impl(impl)
        dense = layers.dense_factory(cfg, rngs)
        D, H = cfg.d_model, cfg.num_heads
        G = getattr(cfg, "num_kv_heads", None) or H
        if H % G:
            raise ValueError(f"num_kv_heads={G} must divide num_heads={H}")
        KV = G * (D // H)
        # Built in this order (q, k, v, o) so initialisation draws as it always has.
        self.q, self.k, self.v, self.o = dense(D, D), dense(D, KV), dense(D, KV), dense(D, D)
        if qk_norm:  # no parameters otherwise: existing checkpoints keep their tree
            norm = layers.norm_factory(cfg)
            self.q_norm, self.k_norm = norm(D // cfg.num_heads), norm(D // cfg.num_heads)
        self.qk_norm = qk_norm
        self.num_heads, self.num_kv_heads = H, G
        self.rope_base = getattr(cfg, "rope_base", 10000.0)
        self.rope_layout = getattr(cfg, "rope_layout", "half")
        self.positions = positions
        self.impl = impl

    def __call__(
        self, x_BTD, positions_BT, mask_BTS, cache_kv=None, layer: int = 0, key_mask_BT=None
    ):
        """(y_BTD, new cache_kv or None).

        A position function gets x_BTD, key_mask_BT and state=None (a function that carries
        decoding state needs a model with its own cache, as methods/selective_rope has).

        Without a cache the keys are the T new tokens (S = T). With `cache_kv = (k_LBSGK,
        v_LBSGK, index)` (per-layer stacks of the G kv heads, `core.nn.transformer.KVCache`)
        the new keys
        and values are written at slots [index, index+T) of layer `layer` and the queries
        attend over all S slots; returns the updated (k, v) stacks.
        """
        B, T, D = x_BTD.shape
        H, G = self.num_heads, self.num_kv_heads
        K = D // H
        q_BTHK = self.q(x_BTD).reshape(B, T, H, K)
        k_BTGK = self.k(x_BTD).reshape(B, T, G, K)
        v_BTGK = self.v(x_BTD).reshape(B, T, G, K)
        if self.qk_norm:  # before the rotation, which keeps the norm (DDT, SD3)
            q_BTHK, k_BTGK = self.q_norm(q_BTHK), self.k_norm(k_BTGK)
        q_BTHK, k_BTGK, _ = encode_positions(
            self.positions,
            q_BTHK,
            k_BTGK,
            positions_BT=positions_BT,
            rope_base=self.rope_base,
            rope_layout=self.rope_layout,
            x_BTD=x_BTD,
            key_mask_BT=key_mask_BT,
        )
        new_cache_kv = None
        if cache_kv is None:
            k_BSGK, v_BSGK = k_BTGK, v_BTGK
        else:
            k_LBSGK, v_LBSGK, index = cache_kv
            start = (layer, 0, index, 0, 0)
            k_LBSGK = jax.lax.dynamic_update_slice(
                k_LBSGK, k_BTGK[None].astype(k_LBSGK.dtype), start
            )
            v_LBSGK = jax.lax.dynamic_update_slice(
                v_LBSGK, v_BTGK[None].astype(v_LBSGK.dtype), start
            )
            new_cache_kv = (k_LBSGK, v_LBSGK)
            k_BSGK = k_LBSGK[layer].astype(q_BTHK.dtype)
            v_BSGK = v_LBSGK[layer].astype(q_BTHK.dtype)
        out_BTHK = attend(q_BTHK, k_BSGK, v_BSGK, mask_BTS, impl=self.impl)
        return self.o(out_BTHK.reshape(B, T, H * K)), new_cache_kv


def write_cache(cache: dict, k_BTHK, v_BTHK, key_mask_BT):
    """A one-layer cache {"k", "v": [B, S, H, K], "kv_mask": [B, S], "index": scalar} with T
    new keys/values written at slots [index, index+T); index advanced by T."""
    index = cache["index"]
    write = lambda buf, new: jax.lax.dynamic_update_slice_in_dim(  # noqa: E731
        buf, new.astype(buf.dtype), index, 1
    )
    return dict(
        k=write(cache["k"], k_BTHK),
        v=write(cache["v"], v_BTHK),
        kv_mask=write(cache["kv_mask"], key_mask_BT),
        index=index + k_BTHK.shape[1],
    )
