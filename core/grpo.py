"""GRPO: group-relative policy optimisation of a `core.nn.transformer` policy.

    step = grpo.make_step(cfg, tx, reward_fn, grpo.GRPOConfig(group_size=16, max_new_tokens=8))

One step, all inside one jit: sample G completions per prompt with the cached sampler
(`rollout`), score them (`reward_fn`), subtract each group's mean reward (`group_advantages`),
and take `ppo_epochs` clipped policy-gradient updates on the generated tokens (`policy_loss`).

`reward_fn(batch_R, tokens_RN, mask_RN) -> (rewards_R, metrics)` must be jittable; batch_R is the
prompt batch with every field repeated G times (rows of one prompt are contiguous), tokens_RN the
completions and mask_RN True on generated tokens up to and including eos. R = B * G.

Defaults follow Dr. GRPO / the TRL settings RLCR used: advantages r - mean(group) without std
scaling (std scaling amplifies noise in near-uniform groups), no KL, one PPO epoch (so the ratio
is 1 and the clip never fires), token-level aggregation over the batch.
"""

import dataclasses
import numbers
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from core.errors import ConfigError
from core.nn import sampler, transformer

AGGREGATIONS = ("token", "sequence", "fixed")


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """Rollout and loss settings; frozen and hashable (static under jit).

    aggregation: how per-token losses become one number.
      "token":    sum over every kept token of the batch / their count (TRL "bnpo", DAPO);
      "sequence": mean over tokens within each sequence, then over sequences (the original
                  GRPO; short completions weigh more per token);
      "fixed":    sum over kept tokens / (kept sequences * max_new_tokens) (Dr. GRPO; no
                  length bias from the normaliser).
    drop_zero_variance: groups whose rewards are all equal carry no signal (their advantages
      are 0); dropping them also removes their tokens from the normaliser.
    mask_truncated: completions that never emitted eos get no loss.
    kl_beta > 0 adds beta * KL(policy || reference) per token (the k3 estimator), the
      reference params read from `state.extra["reference"]`.
    """

    group_size: int
    max_new_tokens: int
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    eos_id: int | None = None
    pad_id: int = 0
    scale_std: bool = False
    clip_low: float = 0.2
    clip_high: float = 0.2
    aggregation: str = "token"
    kl_beta: float = 0.0
    drop_zero_variance: bool = True
    mask_truncated: bool = False
    ppo_epochs: int = 1

    def __post_init__(self):
        for name in ("group_size", "max_new_tokens", "ppo_epochs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ConfigError(f"grpo.{name} must be a positive int, got {value!r}")
        if self.group_size < 2:
            raise ConfigError(f"grpo.group_size={self.group_size}: a group needs >= 2 samples")
        if self.aggregation not in AGGREGATIONS:
            raise ConfigError(
                f"grpo.aggregation={self.aggregation!r} is unknown; expected one of: "
                + ", ".join(AGGREGATIONS)
            )
        if not self.temperature > 0:
            raise ConfigError(f"grpo.temperature must be > 0 for sampling, got {self.temperature}")
        if self.mask_truncated and self.eos_id is None:
            raise ConfigError("grpo.mask_truncated needs eos_id: without it no row ever ends")
        for name in ("clip_low", "clip_high", "kl_beta"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"grpo.{name} must be >= 0, got {getattr(self, name)!r}")


def repeat_groups(tree, group_size: int):
    """Every leaf repeated `group_size` times along axis 0; a prompt's rows are contiguous."""
    return jax.tree.map(lambda x: jnp.repeat(x, group_size, axis=0), tree)


def rollout(cfg, params, prompt_BP, prompt_mask_BP, *, rng, gcfg: GRPOConfig):
    """G samples per prompt: (prompt_RP, prompt_mask_RP, sampler.SampleOutput over R = B*G)."""
    prompt_RP, prompt_mask_RP = repeat_groups((prompt_BP, prompt_mask_BP), gcfg.group_size)
    out = sampler.sample(
        cfg,
        params,
        prompt_RP,
        rng=rng,
        max_new_tokens=gcfg.max_new_tokens,
        prompt_mask_BP=prompt_mask_RP,
        temperature=gcfg.temperature,
        top_k=gcfg.top_k,
        top_p=gcfg.top_p,
        eos_id=gcfg.eos_id,
        pad_id=gcfg.pad_id,
    )
    return prompt_RP, prompt_mask_RP, out


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


def token_logprobs(cfg, params, prompt_RP, prompt_mask_RP, tokens_RN, mask_RN, *, temperature):
    """log softmax(logits / temperature) of each generated token, teacher-forced: [R, N].

    The same tempered distribution the sampler drew from, so at the sampling params the
    ratio to the sampler's log-probs is 1. Entries where mask_RN is False are garbage.
    """
    P = prompt_RP.shape[1]
    seq_RT = jnp.concatenate([prompt_RP, tokens_RN], axis=1)
    key_mask_RT = jnp.concatenate([prompt_mask_RP.astype(bool), mask_RN.astype(bool)], axis=1)
    positions_RT = jnp.maximum(jnp.cumsum(key_mask_RT, axis=1, dtype=jnp.int32) - 1, 0)
    logits_RTV, _ = transformer.apply(
        cfg,
        params,
        seq_RT[:, :-1],
        positions_BT=positions_RT[:, :-1],
        key_mask_BT=key_mask_RT[:, :-1],
    )
    # Position P-1+i (the last prompt token, then each generated one) predicts tokens_RN[:, i].
    logp_RNV = jax.nn.log_softmax(logits_RTV[:, P - 1 :] / temperature, axis=-1)
    return jnp.take_along_axis(logp_RNV, tokens_RN[..., None], axis=-1)[..., 0]


def aggregate(per_token_RN, weight_RN, aggregation: str, max_new_tokens: int):
    """One number from per-token values; weight_RN is 1 on tokens that count, 0 elsewhere."""
    if aggregation == "token":
        return (per_token_RN * weight_RN).sum() / jnp.maximum(weight_RN.sum(), 1.0)
    per_seq_R = (per_token_RN * weight_RN).sum(axis=1)
    kept_R = (weight_RN.sum(axis=1) > 0).astype(jnp.float32)
    if aggregation == "sequence":
        per_seq_R = per_seq_R / jnp.maximum(weight_RN.sum(axis=1), 1.0)
        return per_seq_R.sum() / jnp.maximum(kept_R.sum(), 1.0)
    if aggregation == "fixed":
        return per_seq_R.sum() / (jnp.maximum(kept_R.sum(), 1.0) * max_new_tokens)
    raise ConfigError(f"aggregation={aggregation!r} is unknown; expected one of {AGGREGATIONS}")


def policy_loss(logp_RN, old_logp_RN, adv_R, weight_RN, gcfg: GRPOConfig, ref_logp_RN=None):
    """Clipped surrogate -min(ratio A, clip(ratio) A) (+ beta KL), aggregated; (loss, metrics)."""
    ratio_RN = jnp.exp(logp_RN - old_logp_RN)
    adv_R1 = adv_R[:, None]
    clipped_RN = jnp.clip(ratio_RN, 1.0 - gcfg.clip_low, 1.0 + gcfg.clip_high)
    per_token_RN = -jnp.minimum(ratio_RN * adv_R1, clipped_RN * adv_R1)
    weight_RN = weight_RN.astype(jnp.float32)
    stat = lambda x_RN: aggregate(x_RN, weight_RN, "token", gcfg.max_new_tokens)  # noqa: E731
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
    loss = aggregate(per_token_RN, weight_RN, gcfg.aggregation, gcfg.max_new_tokens)
    return loss, metrics


def loss_weights(out: sampler.SampleOutput, informative_R, gcfg: GRPOConfig):
    """1.0 on generated tokens that take part in the loss, 0.0 elsewhere: [R, N]."""
    keep_R = jnp.ones_like(informative_R)
    if gcfg.drop_zero_variance:
        keep_R &= informative_R
    if gcfg.mask_truncated:
        keep_R &= out.done_B
    return (out.mask_BN & keep_R[:, None]).astype(jnp.float32)


class Scored(NamedTuple):
    """A scored rollout, what the update trains on (R = prompts x group rows)."""

    prompt_RP: jax.Array
    prompt_mask_RP: jax.Array
    tokens_RN: jax.Array
    mask_RN: jax.Array
    adv_R: jax.Array
    weight_RN: jax.Array  # 1.0 on the tokens that take part in the loss (`loss_weights`)


def update(cfg, tx, gcfg: GRPOConfig, params, opt_state, scored: Scored, reference=None):
    """`gcfg.ppo_epochs` clipped policy-gradient updates on one scored rollout.

    Returns (params, opt_state, metrics of the last epoch). `reference`: the KL's frozen params
    (needed when gcfg.kl_beta > 0).
    """
    logprobs = lambda p: token_logprobs(  # noqa: E731
        cfg, p, scored.prompt_RP, scored.prompt_mask_RP, scored.tokens_RN, scored.mask_RN,
        temperature=gcfg.temperature,
    )  # fmt: skip
    ref_logp_RN = None
    if gcfg.kl_beta > 0:
        if reference is None:
            raise ConfigError("grpo.kl_beta > 0 needs the reference params")
        ref_logp_RN = jax.lax.stop_gradient(logprobs(reference))
    # One epoch: old = the current policy (ratio 1), no extra forward. More epochs: the policy
    # that sampled, fixed before the first update.
    old_logp_RN = None
    if gcfg.ppo_epochs > 1:
        old_logp_RN = jax.lax.stop_gradient(logprobs(params))

    def loss(p):
        logp_RN = logprobs(p)
        old = jax.lax.stop_gradient(logp_RN) if old_logp_RN is None else old_logp_RN
        return policy_loss(logp_RN, old, scored.adv_R, scored.weight_RN, gcfg, ref_logp_RN)

    def epoch(carry, _):
        p, opt_state = carry
        (value, metrics), grads = jax.value_and_grad(loss, has_aux=True)(p)
        updates, opt_state = tx.update(grads, opt_state, p)
        metrics = {"loss": value, **metrics, "grad_norm": optax.tree.norm(grads)}
        return (optax.apply_updates(p, updates), opt_state), metrics

    (params, opt_state), metrics = jax.lax.scan(epoch, (params, opt_state), length=gcfg.ppo_epochs)
    return params, opt_state, jax.tree.map(lambda x: x[-1], metrics)


def make_step(
    cfg,
    tx: optax.GradientTransformation,
    reward_fn: Callable,
    gcfg: GRPOConfig,
    *,
    prompt_key: str = "prompt",
    prompt_mask_key: str = "prompt_mask",
) -> Callable:
    """A `Method.step` for GRPO: rollout with the current params, reward, advantages, `update`.

    The batch holds the prompts (left-padded) under `prompt_key`/`prompt_mask_key` and whatever
    else `reward_fn` needs per prompt. With gcfg.kl_beta > 0 the reference params are
    `state.extra["reference"]`.
    """

    def step(state, batch, *, rng):
        sample_rng, _ = jax.random.split(rng)
        prompt_RP, prompt_mask_RP, out = rollout(
            cfg,
            jax.lax.stop_gradient(state.params),
            batch[prompt_key],
            batch[prompt_mask_key],
            rng=sample_rng,
            gcfg=gcfg,
        )
        batch_R = repeat_groups(batch, gcfg.group_size)
        rewards_R, reward_metrics = reward_fn(batch_R, out.tokens_BN, out.mask_BN)
        adv_R, informative_R = group_advantages(
            rewards_R, gcfg.group_size, scale_std=gcfg.scale_std
        )
        scored = Scored(
            prompt_RP,
            prompt_mask_RP,
            out.tokens_BN,
            out.mask_BN,
            adv_R,
            loss_weights(out, informative_R, gcfg),
        )
        reference = state.extra.get("reference") if gcfg.kl_beta > 0 else None
        params, opt_state, metrics = update(
            cfg, tx, gcfg, state.params, state.opt_state, scored, reference
        )
        rewards_BG = rewards_R.reshape(-1, gcfg.group_size)
        metrics |= {
            "reward": rewards_R.mean(),
            "reward_std_in_group": rewards_BG.std(axis=1).mean(),
            "informative_groups": informative_R.mean(dtype=jnp.float32),
            "completion_length": out.lengths_B.mean(dtype=jnp.float32),
            "truncated": 1.0 - out.done_B.mean(dtype=jnp.float32),
            "num_tokens": out.lengths_B.sum(dtype=jnp.float32),
            **reward_metrics,
        }
        return state.replace(params=params, opt_state=opt_state), metrics

    return step
