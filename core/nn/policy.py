"""A sequence policy as a NamedTuple of pure functions: what `core.nn.sampler` and `core.grpo`
need from a model, so any model (the transformer, a bigram table, a model with image tokens or
soft-token inputs) can be sampled from and trained with GRPO.

    pol = transformer.policy(cfg)                 # the core LM's
    pol = Policy(apply=my_apply, init_cache=my_init_cache)   # anything else
    out = sampler.sample(pol, params, prompt_BP, rng=key, max_new_tokens=8)

Fields (params is whatever pytree the policy's owner trains):
  apply(params, tokens_BT, *, positions_BT=None, key_mask_BT=None, cache=None)
      -> (logits_BTV float32, new cache; None without one)
    Next-token logits at every one of the T new positions. With a cache the T tokens continue
    the sequence it holds (prefill: the left-padded prompt, key_mask_BT False on padding; then
    one token per call). positions_BT: each token's position among its row's real tokens.
    Without a cache (teacher-forced scoring in GRPO) the T tokens are the whole sequence.
  init_cache(batch_size, max_len) -> cache
    The decoding state for `max_len` tokens: any pytree of arrays (a `lax.while_loop` carry).
  embed(params, tokens_BT) -> embeddings_BTD, optional
    For policies that also take embeddings (`apply(..., embeddings_BTD=...)` instead of
    tokens, e.g. soft-token decoding); None when the policy has none.

A Policy is a static argument under jit: build it once (e.g. `functools.lru_cache`, as
`transformer.policy` does) so that repeated calls hash equal and compile once.
"""

from collections.abc import Callable
from typing import NamedTuple


class Policy(NamedTuple):
    apply: Callable
    init_cache: Callable
    embed: Callable | None = None


def as_policy(policy) -> Policy:
    """`policy` itself, or for a `core.nn.transformer.TransformerConfig` its
    `transformer.policy(cfg)` (the shorthand the sampler and GRPO accept)."""
    if isinstance(policy, Policy):
        return policy
    from core.nn import transformer  # here: this module stays free of flax

    if isinstance(policy, transformer.TransformerConfig):
        return transformer.policy(policy)
    raise TypeError(
        f"expected a core.nn.policy.Policy or a TransformerConfig, got {type(policy).__name__}"
    )
