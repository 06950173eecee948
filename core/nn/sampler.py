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

A next-input rule (`next_input=NextInputRule(init, step)`) replaces the built-in choice: each
step it gets the step's logits, its own state (carried through the `lax.while_loop`) and a
`StepContext` (the step's key, the new token's index, the live rows, the policy's `embed` under
these params, and `peek`: the logits a given input would produce next, from the current cache),
and returns the token to record, its log-prob, optionally the embedding to feed next instead of
that token (e.g. a soft token), and its new state. Done rows, eos and pad are handled here, as
without a rule; the rule's final state comes back in `SampleOutput.rule_state`. Without a rule
the built-in one (`token_rule`) does exactly what this sampler always did.
"""

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from core.nn.policy import Policy, as_policy


class SampleOutput(NamedTuple):
    tokens_BN: jax.Array  # int32 new tokens; pad_id after a row's eos and after an early stop
    logprobs_BN: jax.Array  # float32, see module docstring; 0 where mask_BN is False
    mask_BN: jax.Array  # bool, True on generated tokens up to and including eos
    done_B: jax.Array  # bool, the row emitted eos
    lengths_B: jax.Array  # int32, tokens generated including eos (= mask_BN.sum(1))
    rule_state: Any = None  # the next-input rule's final state (None for the built-in rule)


class StepContext(NamedTuple):
    """What a next-input rule gets besides the logits and its state, for new token `index`."""

    key: jax.Array  # fold_in(rng, index): distinct per step; split or fold_in per row as needed
    index: jax.Array  # int32 scalar: the column of tokens_BN being chosen
    live_B: jax.Array  # bool: rows that have not emitted eos (the others' choices are dropped)
    embed: Callable | None  # embed(tokens_BT) -> embeddings_BTD: policy.embed under params
    # peek(embeddings_BD) -> logits_BV: the next-token logits if embeddings_BD were fed next,
    # from the same cache as the real next input (not advanced); for probes. None without embed.
    peek: Callable | None


class NextInput(NamedTuple):
    tokens_B: jax.Array  # int32: recorded in tokens_BN (and checked against eos)
    logprobs_B: jax.Array  # float32: recorded in logprobs_BN
    # Fed next instead of tokens_B (e.g. a soft token); None: feed tokens_B. A rule returns an
    # array at every step or None at every step (the loop carry has one structure).
    embeddings_BD: jax.Array | None = None
    state: Any = None  # the rule's new state


class NextInputRule(NamedTuple):
    """init(batch_size, max_new_tokens) -> state; step(logits_BV, state, ctx) -> NextInput.
    A static argument under jit: build it once per setting, or inside the jitted function."""

    init: Callable
    step: Callable


def left_pad(rows, *, width: int | None = None, round_to: int = 1, pad_id: int = 0):
    """(tokens_BP int32, mask_BP bool) numpy: each row of token ids right-aligned, the mask
    False on the padding. P is `width`, else the longest row rounded up to a multiple of
    `round_to` (fewer distinct shapes: fewer compiled programs)."""
    longest = max(map(len, rows))
    P = width if width is not None else -(-longest // round_to) * round_to
    if longest > P or min(map(len, rows)) < 1:
        raise ValueError(f"left_pad: rows of {min(map(len, rows))}-{longest} tokens into {P}")
    tokens_BP = np.full((len(rows), P), pad_id, np.int32)
    mask_BP = np.zeros((len(rows), P), bool)
    for b, ids in enumerate(rows):
        tokens_BP[b, P - len(ids) :] = ids
        mask_BP[b, P - len(ids) :] = True
    return tokens_BP, mask_BP


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


def choose_tokens(logits_BV, key, *, temperature, top_k, top_p):
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


def token_rule(*, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> NextInputRule:
    """The built-in rule: `choose_tokens` with the step's key; tokens fed as tokens; no state."""
    choose = functools.partial(choose_tokens, temperature=temperature, top_k=top_k, top_p=top_p)

    def step(logits_BV, state, ctx: StepContext) -> NextInput:
        return NextInput(*choose(logits_BV, ctx.key), None, state)

    return NextInputRule(init=lambda batch_size, max_new_tokens: None, step=step)


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
    next_input: NextInputRule | None = None,
) -> SampleOutput:
    """Generates up to `max_new_tokens` tokens per row after a left-padded prompt.

    temperature == 0 is greedy. Static under jit: policy, max_new_tokens, temperature, top_k,
    top_p, eos_id, next_input (see `sample_jit`). The cache holds P + max_new_tokens - 1 slots
    (P + max_new_tokens with a rule: its `peek` at the last token feeds one input more).
    next_input: a `NextInputRule` that chooses each token (and what is fed next) in place of
    temperature / top_k / top_p, which are then unused.
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
    rule = next_input or token_rule(temperature=temperature, top_k=top_k, top_p=top_p)
    embed = None if policy.embed is None else functools.partial(policy.embed, params)

    def feed_one(x_B, pos_B, cache):
        """Logits [B, V] after feeding x_B (token ids [B] or embeddings [B, D]) at pos_B."""
        inputs = {"embeddings_BTD": x_B[:, None]} if x_B.ndim == 2 else {"tokens_BT": x_B[:, None]}
        logits_B1V, cache = policy.apply(params, **inputs, positions_BT=pos_B[:, None], cache=cache)
        return logits_B1V[:, 0], cache

    def choose(logits_BV, rule_state, i, live_B, pos_B, cache) -> NextInput:
        """The rule's choice for new token i; its input would be fed at pos_B after `cache`."""
        peek = None if embed is None else lambda e_BD: feed_one(e_BD, pos_B, cache)[0]
        ctx = StepContext(jax.random.fold_in(rng, i), i, live_B, embed, peek)
        return rule.step(logits_BV, rule_state, ctx)

    # The last token is never fed; a rule may still peek past it: one slot more.
    cache = policy.init_cache(B, P + N - (next_input is None))
    logits_BPV, cache = policy.apply(
        params,
        prompt_BP,
        positions_BT=positions_BP,
        key_mask_BT=prompt_mask_BP,
        cache=cache,
    )
    next_pos_B = prompt_mask_BP.sum(axis=1, dtype=jnp.int32)
    live_B = jnp.ones((B,), bool)
    first = choose(logits_BPV[:, -1], rule.init(B, N), jnp.int32(0), live_B, next_pos_B, cache)
    tok_B, lp_B = first.tokens_B, first.logprobs_B
    done_B = jnp.zeros((B,), bool) if eos_id is None else tok_B == eos_id
    tokens_BN = jnp.full((B, N), pad_id, jnp.int32).at[:, 0].set(tok_B)
    logprobs_BN = jnp.zeros((B, N), jnp.float32).at[:, 0].set(lp_B)
    mask_BN = jnp.zeros((B, N), bool).at[:, 0].set(True)
    feeds_embeddings = first.embeddings_BD is not None
    feed = first.embeddings_BD if feeds_embeddings else tok_B  # what the next step feeds

    def cond(carry):
        i, _, _, _, done_B, *_ = carry
        return (i < N) & ~jnp.all(done_B)

    def body(carry):
        i, cache, feed, pos_B, done_B, tokens_BN, logprobs_BN, mask_BN, rule_state = carry
        logits_BV, cache = feed_one(feed, pos_B, cache)
        live_B = ~done_B
        out = choose(logits_BV, rule_state, i, live_B, pos_B + 1, cache)
        if (out.embeddings_BD is not None) != feeds_embeddings:
            raise ValueError("a next-input rule must return embeddings_BD at every step or at none")
        new_B = jnp.where(live_B, out.tokens_B, pad_id)
        tokens_BN = tokens_BN.at[:, i].set(new_B)
        logprobs_BN = logprobs_BN.at[:, i].set(jnp.where(live_B, out.logprobs_B, 0.0))
        mask_BN = mask_BN.at[:, i].set(live_B)
        if eos_id is not None:
            done_B = done_B | (live_B & (new_B == eos_id))
        feed = out.embeddings_BD if feeds_embeddings else new_B
        carry = (i + 1, cache, feed, pos_B + 1, done_B, tokens_BN, logprobs_BN, mask_BN)
        return (*carry, out.state)

    carry = (jnp.int32(1), cache, feed, next_pos_B, done_B, tokens_BN, logprobs_BN, mask_BN)
    carry = lax.while_loop(cond, body, (*carry, first.state))
    *_, done_B, tokens_BN, logprobs_BN, mask_BN, rule_state = carry
    lengths_B = mask_BN.sum(axis=1, dtype=jnp.int32)
    return SampleOutput(tokens_BN, logprobs_BN, mask_BN, done_B, lengths_B, rule_state)


SAMPLE_STATIC_ARGNAMES = (
    "policy",
    "max_new_tokens",
    "temperature",
    "top_k",
    "top_p",
    "eos_id",
    "next_input",
)
# Compiles once per (policy, static args, shapes); params, prompts, masks, rng, pad_id are traced.
sample_jit = jax.jit(sample, static_argnames=SAMPLE_STATIC_ARGNAMES)
