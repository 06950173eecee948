"""GRPO: group-relative policy optimisation of any `core.nn.policy.Policy`.

    step = grpo.make_step(policy, tx, reward_fn, grpo.GRPOConfig(group_size=16, max_new_tokens=8))

`policy` is a Policy (its apply and init_cache; `core.nn.transformer.policy(cfg)` for the core
LM), or a TransformerConfig as shorthand for that. One step, all inside one jit: sample G
completions per prompt with the cached sampler (`rollout`), score them (`reward_fn`), subtract
each group's mean reward (`group_advantages`), and take `ppo_epochs` clipped policy-gradient
updates on the generated tokens (`policy_loss`), each over `microbatches` slices of the rows.

A method replaces the parts that are not plain sampling (make_step's keyword arguments):
  rollout_fn(policy, params, batch, *, rng, gcfg) -> Rollout
    e.g. multi-turn with a tool (`core.multiturn.grpo_rollout`): the completion holds the
    policy's tokens and the environment's replies; `Rollout.policy_mask_RN` is True only on the
    policy's, so the environment's tokens are read by the model (they are in `mask_RN`) but get
    no loss. A Rollout's `info` (e.g. the environment's final state) reaches reward_fn as
    `info=`.
  logprob_fn(params, scored, *, entropy) -> (logp_RN, entropy_RN or None)
    the trained policy's log-probabilities of the completion tokens (teacher-forced), and
    with entropy=True the per-token entropy of its distribution (default:
    `policy_logprobs`, the policy's apply over prompt + completion).

`reward_fn(batch_R, tokens_RN, mask_RN) -> (rewards_R, metrics)` must be jittable; batch_R is the
prompt batch with every field repeated G times (rows of one prompt are contiguous), tokens_RN the
completions and mask_RN True on generated tokens up to and including eos. R = B * G.

Defaults follow Dr. GRPO / the TRL settings RLCR used: advantages r - mean(group) without std
scaling (std scaling amplifies noise in near-uniform groups), no KL, one PPO epoch (so the ratio
is 1 and the clip never fires), token-level aggregation over the batch, no entropy bonus, one
microbatch.
"""

import dataclasses
import functools
import numbers
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from core.errors import ConfigError
from core.grpo_objective import (  # noqa: F401 (grpo.<name>: the objective's public pieces)
    AGGREGATIONS,
    Scored,
    aggregate,
    denominator,
    group_advantages,
    loss_weights,
    policy_logprobs,
    policy_loss,
    policy_weights,
    token_logprobs,
)
from core.nn import sampler
from core.nn.policy import Policy, as_policy


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
    entropy_coef > 0 subtracts coef * H(policy at the token's position) per token (an
      entropy bonus, aggregated like the surrogate); 0 computes no entropy at all.
    microbatches: each update's gradient is the sum of this many slices of the rows (each
      normalised by the whole batch's token / sequence count, so the sum is the full-batch
      gradient up to float32 summation order); rows (prompts x group) must divide evenly.
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
    entropy_coef: float = 0.0
    microbatches: int = 1

    def __post_init__(self):
        for name in ("group_size", "max_new_tokens", "ppo_epochs", "microbatches"):
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
        for name in ("clip_low", "clip_high", "kl_beta", "entropy_coef"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"grpo.{name} must be >= 0, got {getattr(self, name)!r}")


def repeat_groups(tree, group_size: int):
    """Every leaf repeated `group_size` times along axis 0; a prompt's rows are contiguous."""
    return jax.tree.map(lambda x: jnp.repeat(x, group_size, axis=0), tree)


def rollout(policy: Policy, params, prompt_BP, prompt_mask_BP, *, rng, gcfg: GRPOConfig):
    """G samples per prompt: (prompt_RP, prompt_mask_RP, sampler.SampleOutput over R = B*G)."""
    prompt_RP, prompt_mask_RP = repeat_groups((prompt_BP, prompt_mask_BP), gcfg.group_size)
    out = sampler.sample(
        policy,
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


class Rollout(NamedTuple):
    """What a rollout function returns (R = prompts x group rows, a prompt's rows contiguous).

    The completion may interleave the policy's tokens with an environment's (multi-turn): all
    of them are in mask_RN (the model reads them when scoring), only the policy's are in
    policy_mask_RN (only they get a loss). reward_fn sees tokens_RN and mask_RN.
    """

    prompt_RP: jax.Array  # int32, left-padded prompts
    prompt_mask_RP: jax.Array  # bool
    tokens_RN: jax.Array  # int32 completion tokens, pad after the end
    mask_RN: jax.Array  # bool, True on every completion token (policy's and environment's)
    policy_mask_RN: jax.Array  # bool, True on the tokens the policy sampled
    done_R: jax.Array  # bool, the row ended (eos) rather than running out of tokens
    # What the reward needs beyond the tokens (e.g. a multi-turn environment's final state,
    # `core.multiturn`): reward_fn gets it as `info=` when it is not None.
    info: Any = None


def sample_rollout(
    policy,
    params,
    batch,
    *,
    rng,
    gcfg: GRPOConfig,
    prompt_key="prompt",
    prompt_mask_key="prompt_mask",
) -> Rollout:
    """The default rollout: `rollout` (the cached sampler) on the batch's prompts."""
    prompt_RP, prompt_mask_RP, out = rollout(
        policy, params, batch[prompt_key], batch[prompt_mask_key], rng=rng, gcfg=gcfg
    )
    return Rollout(prompt_RP, prompt_mask_RP, out.tokens_BN, out.mask_BN, out.mask_BN, out.done_B)


def update(
    policy,
    tx,
    gcfg: GRPOConfig,
    params,
    opt_state,
    scored: Scored,
    reference=None,
    *,
    logprob_fn: Callable | None = None,
):
    """`gcfg.ppo_epochs` clipped policy-gradient updates on one scored rollout, each from the
    gradient summed over `gcfg.microbatches` slices of the rows.

    Returns (params, opt_state, metrics of the last epoch). `reference`: the KL's frozen params
    (needed when gcfg.kl_beta > 0). logprob_fn: see the module docstring (default
    `policy_logprobs` of `policy`).
    """
    if logprob_fn is None:
        logprob_fn = functools.partial(
            policy_logprobs, as_policy(policy), temperature=gcfg.temperature
        )
    M = gcfg.microbatches
    R = scored.tokens_RN.shape[0]
    if R % M:
        raise ConfigError(f"grpo.microbatches={M} does not divide the {R} rows (prompts x group)")
    logprobs = lambda p, s: logprob_fn(p, s, entropy=False)[0]  # noqa: E731
    ref_logp_RN = None
    if gcfg.kl_beta > 0:
        if reference is None:
            raise ConfigError("grpo.kl_beta > 0 needs the reference params")
        ref_logp_RN = jax.lax.stop_gradient(_by_microbatch(logprobs, reference, scored, M))
    # One epoch: old = the current policy (ratio 1), no extra forward. More epochs: the policy
    # that sampled, fixed before the first update.
    old_logp_RN = None
    if gcfg.ppo_epochs > 1:
        old_logp_RN = jax.lax.stop_gradient(_by_microbatch(logprobs, params, scored, M))
    # Whole-batch normalisers: microbatch losses and metrics then add up to the batch's.
    denoms = None
    if M > 1:
        denoms = tuple(
            denominator(scored.weight_RN, kind, gcfg.max_new_tokens)
            for kind in (gcfg.aggregation, "token")
        )

    def loss(p, part: Scored, old_RN, ref_RN):
        logp_RN, entropy_RN = logprob_fn(p, part, entropy=gcfg.entropy_coef > 0)
        if gcfg.entropy_coef > 0 and entropy_RN is None:
            raise ConfigError("grpo.entropy_coef > 0 but logprob_fn returned no entropy")
        old_RN = jax.lax.stop_gradient(logp_RN) if old_RN is None else old_RN
        return policy_loss(
            logp_RN,
            old_RN,
            part.adv_R,
            part.weight_RN,
            gcfg,
            ref_RN,
            entropy_RN=entropy_RN,
            denoms=denoms,
        )

    grad_fn = jax.value_and_grad(loss, has_aux=True)

    def summed_grad(p):
        """((loss, metrics), grads), summed over the microbatches."""
        if M == 1:
            return grad_fn(p, scored, old_logp_RN, ref_logp_RN)
        parts = _split((scored, old_logp_RN, ref_logp_RN), M)

        def add(total, part):
            return jax.tree.map(jnp.add, total, grad_fn(p, *part)), None

        zeros = jax.tree.map(
            lambda x: jnp.zeros(x.shape, x.dtype),
            jax.eval_shape(grad_fn, p, *jax.tree.map(lambda x: x[0], parts)),
        )
        return jax.lax.scan(add, zeros, parts)[0]

    def epoch(carry, _):
        p, opt_state = carry
        (value, metrics), grads = summed_grad(p)
        updates, opt_state = tx.update(grads, opt_state, p)
        metrics = {"loss": value, **metrics, "grad_norm": optax.tree.norm(grads)}
        return (optax.apply_updates(p, updates), opt_state), metrics

    (params, opt_state), metrics = jax.lax.scan(epoch, (params, opt_state), length=gcfg.ppo_epochs)
    return params, opt_state, jax.tree.map(lambda x: x[-1], metrics)


def _split(tree, M: int):
    """Every leaf [R, ...] -> [M, R / M, ...] (None leaves stay None)."""
    return jax.tree.map(lambda x: x.reshape(M, x.shape[0] // M, *x.shape[1:]), tree)


def _by_microbatch(fn, params, scored: Scored, M: int):
    """fn(params, part) -> [r, N] over M slices of the rows, concatenated back to [R, N]."""
    if M == 1:
        return fn(params, scored)
    out_MrN = jax.lax.map(lambda part: fn(params, part), _split(scored, M))
    return out_MrN.reshape(-1, *out_MrN.shape[2:])


def make_step(
    policy,
    tx: optax.GradientTransformation,
    reward_fn: Callable,
    gcfg: GRPOConfig,
    *,
    prompt_key: str = "prompt",
    prompt_mask_key: str = "prompt_mask",
    rollout_fn: Callable | None = None,
    logprob_fn: Callable | None = None,
) -> Callable:
    """A `Method.step` for GRPO: rollout with the current params, reward, advantages, `update`.

    The batch holds the prompts (left-padded) under `prompt_key`/`prompt_mask_key` and whatever
    else `reward_fn` needs per prompt. With gcfg.kl_beta > 0 the reference params are
    `state.extra["reference"]`. rollout_fn / logprob_fn: a method's own (module docstring);
    default `sample_rollout` / `policy_logprobs`.
    """
    policy = as_policy(policy)
    if rollout_fn is None:
        rollout_fn = functools.partial(
            sample_rollout, prompt_key=prompt_key, prompt_mask_key=prompt_mask_key
        )

    def step(state, batch, *, rng):
        sample_rng, _ = jax.random.split(rng)
        rolled = rollout_fn(
            policy, jax.lax.stop_gradient(state.params), batch, rng=sample_rng, gcfg=gcfg
        )
        batch_R = repeat_groups(batch, gcfg.group_size)
        info = {} if rolled.info is None else {"info": rolled.info}
        rewards_R, reward_metrics = reward_fn(batch_R, rolled.tokens_RN, rolled.mask_RN, **info)
        adv_R, informative_R = group_advantages(
            rewards_R, gcfg.group_size, scale_std=gcfg.scale_std
        )
        scored = Scored(
            rolled.prompt_RP,
            rolled.prompt_mask_RP,
            rolled.tokens_RN,
            rolled.mask_RN,
            adv_R,
            policy_weights(rolled.policy_mask_RN, rolled.done_R, informative_R, gcfg),
        )
        reference = state.extra.get("reference") if gcfg.kl_beta > 0 else None
        params, opt_state, metrics = update(
            policy,
            tx,
            gcfg,
            state.params,
            state.opt_state,
            scored,
            reference,
            logprob_fn=logprob_fn,
        )
        rewards_BG = rewards_R.reshape(-1, gcfg.group_size)
        lengths_R = rolled.mask_RN.sum(axis=1, dtype=jnp.int32)
        metrics |= {
            "reward": rewards_R.mean(),
            "reward_std_in_group": rewards_BG.std(axis=1).mean(),
            "informative_groups": informative_R.mean(dtype=jnp.float32),
            "completion_length": lengths_R.mean(dtype=jnp.float32),
            "truncated": 1.0 - rolled.done_R.mean(dtype=jnp.float32),
            "num_tokens": rolled.policy_mask_RN.sum(dtype=jnp.float32),
            **reward_metrics,
        }
        return state.replace(params=params, opt_state=opt_state), metrics

    return step


def with_reference_from(first_rl_step: int, rl_step: Callable) -> Callable:
    """`rl_step` whose KL reference (`state.extra["reference"]`) is the policy as RL starts at
    step `first_rl_step` (e.g. after a supervised warm start), not the params it was initialised
    with. The state must hold a "reference" entry from init (a placeholder of the params' shape).
    """

    def step(state, batch, *, rng):
        # cond, not where: a copy only on the first RL step, not a select over every leaf.
        reference = jax.lax.cond(
            state.step == first_rl_step,
            lambda: state.params,
            lambda: state.extra["reference"],
        )
        return rl_step(state.replace(extra={**state.extra, "reference": reference}), batch, rng=rng)

    return step
