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

Slot positions: slot k sits at s + k - 1 (0-based k), one after the last context token, by
default. The official code shifts auxiliary position ids by -1 (`shift_positions=True` there:
slot k at s + k - 2 in these terms, the first slot at the last context token's position, where a
pretrained AR model's head predicts the first completion token); `shift_positions=True` here
does the same. With rotary positions only differences matter, so the shift changes just the
slots' distance to the context by one, which a student trained from scratch can absorb (the
README has the measured comparison). `sequence_logits` is the shared forward: context token
embeddings followed by any tail of embeddings (u slots here; `cptp` feeds u's of earlier
tokens, or token embeddings for its AR pass).
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
    shift_positions: bool = False  # slots one position earlier (the official code's choice)

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


def check_inputs(cfg: StudentConfig, context_BC, per_slot_BL) -> None:
    """One-line error unless context is [B, C] and the per-slot input [B, L] of this config."""
    B, C = context_BC.shape
    if cfg.context_len != C or per_slot_BL.shape != (B, cfg.completion_len):
        raise ValueError(
            f"context {context_BC.shape} / slots {per_slot_BL.shape} do not match context_len="
            f"{cfg.context_len}, completion_len={cfg.completion_len}"
        )


def sequence_logits(
    cfg: StudentConfig, params, context_BC, context_mask_BC, tail_BTD, *, shift_tail: bool = False
):
    """Logits [B, C + T, V] (float32) of one causal call over [context tokens ; tail_BTD].

    context_mask_BC: True on real (right-aligned) tokens. Positions count real tokens from 0;
    shift_tail puts the tail one position earlier (its first entry at the last context
    token's position). The mask is causal with key padding: tail entry t sees the context and
    tail entries <= t."""
    tok_BCD = transformer.embed(cfg.net, params["net"], context_BC)
    x_BTD = jnp.concatenate([tok_BCD, tail_BTD.astype(tok_BCD.dtype)], axis=1)
    mask_BC = context_mask_BC.astype(bool)
    tail_T = tail_BTD.shape[1]
    key_mask_BT = jnp.concatenate([mask_BC, jnp.ones((mask_BC.shape[0], tail_T), bool)], axis=1)
    positions_BT = jnp.cumsum(key_mask_BT, axis=1, dtype=jnp.int32) - 1  # 0 at the first token
    if shift_tail:
        positions_BT = positions_BT - (jnp.arange(key_mask_BT.shape[1]) >= mask_BC.shape[1])
    logits_BTV, _ = transformer.apply(
        cfg.net,
        params["net"],
        embeddings_BTD=x_BTD,
        positions_BT=positions_BT,
        key_mask_BT=key_mask_BT,
    )
    return logits_BTV


def student_logits(cfg: StudentConfig, params, context_BC, context_mask_BC, u_BL):
    """Slot logits [B, L, V] (float32). context_mask_BC: True on real (right-aligned) tokens."""
    check_inputs(cfg, context_BC, u_BL)
    C = context_BC.shape[1]
    if not cfg.use_u:
        u_BL = jnp.zeros_like(u_BL)
    slot_BLD = u_embedding(params["u_anchors"], u_BL)
    logits_BTV = sequence_logits(
        cfg, params, context_BC, context_mask_BC, slot_BLD, shift_tail=cfg.shift_positions
    )
    return logits_BTV[:, C:]
