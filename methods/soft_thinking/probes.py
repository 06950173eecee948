"""Probes of soft thinking: how far the next-token distribution after a concept token is from
the one after its top-1 (or top-2) token alone.

Jensen-Shannon divergence in nats: JS(P, Q) = (KL(P || M) + KL(Q || M)) / 2, M = (P + Q) / 2,
between 0 (P = Q) and ln 2 (disjoint supports).
"""

import jax
import jax.numpy as jnp


def js_divergence(logits_a_BV, logits_b_BV):
    """JS(softmax(a), softmax(b)) per row [B], natural log, in [0, ln 2]. Terms with p = 0
    count 0 (p log p -> 0): a -inf logit (a pruned token) gives 0 * (-inf) nowhere."""
    log_p_BV = jax.nn.log_softmax(logits_a_BV.astype(jnp.float32), axis=-1)
    log_q_BV = jax.nn.log_softmax(logits_b_BV.astype(jnp.float32), axis=-1)
    log_m_BV = jnp.logaddexp(log_p_BV, log_q_BV) - jnp.log(2.0)

    def kl_to_m(log_x_BV):
        terms_BV = jnp.exp(log_x_BV) * (log_x_BV - log_m_BV)
        return jnp.sum(jnp.where(jnp.isfinite(log_x_BV), terms_BV, 0.0), axis=-1)

    js_B = 0.5 * (kl_to_m(log_p_BV) + kl_to_m(log_q_BV))
    # Rounding can leave it a few ulps outside [0, ln 2].
    return jnp.clip(js_B, 0.0, jnp.log(2.0))
