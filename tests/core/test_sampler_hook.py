"""The sampler's next-input hook: a rule written here that reproduces the built-in choice gives
the built-in path's tokens bit for bit; feeding embeddings through the cache gives the token
path's logits; `peek` sees the same cache and position as the real next input; the rule state
comes back."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from core.nn import sampler, transformer

CFG = transformer.TransformerConfig(
    vocab_size=16, num_layers=1, d_model=16, num_heads=2, d_ff=32, max_len=32
)
N = 8
SETTINGS = dict(temperature=0.8, top_k=5, top_p=0.9)
EOS = 3


@functools.lru_cache
def params_for(seed=0):
    return transformer.init_params(CFG, jax.random.key(seed))


def prompts():
    lengths = jnp.array([5, 3, 1, 4])
    tokens_BP = jax.random.randint(jax.random.key(1), (4, 5), 1, CFG.vocab_size)
    mask_BP = jnp.arange(5)[None] >= 5 - lengths[:, None]
    return jnp.where(mask_BP, tokens_BP, 0), mask_BP


def _default_choice(logits_BV, key):
    """The documented built-in choice, written out: temperature, then top-k / top-p filtering,
    one categorical draw with the step's key; log-probs tempered and unfiltered."""
    logits_BV = logits_BV.astype(jnp.float32) / SETTINGS["temperature"]
    filtered_BV = sampler.filter_logits(logits_BV, top_k=SETTINGS["top_k"], top_p=SETTINGS["top_p"])
    tokens_B = jax.random.categorical(key, filtered_BV, axis=-1).astype(jnp.int32)
    logprobs_B = jnp.take_along_axis(jax.nn.log_softmax(logits_BV), tokens_B[:, None], -1)[:, 0]
    return tokens_B, logprobs_B


def _rule(feed_embeddings: bool):
    """The default choice as a rule; with feed_embeddings it feeds embed(token) instead of the
    token and records, in its state, peek(embed(token)): the logits the next step will see."""

    def init(batch_size, max_new_tokens):
        return jnp.zeros((batch_size, max_new_tokens, CFG.vocab_size), jnp.float32)

    def step(logits_BV, peeked_BNV, ctx):
        tokens_B, logprobs_B = _default_choice(logits_BV, ctx.key)
        if not feed_embeddings:
            return sampler.NextInput(tokens_B, logprobs_B, None, peeked_BNV)
        embeddings_BD = ctx.embed(tokens_B[:, None])[:, 0]
        peeked_BNV = peeked_BNV.at[:, ctx.index].set(ctx.peek(embeddings_BD))
        return sampler.NextInput(tokens_B, logprobs_B, embeddings_BD, peeked_BNV)

    return sampler.NextInputRule(init, step)


TOKEN_RULE, EMBEDDING_RULE = _rule(False), _rule(True)


def run(next_input):
    prompt_BP, mask_BP = prompts()
    return sampler.sample_jit(
        CFG, params_for(), prompt_BP, prompt_mask_BP=mask_BP, rng=jax.random.key(7),
        max_new_tokens=N, eos_id=EOS, pad_id=0, next_input=next_input, **SETTINGS,
    )  # fmt: skip


def test_a_rule_reproducing_the_default_gives_identical_outputs():
    default, hooked = run(None), run(TOKEN_RULE)
    for name in ("tokens_BN", "logprobs_BN", "mask_BN", "done_B", "lengths_B"):
        np.testing.assert_array_equal(getattr(hooked, name), getattr(default, name), err_msg=name)
    assert default.rule_state is None
    # Not vacuous: the rows differ, and some stop at eos (pad after it) while others do not.
    assert len({tuple(r) for r in np.asarray(default.tokens_BN)}) > 1
    assert default.done_B.any() and not default.done_B.all()


def test_feeding_embeddings_through_the_cache_matches_feeding_tokens_and_peek():
    default, fed = run(None), run(EMBEDDING_RULE)
    # embed(token) fed as an embedding is the token's own input: the same draws, and logits
    # equal up to float32 reassociation inside XLA's fused kernels (~1e-6 on these logits).
    np.testing.assert_array_equal(fed.tokens_BN, default.tokens_BN)
    np.testing.assert_allclose(fed.logprobs_BN, default.logprobs_BN, atol=1e-5)
    # peek at step n (from the cache holding the prompt and inputs < n, at token n's position)
    # is what the full uncached forward gives after token n.
    prompt_BP, mask_BP = prompts()
    tokens_BT = jnp.concatenate([prompt_BP, fed.tokens_BN], axis=1)
    key_mask_BT = jnp.concatenate([mask_BP, jnp.ones_like(fed.mask_BN)], axis=1)
    positions_BT = jnp.maximum(jnp.cumsum(key_mask_BT, axis=1) - 1, 0)
    full_BTV, _ = transformer.apply(
        CFG, params_for(), tokens_BT, positions_BT=positions_BT, key_mask_BT=key_mask_BT
    )
    P = prompt_BP.shape[1]
    live_BN = np.asarray(fed.mask_BN)
    peeked_BNV, expected_BNV = np.asarray(fed.rule_state), np.asarray(full_BTV[:, P:])
    # cached vs uncached attention: the same sums in another order (~1e-6).
    np.testing.assert_allclose(peeked_BNV[live_BN], expected_BNV[live_BN], atol=1e-5)
    assert np.abs(expected_BNV[live_BN]).max() > 0.1  # the logits are not all near 0
