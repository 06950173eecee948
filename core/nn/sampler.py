"""Autoregressive sampling with the KV cache, jit-compatible end to end.

    out = sample_jit(policy, params, prompt_BP, rng=key, max_new_tokens=64,
                     prompt_mask_BP=mask_BP, temperature=1.0, top_p=0.9, eos_id=2)

`policy` is a `core.nn.policy.Policy` (any model: its apply and init_cache), or a
`core.nn.transformer.TransformerConfig`, shorthand for `transformer.policy(cfg)`.

Prompts are LEFT-padded (prompt_mask_BP False on padding), so every row's last prompt column is
a real token and one prefill call gives every row's first next-token distribution. Each row
needs at least one real token. Then a `lax.while_loop` feeds one token per step until every
row has emitted eos or max_new_tokens tokens exist.

Log-probabilities: `logprobs_BN` is log_softmax(logits / temperature) at the sampled token,
BEFORE top-k/top-p filtering, i.e. the model's own (tempered) probability, which is what
policy-gradient methods (GRPO) need at temperature 1. With temperature == 0 (greedy) the
logits are not scaled (temperature 1 log-probs of the argmax token).
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from core.nn.policy import Policy, as_policy


class SampleOutput(NamedTuple):
    tokens_BN: jax.Array  # int32 new tokens; pad_id after a row's eos and after an early stop
    logprobs_BN: jax.Array  # float32, see module docstring; 0 where mask_BN is False
    mask_BN: jax.Array  # bool, True on generated tokens up to and including eos
    done_B: jax.Array  # bool, the row emitted eos
    lengths_B: jax.Array  # int32, tokens generated including eos (= mask_BN.sum(1))


def filter_logits(logits_BV, *, top_k: int = 0, top_p: float = 1.0):
    """Logits with -inf outside the kept set; top-k first, then top-p on what remains.

    top_k: keep the k largest (0 = off). top_p: keep the smallest prefix of the remaining
    tokens, in descending probability, whose mass is >= top_p; the top token is always kept.
    Ties are broken by token id (lower id ranks first, stable sort), so exactly top_k tokens
    are kept and the kept set is deterministic.
    """
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = off), got {top_k}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    V = logits_BV.shape[-1]
    use_k, use_p = 0 < top_k < V, top_p < 1.0
    if not (use_k or use_p):
        return logits_BV
    order_BV = jnp.argsort(-logits_BV, axis=-1, stable=True)  # rank r -> token id
    sorted_BV = jnp.take_along_axis(logits_BV, order_BV, axis=-1)
    keep_sorted_BV = jnp.ones(sorted_BV.shape, bool)
    if use_k:
        keep_sorted_BV &= jnp.arange(V) < top_k
    if use_p:
        probs_BV = jax.nn.softmax(
            jnp.where(keep_sorted_BV, sorted_BV.astype(jnp.float32), -jnp.inf), axis=-1
        )
        mass_before_BV = jnp.cumsum(probs_BV, axis=-1) - probs_BV  # exclusive prefix sum
        keep_sorted_BV &= mass_before_BV < top_p
    rank_BV = jnp.argsort(order_BV, axis=-1)  # inverse permutation: token id -> rank
    keep_BV = jnp.take_along_axis(keep_sorted_BV, rank_BV, axis=-1)
    return jnp.where(keep_BV, logits_BV, -jnp.inf)


def _choose(logits_BV, key, *, temperature, top_k, top_p):
    """Sampled tokens [B] and their (tempered, unfiltered) log-probs [B]."""
    logits_BV = logits_BV.astype(jnp.float32)
    if temperature == 0:
        tokens_B = jnp.argmax(logits_BV, axis=-1)
    else:
        logits_BV = logits_BV / temperature
        filtered_BV = filter_logits(logits_BV, top_k=top_k, top_p=top_p)
        tokens_B = jax.random.categorical(key, filtered_BV, axis=-1)
    logprobs_BV = jax.nn.log_softmax(logits_BV, axis=-1)
    logprobs_B = jnp.take_along_axis(logprobs_BV, tokens_B[:, None], axis=-1)[:, 0]
    return tokens_B.astype(jnp.int32), logprobs_B


def sample(
    policy: Policy,
    params,
    prompt_BP: jax.Array,
    *,
    rng: jax.Array,
    max_new_tokens: int,
    prompt_mask_BP: jax.Array | None = None,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_id: int | None = None,
    pad_id: int = 0,
) -> SampleOutput:
    """Generates up to `max_new_tokens` tokens per row after a left-padded prompt.

    temperature == 0 is greedy. Static under jit: policy, max_new_tokens, temperature, top_k,
    top_p, eos_id (see `sample_jit`). The cache holds P + max_new_tokens - 1 slots.
    """
    policy = as_policy(policy)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    B, P = prompt_BP.shape
    N = max_new_tokens
    if prompt_mask_BP is None:
        prompt_mask_BP = jnp.ones((B, P), bool)
    prompt_mask_BP = prompt_mask_BP.astype(bool)
    # Each row's first real token is position 0; padding gets a harmless clipped position.
    positions_BP = jnp.maximum(jnp.cumsum(prompt_mask_BP, axis=1, dtype=jnp.int32) - 1, 0)
    choose = functools.partial(_choose, temperature=temperature, top_k=top_k, top_p=top_p)

    cache = policy.init_cache(B, P + N - 1)
    logits_BPV, cache = policy.apply(
        params,
        prompt_BP,
        positions_BT=positions_BP,
        key_mask_BT=prompt_mask_BP,
        cache=cache,
    )
    tok_B, lp_B = choose(logits_BPV[:, -1], jax.random.fold_in(rng, 0))
    done_B = jnp.zeros((B,), bool) if eos_id is None else tok_B == eos_id
    tokens_BN = jnp.full((B, N), pad_id, jnp.int32).at[:, 0].set(tok_B)
    logprobs_BN = jnp.zeros((B, N), jnp.float32).at[:, 0].set(lp_B)
    mask_BN = jnp.zeros((B, N), bool).at[:, 0].set(True)
    next_pos_B = prompt_mask_BP.sum(axis=1, dtype=jnp.int32)

    def cond(carry):
        i, _, _, _, done_B, *_ = carry
        return (i < N) & ~jnp.all(done_B)

    def body(carry):
        i, cache, tok_B, pos_B, done_B, tokens_BN, logprobs_BN, mask_BN = carry
        logits_B1V, cache = policy.apply(
            params, tok_B[:, None], positions_BT=pos_B[:, None], cache=cache
        )
        new_B, lp_B = choose(logits_B1V[:, 0], jax.random.fold_in(rng, i))
        live_B = ~done_B
        new_B = jnp.where(live_B, new_B, pad_id)
        tokens_BN = tokens_BN.at[:, i].set(new_B)
        logprobs_BN = logprobs_BN.at[:, i].set(jnp.where(live_B, lp_B, 0.0))
        mask_BN = mask_BN.at[:, i].set(live_B)
        if eos_id is not None:
            done_B = done_B | (live_B & (new_B == eos_id))
        return i + 1, cache, new_B, pos_B + 1, done_B, tokens_BN, logprobs_BN, mask_BN

    carry = (jnp.int32(1), cache, tok_B, next_pos_B, done_B, tokens_BN, logprobs_BN, mask_BN)
    *_, done_B, tokens_BN, logprobs_BN, mask_BN = lax.while_loop(cond, body, carry)
    lengths_B = mask_BN.sum(axis=1, dtype=jnp.int32)
    return SampleOutput(tokens_BN, logprobs_BN, mask_BN, done_B, lengths_B)


SAMPLE_STATIC_ARGNAMES = ("policy", "max_new_tokens", "temperature", "top_k", "top_p", "eos_id")
# Compiles once per (policy, static args, shapes); params, prompts, masks, rng, pad_id are traced.
sample_jit = jax.jit(sample, static_argnames=SAMPLE_STATIC_ARGNAMES)
