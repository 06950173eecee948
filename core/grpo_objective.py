"""GRPO's objective, the pure functions `core.grpo`'s step is made of: group advantages,
teacher-forced log-probabilities of completions, the clipped surrogate with k3 KL and an
entropy bonus, its token / sequence / fixed aggregation (microbatch-additive), and which
tokens take part in the loss. Each works on arrays alone, so a method with its own rollout
(multi-turn, tool calls) or its own update reuses them."""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from core.errors import ConfigError
from core.nn import sampler
from core.nn.policy import as_policy

AGGREGATIONS = ("token", "sequence", "fixed")


def group_advantages(rewards_R, group_size: int, *, scale_std: bool = False, eps: float = 1e-4):
    """(advantages_R, informative_R): r - mean over the group, optionally / (std + eps).

    std is the unbiased one, as in TRL. informative_R is False on every row of a group whose
    rewards are all equal (such a group's advantages are exactly 0).
    """
    rewards_BG = rewards_R.astype(jnp.float32).reshape(-1, group_size)
    adv_BG = rewards_BG - rewards_BG.mean(axis=1, keepdims=True)
    if scale_std:
        adv_BG = adv_BG / (rewards_BG.std(axis=1, ddof=1, keepdims=True) + eps)
    informative_B = rewards_BG.max(axis=1) > rewards_BG.min(axis=1)
    return adv_BG.reshape(-1), jnp.repeat(informative_B, group_size)


def token_logprobs(
    policy, params, prompt_RP, prompt_mask_RP, tokens_RN, mask_RN, *, temperature, entropy=False
):
    """log softmax(logits / temperature) of each generated token, teacher-forced: [R, N].

    The same tempered distribution the sampler drew from, so at the sampling params the
    ratio to the sampler's log-probs is 1. Entries where mask_RN is False are garbage.
    With entropy=True returns (logp_RN, entropy_RN): also the entropy of that distribution
    at each completion position.
    """
    policy = as_policy(policy)
    P = prompt_RP.shape[1]
    seq_RT = jnp.concatenate([prompt_RP, tokens_RN], axis=1)
    key_mask_RT = jnp.concatenate([prompt_mask_RP.astype(bool), mask_RN.astype(bool)], axis=1)
    positions_RT = jnp.maximum(jnp.cumsum(key_mask_RT, axis=1, dtype=jnp.int32) - 1, 0)
    logits_RTV, _ = policy.apply(
        params,
        seq_RT[:, :-1],
        positions_BT=positions_RT[:, :-1],
        key_mask_BT=key_mask_RT[:, :-1],
    )
    # Position P-1+i (the last prompt token, then each generated one) predicts tokens_RN[:, i].
    logp_RNV = jax.nn.log_softmax(logits_RTV[:, P - 1 :] / temperature, axis=-1)
    logp_RN = jnp.take_along_axis(logp_RNV, tokens_RN[..., None], axis=-1)[..., 0]
    if not entropy:
        return logp_RN
    return logp_RN, -(jnp.exp(logp_RNV) * logp_RNV).sum(axis=-1)


def policy_logprobs(policy, params, scored: "Scored", *, temperature, entropy=False):
    """The default `logprob_fn`: `token_logprobs` of the scored rollout's completions;
    (logp_RN, entropy_RN or None)."""
    out = token_logprobs(
        policy,
        params,
        scored.prompt_RP,
        scored.prompt_mask_RP,
        scored.tokens_RN,
        scored.mask_RN,
        temperature=temperature,
        entropy=entropy,
    )
    return out if entropy else (out, None)


def denominator(weight_RN, aggregation: str, max_new_tokens: int):
    """What `aggregate` divides by: kept tokens ("token"), kept sequences ("sequence"), kept
    sequences x max_new_tokens ("fixed"); at least 1. Computed on the whole batch, it lets
    microbatches' aggregates sum to the whole batch's."""
    if aggregation == "token":
        return jnp.maximum(weight_RN.sum(), 1.0)
    kept_R = (weight_RN.sum(axis=1) > 0).astype(jnp.float32)
    if aggregation == "sequence":
        return jnp.maximum(kept_R.sum(), 1.0)
    if aggregation == "fixed":
        return jnp.maximum(kept_R.sum(), 1.0) * max_new_tokens
    raise ConfigError(f"aggregation={aggregation!r} is unknown; expected one of {AGGREGATIONS}")


def aggregate(per_token_RN, weight_RN, aggregation: str, max_new_tokens: int, denom=None):
    """One number from per-token values; weight_RN is 1 on tokens that count, 0 elsewhere.
    denom: `denominator(...)` of the whole batch when these rows are a microbatch of it."""
    if denom is None:
        denom = denominator(weight_RN, aggregation, max_new_tokens)
    if aggregation == "token":
        return (per_token_RN * weight_RN).sum() / denom
    per_seq_R = (per_token_RN * weight_RN).sum(axis=1)
    if aggregation == "sequence":
        per_seq_R = per_seq_R / jnp.maximum(weight_RN.sum(axis=1), 1.0)
    return per_seq_R.sum() / denom


def policy_loss(
    logp_RN,
    old_logp_RN,
    adv_R,
    weight_RN,
    gcfg,
    ref_logp_RN=None,
    *,
    entropy_RN=None,
    denoms=None,
):
    """Clipped surrogate -min(ratio A, clip(ratio) A) (+ beta KL) (- coef entropy), aggregated;
    (loss, metrics). denoms: (the loss's, the token metrics') `denominator`s of the whole
    batch, when these rows are a microbatch (metrics then sum over microbatches too)."""
    ratio_RN = jnp.exp(logp_RN - old_logp_RN)
    adv_R1 = adv_R[:, None]
    clipped_RN = jnp.clip(ratio_RN, 1.0 - gcfg.clip_low, 1.0 + gcfg.clip_high)
    per_token_RN = -jnp.minimum(ratio_RN * adv_R1, clipped_RN * adv_R1)
    weight_RN = weight_RN.astype(jnp.float32)
    loss_denom, token_denom = (None, None) if denoms is None else denoms
    stat = lambda x_RN: aggregate(x_RN, weight_RN, "token", gcfg.max_new_tokens, token_denom)  # noqa: E731
    # Clipped where the min takes the clipped term: no gradient flows through those tokens.
    active_RN = clipped_RN * adv_R1 < ratio_RN * adv_R1
    metrics = {"clip_fraction": stat(active_RN.astype(jnp.float32))}
    if ref_logp_RN is not None and gcfg.kl_beta > 0:
        # k3 = exp(ref - logp) - (ref - logp) - 1 >= 0: unbiased for KL(policy || ref) under
        # samples from the policy, with low variance (Schulman's estimator, as TRL uses).
        log_r_RN = ref_logp_RN - logp_RN
        kl_RN = jnp.exp(log_r_RN) - log_r_RN - 1.0
        per_token_RN = per_token_RN + gcfg.kl_beta * kl_RN
        metrics["kl"] = stat(kl_RN)
    if entropy_RN is not None and gcfg.entropy_coef > 0:
        per_token_RN = per_token_RN - gcfg.entropy_coef * entropy_RN
        metrics["entropy"] = stat(entropy_RN)
    loss = aggregate(per_token_RN, weight_RN, gcfg.aggregation, gcfg.max_new_tokens, loss_denom)
    return loss, metrics


def loss_weights(out: sampler.SampleOutput, informative_R, gcfg):
    """1.0 on generated tokens that take part in the loss, 0.0 elsewhere: [R, N]."""
    return policy_weights(out.mask_BN, out.done_B, informative_R, gcfg)


def policy_weights(policy_mask_RN, done_R, informative_R, gcfg):
    """`loss_weights` from a rollout's policy-token mask and done flags."""
    keep_R = jnp.ones_like(informative_R)
    if gcfg.drop_zero_variance:
        keep_R &= informative_R
    if gcfg.mask_truncated:
        keep_R &= done_R
    return (policy_mask_RN & keep_R[:, None]).astype(jnp.float32)


class Scored(NamedTuple):
    """A scored rollout, what the update trains on (R = prompts x group rows)."""

    prompt_RP: jax.Array
    prompt_mask_RP: jax.Array
    tokens_RN: jax.Array
    mask_RN: jax.Array
    adv_R: jax.Array
    weight_RN: jax.Array  # 1.0 on the tokens that take part in the loss (`loss_weights`)
