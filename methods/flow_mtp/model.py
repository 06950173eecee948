"""The PTP student: one causal transformer call over the context and L completion slots.

    params = init_params(cfg, rng)
    logits_BLV = student_logits(cfg, params, context_BC, context_mask_BC, u_BL)

Input sequence [context (C tokens, left-padded) ; slot 1 .. slot L]: context positions get the
token embedding, slot k gets u_emb(u_k), the auxiliary variable's embedding (with
`use_u=False`, the no-u baseline, every slot gets u_emb(0), one learned vector: independent
multi-token prediction). Positions are rotary (`core.nn`), so slot k knows its offset from the
context. The mask is the shared attention's causal mask with key padding: slot k sees the
context and slots <= k of its own completion, which is exactly PTP's block mask for one
completion per row (the official code packs many completions per sequence over one AR pass;
that needs a mask kind core.nn does not have yet and matters only when the AR pass is costly).
Slot k's logits predict completion token k (a teacher sample given the context and u_<=k).

u_emb is the official code's default `LinearInterpolationEmbedding`: learned anchors at u = 0,
1/2, 1 (3 by default), linearly interpolated, so nearby u's get nearby embeddings.
"""

import dataclasses

import jax
import jax.numpy as jnp

from core.nn import transformer


@dataclasses.dataclass(frozen=True)
class StudentConfig:
    net: transformer.TransformerConfig
    context_len: int  # C: contexts are left-padded to this
    completion_len: int  # L
    num_anchors: int = 3
    use_u: bool = True

    def __post_init__(self):
        if self.context_len < 1 or self.completion_len < 1:
            raise ValueError(
                f"context_len={self.context_len} and completion_len={self.completion_len} "
                "must be >= 1"
            )
        if self.num_anchors < 2:
            raise ValueError(f"num_anchors={self.num_anchors} must be >= 2 (u = 0 and u = 1)")
        if self.net.max_len < self.context_len + self.completion_len:
            raise ValueError(
                f"net.max_len={self.net.max_len} < context_len + completion_len = "
                f"{self.context_len + self.completion_len}"
            )


def init_params(cfg: StudentConfig, rng) -> dict:
    net_rng, u_rng = jax.random.split(rng)
    D = cfg.net.d_model
    # The scale of the token embedding's rows (nnx.Embed: variance 1 / D), so neither input
    # kind dominates the first block.
    anchors = jax.random.normal(u_rng, (cfg.num_anchors, D), jnp.float32) / jnp.sqrt(D)
    return {"net": transformer.init_params(cfg.net, net_rng), "u_anchors": anchors}


def u_embedding(anchors_AD: jax.Array, u_BL: jax.Array) -> jax.Array:
    """Linear interpolation between anchors at u = 0, 1/(A-1), ..., 1: [B, L, D]."""
    anchors_AD = jnp.asarray(anchors_AD)  # host arrays cannot be indexed by traced u's
    A = anchors_AD.shape[0]
    scaled = jnp.clip(u_BL, 0.0, 1.0) * (A - 1)
    lower = jnp.clip(jnp.floor(scaled), 0, A - 2).astype(jnp.int32)
    frac = (scaled - lower)[..., None]
    return anchors_AD[lower] * (1.0 - frac) + anchors_AD[lower + 1] * frac


def student_logits(cfg: StudentConfig, params, context_BC, context_mask_BC, u_BL):
    """Slot logits [B, L, V] (float32). context_mask_BC: True on real (right-aligned) tokens."""
    B, C = context_BC.shape
    if cfg.context_len != C or u_BL.shape != (B, cfg.completion_len):
        raise ValueError(
            f"context {context_BC.shape} / u {u_BL.shape} do not match context_len="
            f"{cfg.context_len}, completion_len={cfg.completion_len}"
        )
    if not cfg.use_u:
        u_BL = jnp.zeros_like(u_BL)
    tok_BCD = transformer.embed(cfg.net, params["net"], context_BC)
    slot_BLD = u_embedding(params["u_anchors"], u_BL).astype(tok_BCD.dtype)
    x_BTD = jnp.concatenate([tok_BCD, slot_BLD], axis=1)
    mask_BC = context_mask_BC.astype(bool)
    key_mask_BT = jnp.concatenate([mask_BC, jnp.ones(u_BL.shape, bool)], axis=1)
    positions_BT = jnp.cumsum(key_mask_BT, axis=1, dtype=jnp.int32) - 1  # 0 at the first token
    logits_BTV, _ = transformer.apply(
        cfg.net,
        params["net"],
        embeddings_BTD=x_BTD,
        positions_BT=positions_BT,
        key_mask_BT=key_mask_BT,
    )
    return logits_BTV[:, C:]
