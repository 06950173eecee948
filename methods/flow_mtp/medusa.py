"""The Medusa-style drafter: independent heads on the teacher's last hidden state.

    params = init_params(teacher_lm_head_DV, num_heads=L)
    logits_BLV = head_logits(params, h_BD)      # h: the frozen teacher's final normalised state
    proposal_BL = propose_inverse_cdf(probs_BLV, u_BL)

Head k (k = 1..L) predicts completion token k from h at the last context position, the form of
Medusa-1 (Cai et al. 2024, FasterDecoding/Medusa `ResBlock` + linear head): z = h + SiLU(W_k h +
b_k), logits = z @ U_k, with W_k = 0 and U_k = the teacher's output projection at
initialisation, so every head starts as the teacher's next-token head; the teacher is frozen.
The loss is the heads' cross-entropy against the teacher's sampled tokens, averaged over heads
(Medusa weighs far heads less; here every head counts the same).

For a lossless comparison with PTP on the same footing the drafter proposes by the inverse CDF
of each head's own distribution at the same u_k that PTP is given (`propose_inverse_cdf`): a
head never sees u (its distribution is a function of h alone), which is exactly what PTP adds.
"""

import jax
import jax.numpy as jnp

from methods.flow_mtp import bins


def init_params(lm_head_DV, num_heads: int) -> dict:
    D, V = lm_head_DV.shape
    return {
        "res_w": jnp.zeros((num_heads, D, D), jnp.float32),
        "res_b": jnp.zeros((num_heads, D), jnp.float32),
        "out": jnp.broadcast_to(jnp.asarray(lm_head_DV, jnp.float32), (num_heads, D, V)),
    }


def head_logits(params, h_BD) -> jax.Array:
    """Every head's logits [B, L, V] from the last hidden state h [B, D] (float32)."""
    h_BD = h_BD.astype(jnp.float32)
    pre_BLD = jnp.einsum("bd,lde->ble", h_BD, params["res_w"]) + params["res_b"][None]
    z_BLD = h_BD[:, None, :] + jax.nn.silu(pre_BLD)
    return jnp.einsum("bld,ldv->blv", z_BLD, params["out"])


def propose_inverse_cdf(probs_BLV, u_BL) -> jax.Array:
    """Slot k's token: the inverse CDF of the head's distribution at u_k (vocabulary order)."""
    return bins.pick(bins.cdf_edges(probs_BLV), u_BL)


def loss_fn(params, batch, *, rng=None, extra=None):
    """Mean cross-entropy of the heads against the completion (batch["h"]: [B, D] precomputed
    from the frozen teacher), with the leading-correct count of each head's argmax."""
    del rng, extra
    logits_BLV = head_logits(params, batch["h"])
    log_probs = jax.nn.log_softmax(logits_BLV)
    target_BL = batch["completion"]
    nll_BL = -jnp.take_along_axis(log_probs, target_BL[..., None], axis=-1)[..., 0]
    predicted_BL = jnp.argmax(logits_BLV, axis=-1)
    metrics = {"accuracy": (predicted_BL == target_BL).mean()}
    return nll_BL.mean(), metrics


def drafter(teacher, params, *, greedy: bool = False):
    """propose(context_BC, context_mask_BC, u_BL) for `decode.generate`: one teacher pass over
    the context for h, then every head at once (inverse CDF at u, or each head's argmax)."""

    def propose(context_BC, context_mask_BC, u_BL):
        del context_mask_BC  # the teacher reads its window as given (code_teacher docstring)
        h_BD = teacher.features(context_BC)[:, -1]
        logits_BLV = head_logits(params, h_BD)
        if greedy:
            return jnp.argmax(logits_BLV, axis=-1).astype(jnp.int32)
        return propose_inverse_cdf(jax.nn.softmax(logits_BLV, axis=-1), u_BL)

    return propose
