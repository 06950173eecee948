"""KV-cached sampler: cache equals full forward, greedy, top-k/top-p sets, eos, one compile."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core.nn import sampler, transformer

CFG = transformer.TransformerConfig(
    vocab_size=32, num_layers=2, d_model=32, num_heads=4, d_ff=64, max_len=64
)
apply_jit = jax.jit(transformer.apply, static_argnums=0)


@functools.lru_cache
def params_for(seed=0):
    return transformer.init_params(CFG, jax.random.key(seed))


def left_padded_prompts(seed, lengths, width):
    """Random prompts right-aligned in `width` columns; returns tokens, mask, positions."""
    tokens_BP = jax.random.randint(jax.random.key(seed), (len(lengths), width), 1, CFG.vocab_size)
    mask_BP = jnp.arange(width)[None] >= width - jnp.array(lengths)[:, None]
    tokens_BP = jnp.where(mask_BP, tokens_BP, 0)
    return tokens_BP, mask_BP, jnp.maximum(jnp.cumsum(mask_BP, axis=1) - 1, 0)


def full_forward(params, prompt_BP, mask_BP, new_BN):
    """Logits over prompt + generated tokens in one uncached call, as a reference."""
    tokens = jnp.concatenate([prompt_BP, new_BN], axis=1)
    mask = jnp.concatenate([mask_BP, jnp.ones(new_BN.shape, bool)], axis=1)
    positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
    logits, _ = apply_jit(CFG, params, tokens, positions_BT=positions, key_mask_BT=mask)
    return logits


@jax.jit
def _decode_steps(params, cache, tokens_BN, positions_BN):
    """T single-token apply calls inside a lax.scan (static shapes, traced cache index)."""

    def step(cache, tok_pos):
        tok_B, pos_B = tok_pos
        logits, cache = transformer.apply(
            CFG, params, tok_B[:, None], positions_BT=pos_B[:, None], cache=cache
        )
        return cache, logits[:, 0]

    cache, logits_NBV = jax.lax.scan(step, cache, (tokens_BN.T, positions_BN.T))
    return jnp.swapaxes(logits_NBV, 0, 1), cache


def test_cached_decoding_matches_full_forward_with_left_padding():
    params, P, N = params_for(), 7, 5
    prompt_BP, mask_BP, pos_BP = left_padded_prompts(1, [7, 5, 2, 1], P)
    new_BN = jax.random.randint(jax.random.key(2), (4, N), 0, CFG.vocab_size)
    expected = full_forward(params, prompt_BP, mask_BP, new_BN)

    cache = transformer.init_cache(CFG, 4, P + N)
    prefill, cache = apply_jit(
        CFG, params, prompt_BP, positions_BT=pos_BP, key_mask_BT=mask_BP, cache=cache
    )
    assert int(cache.index) == P
    new_pos_BN = mask_BP.sum(1)[:, None] + jnp.arange(N)
    steps, cache = _decode_steps(params, cache, new_BN, new_pos_BN)
    assert int(cache.index) == P + N
    real = np.asarray(mask_BP)
    # float32: same products, summed over S = P + N cache slots instead of T keys.
    np.testing.assert_allclose(
        np.asarray(prefill)[real], np.asarray(expected[:, :P])[real], atol=1e-5
    )
    np.testing.assert_allclose(steps, expected[:, P:], atol=1e-5)


# One jitted sampler with a trace counter, shared by the greedy test and the compile-once test
# (same static args and shapes) so the suite pays for one compile.
TRACES = []


def _counted_sample(policy, params, prompt_BP, **kwargs):
    TRACES.append(1)  # Python side effect: runs when jax traces, not on cached calls
    return sampler.sample(policy, params, prompt_BP, **kwargs)


counted_sample_jit = jax.jit(_counted_sample, static_argnames=sampler.SAMPLE_STATIC_ARGNAMES)
GREEDY_N = 6


def greedy(params, prompt_BP, mask_BP, *, seed, pad_id=0):
    return counted_sample_jit(
        transformer.policy(CFG),
        params,
        prompt_BP,
        rng=jax.random.key(seed),
        max_new_tokens=GREEDY_N,
        prompt_mask_BP=mask_BP,
        temperature=0.0,
        pad_id=pad_id,
    )


def test_greedy_is_deterministic_and_matches_full_forward_argmax():
    params = params_for()
    prompt_BP, mask_BP, _ = left_padded_prompts(3, [5, 3, 1], 5)
    a, b = greedy(params, prompt_BP, mask_BP, seed=0), greedy(params, prompt_BP, mask_BP, seed=1)
    np.testing.assert_array_equal(a.tokens_BN, b.tokens_BN)
    logits = full_forward(params, prompt_BP, mask_BP, a.tokens_BN)
    np.testing.assert_array_equal(a.tokens_BN, jnp.argmax(logits[:, 4:-1], axis=-1))
    # Greedy log-probs are temperature-1 log-probs of the argmax token.
    expected_lp = jnp.max(jax.nn.log_softmax(logits[:, 4:-1]), axis=-1)
    np.testing.assert_allclose(a.logprobs_BN, expected_lp, atol=1e-5)
    assert a.lengths_B.tolist() == [GREEDY_N] * 3 and not a.done_B.any()


def test_sampler_compiles_once_for_repeated_calls():
    params = params_for()
    prompt_BP, mask_BP, _ = left_padded_prompts(8, [5, 2, 4], 5)
    for seed in range(3):  # new prompt values, rng, pad_id and params: no retrace
        params = jax.tree.map(lambda x: x * 1.01, params)
        jax.block_until_ready(greedy(params, prompt_BP + seed, mask_BP, seed=seed, pad_id=seed))
    assert len(TRACES) == 1 and counted_sample_jit._cache_size() == 1


@pytest.mark.parametrize(
    "top_k, top_p, temperature",
    [(3, 1.0, 1.0), (0, 0.6, 0.7)],  # both at once: see test_filter_logits_exact_kept_sets
)
def test_sampled_tokens_stay_in_filtered_set(top_k, top_p, temperature):
    params, B, N = params_for(), 256, 4
    prompt_BP, mask_BP, _ = left_padded_prompts(4, [4, 2, 3, 1] * (B // 4), 4)
    out = sampler.sample_jit(
        CFG,
        params,
        prompt_BP,
        rng=jax.random.key(5),
        max_new_tokens=N,
        prompt_mask_BP=mask_BP,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
    )
    logits_BNV = full_forward(params, prompt_BP, mask_BP, out.tokens_BN)[:, 3:-1] / temperature
    kept_BNV = np.isfinite(sampler.filter_logits(logits_BNV, top_k=top_k, top_p=top_p))
    chosen = np.take_along_axis(kept_BNV, np.asarray(out.tokens_BN)[..., None], -1)
    assert chosen.all(), f"{(~chosen).sum()} sampled tokens outside the kept set"
    assert len(np.unique(out.tokens_BN[:, 0])) > 1  # really sampling, not greedy
    # log-probs are of the tempered, unfiltered distribution.
    expected_lp = np.take_along_axis(
        jax.nn.log_softmax(logits_BNV), np.asarray(out.tokens_BN)[..., None], -1
    )[..., 0]
    np.testing.assert_allclose(out.logprobs_BN, expected_lp, atol=1e-4)


def test_filter_logits_exact_kept_sets():
    logits = jnp.log(jnp.array([[0.1, 0.4, 0.2, 0.3], [0.25, 0.25, 0.25, 0.25]]))

    def kept(**kw):
        return np.isfinite(sampler.filter_logits(logits, **kw)).astype(int).tolist()

    assert kept() == [[1, 1, 1, 1]] * 2
    assert kept(top_k=2) == [[0, 1, 0, 1], [1, 1, 0, 0]]  # ties: lower token id first
    assert kept(top_k=1) == [[0, 1, 0, 0], [1, 0, 0, 0]]
    assert kept(top_k=4) == kept(top_k=0) == [[1, 1, 1, 1]] * 2
    assert kept(top_p=0.5) == [[0, 1, 0, 1], [1, 1, 0, 0]]  # 0.4 < 0.5 <= 0.4 + 0.3
    assert kept(top_p=0.4) == [[0, 1, 0, 0], [1, 1, 0, 0]]  # 0.25 < 0.4
    assert kept(top_p=0.01) == [[0, 1, 0, 0], [1, 0, 0, 0]]  # always the top token
    assert kept(top_p=0.85) == [[0, 1, 1, 1], [1, 1, 1, 1]]
    # top-k, then top-p on the renormalised remainder: {0.4, 0.3} -> {4/7, 3/7}, {0.5, 0.5}
    assert kept(top_p=0.45) == [[0, 1, 0, 1], [1, 1, 0, 0]]
    assert kept(top_k=2, top_p=0.45) == [[0, 1, 0, 0], [1, 0, 0, 0]]
    out = sampler.filter_logits(logits, top_k=2)
    np.testing.assert_array_equal(out[0, jnp.array([1, 3])], logits[0, jnp.array([1, 3])])
    with pytest.raises(ValueError, match="top_p"):
        sampler.filter_logits(logits, top_p=0.0)


EOS, PAD, EOS_B, EOS_N = 5, 31, 64, 24


def sample_with_eos(params, prompt_BP, mask_BP):
    return sampler.sample_jit(
        CFG,
        params,
        prompt_BP,
        rng=jax.random.key(7),
        max_new_tokens=EOS_N,
        prompt_mask_BP=mask_BP,
        temperature=1.5,
        eos_id=EOS,
        pad_id=PAD,
    )


def test_eos_rows_emit_only_pad_after_eos_and_lengths_are_right():
    prompt_BP, mask_BP, _ = left_padded_prompts(6, [3, 1] * (EOS_B // 2), 3)
    out = sample_with_eos(params_for(), prompt_BP, mask_BP)
    out = jax.tree.map(np.asarray, out)  # index on host: eager jax indexing is slow
    tokens, hit = out.tokens_BN, out.tokens_BN == EOS
    assert hit.any(axis=1).sum() >= 8  # enough rows finish for the test to mean something
    for b in range(EOS_B):
        if hit[b].any():
            first = int(np.argmax(hit[b]))
            assert out.done_B[b] and out.lengths_B[b] == first + 1
            assert (tokens[b, first + 1 :] == PAD).all()
        else:
            assert not out.done_B[b] and out.lengths_B[b] == EOS_N
        n = int(out.lengths_B[b])
        assert out.mask_BN[b, :n].all() and not out.mask_BN[b, n:].any()
        assert (out.logprobs_BN[b, n:] == 0).all() and (out.logprobs_BN[b, :n] < 0).all()
    np.testing.assert_array_equal(out.lengths_B, out.mask_BN.sum(1))


def test_all_rows_done_at_first_token():
    """A model that always says eos: every row stops after one token, the rest is padding."""
    params = jax.tree.map(lambda x: x, params_for())  # fresh dicts, same arrays
    D = CFG.d_model
    # Every token embeds to ones, blocks add nothing, so the final features are all ones and
    # the output projection puts logit 10 * D on eos and 0 elsewhere.
    params["embed"]["embedding"] = jnp.ones((CFG.vocab_size, D))
    for block in params["blocks"].values():
        block["attn"]["o"]["kernel"] = jnp.zeros((D, D))
        block["mlp"]["down"]["kernel"] = jnp.zeros((CFG.d_ff, D))
    params["lm_head"]["kernel"] = jnp.zeros((D, CFG.vocab_size)).at[:, EOS].set(10.0)
    prompt_BP, mask_BP, _ = left_padded_prompts(9, [3, 1] * (EOS_B // 2), 3)
    out = sample_with_eos(params, prompt_BP, mask_BP)
    assert out.done_B.all() and (out.lengths_B == 1).all()
    assert (out.tokens_BN[:, 0] == EOS).all() and (out.tokens_BN[:, 1:] == PAD).all()
    assert not out.mask_BN[:, 1:].any() and (out.logprobs_BN[:, 1:] == 0).all()


def test_left_pad_right_aligns_rows_and_masks_the_padding():
    tokens, mask = sampler.left_pad([[5, 6, 7], [8]], round_to=4, pad_id=9)
    np.testing.assert_array_equal(tokens, [[9, 5, 6, 7], [9, 9, 9, 8]])
    np.testing.assert_array_equal(mask, [[0, 1, 1, 1], [0, 0, 0, 1]])
    assert sampler.left_pad([[1] * 5], round_to=4)[0].shape == (1, 8)
    assert sampler.left_pad([[1, 2]], width=3)[0].tolist() == [[0, 1, 2]]
    with pytest.raises(ValueError, match="into 2"):
        sampler.left_pad([[1, 2, 3]], width=2)
