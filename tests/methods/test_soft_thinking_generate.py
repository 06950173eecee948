"""Soft-thinking's whole decodes (`decode.generate`): the greedy kind is the core sampler's
greedy, soft at T -> 0 and with max_topk 1 is greedy, the KV-cached soft decode equals an
uncached recomputation and compiles once, Cold Stop forces the delimiter and the answer is
noise-free. The tiny peaked transformer and helpers of test_soft_thinking_decode.py."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from core.nn import sampler, transformer
from methods.soft_thinking import decode
from methods.soft_thinking.decode import Decoder
from tests.methods.test_soft_thinking_decode import (
    CFG,
    EOS,
    THINK_END,
    N,
    generate,
    params_for,
    prompts,
)

# ------------------------------------------------------------------ whole decodes


def test_greedy_kind_is_the_core_samplers_greedy():
    prompt_BP, mask_BP = prompts()
    core = sampler.sample_jit(
        CFG, params_for(), prompt_BP, prompt_mask_BP=mask_BP, rng=jax.random.key(0),
        max_new_tokens=N, temperature=0.0, eos_id=EOS,
    )  # fmt: skip
    greedy = generate(Decoder("greedy"))
    for name in ("tokens_BN", "mask_BN", "done_B"):
        np.testing.assert_array_equal(getattr(greedy, name), getattr(core, name), err_msg=name)
    # Temperature-1 log-probs, as the core's greedy; float32 rounding in another fusion.
    np.testing.assert_allclose(greedy.logprobs_BN, core.logprobs_BN, atol=1e-5)
    think_end = [int(np.argmax(r == THINK_END)) if THINK_END in r else -1 for r in
                 np.where(greedy.mask_BN, greedy.tokens_BN, -1)]  # fmt: skip
    assert greedy.think_end_B.tolist() == think_end
    assert -1 in think_end and max(think_end) > 0 and greedy.done_B.any()  # not vacuous


def test_soft_at_t0_is_greedy_with_a_zero_top1_probe():
    greedy, soft = (
        generate(Decoder("greedy")),
        generate(Decoder("soft", temperature=0.0), probe=True),
    )
    for name in ("tokens_BN", "mask_BN", "done_B", "think_end_B"):
        np.testing.assert_array_equal(getattr(soft, name), getattr(greedy, name), err_msg=name)
    # Thinking rows feed soft inputs up to (not at) the delimiter or their end.
    thinking_BN = np.arange(N)[None] < np.where(soft.think_end_B < 0, N, soft.think_end_B)[:, None]
    np.testing.assert_array_equal(soft.soft_BN, thinking_BN & np.asarray(soft.mask_BN))
    # At T = 0 the concept token is its top-1's embedding: P_soft = P_top1 exactly (the same
    # input on the same cache); the top-2 input changes the next distribution.
    on = np.asarray(soft.soft_BN)
    assert on.sum() > 10
    # float32 rounding: the two peeks may fuse differently (~1e-8 of JS measured; ln 2 max).
    np.testing.assert_allclose(np.asarray(soft.js_top1_BN)[on], 0.0, atol=1e-6)
    js2 = np.asarray(soft.js_top2_BN)
    assert (js2[on] > 1e-3).all() and (js2 <= np.log(2)).all() and (js2[~on] == 0).all()


def test_max_topk_1_soft_is_greedy_through_the_delimiter():
    greedy = generate(Decoder("greedy"))
    soft = generate(Decoder("soft", max_topk=1))
    np.testing.assert_array_equal(soft.think_end_B, greedy.think_end_B)
    # Through the delimiter (then both sample: T = 0.6 vs argmax).
    end_B = np.where(greedy.think_end_B < 0, N - 1, greedy.think_end_B)
    for b in range(len(end_B)):
        n = end_B[b] + 1
        np.testing.assert_array_equal(soft.tokens_BN[b, :n], greedy.tokens_BN[b, :n])
        np.testing.assert_array_equal(soft.mask_BN[b, :n], greedy.mask_BN[b, :n])


@functools.partial(jax.jit, static_argnames=("decoder",))
def _uncached_step(params, prompt_BP, mask_BP, fed_BND, state, rng, i, live_B, *, decoder):
    """One step of the rule on logits from a full forward (no cache) over the prompt and the
    inputs fed so far (later slots hold zeros, which the causal mask hides)."""
    P = prompt_BP.shape[1]
    x_BTD = jnp.concatenate([transformer.embed(CFG, params, prompt_BP), fed_BND], axis=1)
    key_mask_BT = jnp.concatenate([mask_BP, jnp.ones(fed_BND.shape[:2], bool)], axis=1)
    positions_BT = jnp.maximum(jnp.cumsum(key_mask_BT, axis=1) - 1, 0)
    logits_BTV, _ = transformer.apply(
        CFG, params, embeddings_BTD=x_BTD, key_mask_BT=key_mask_BT, positions_BT=positions_BT
    )
    logits_BV = jax.lax.dynamic_index_in_dim(logits_BTV, P - 1 + i, axis=1, keepdims=False)
    step_ctx = sampler.StepContext(
        jax.random.fold_in(rng, i), i, live_B, functools.partial(transformer.embed, CFG, params),
        None,
    )  # fmt: skip
    return decode.next_input_rule(decoder, THINK_END).step(logits_BV, state, step_ctx)


def test_cached_soft_decode_equals_an_uncached_recomputation_and_compiles_once():
    decoder = Decoder("gumbel")

    def own_generate(policy, params, prompt_BP, **kwargs):
        return decode.generate(policy, params, prompt_BP, **kwargs)

    # A function of its own: jit wrappers of one function share its compile cache.
    counted = jax.jit(own_generate, static_argnames=decode.GENERATE_STATIC_ARGNAMES)
    cached = generate(decoder, rng=5, jit=counted)
    prompt_BP, mask_BP = prompts()
    B = prompt_BP.shape[0]
    state = decode.next_input_rule(decoder, THINK_END).init(B, N)
    fed_BND = jnp.zeros((B, N, CFG.d_model), jnp.float32)
    done_B = np.zeros(B, bool)
    tokens, logprobs = np.zeros((B, N), int), np.zeros((B, N))
    for i in range(N):
        out = _uncached_step(params_for(), prompt_BP, mask_BP, fed_BND, state,
                             jax.random.key(5), jnp.int32(i), jnp.asarray(~done_B),
                             decoder=decoder)  # fmt: skip
        state, fed_BND = out.state, fed_BND.at[:, i].set(out.embeddings_BD)
        tokens[:, i], logprobs[:, i] = out.tokens_B, out.logprobs_B
        done_B |= np.asarray(out.tokens_B) == EOS
    mask = np.asarray(cached.mask_BN)
    np.testing.assert_array_equal(np.asarray(cached.tokens_BN)[mask], tokens[mask])
    # cached vs uncached attention: the same sums in another order (~1e-6).
    np.testing.assert_allclose(np.asarray(cached.logprobs_BN)[mask], logprobs[mask], atol=1e-4)
    np.testing.assert_array_equal(cached.think_end_B, state.think_end_B)
    np.testing.assert_array_equal(cached.soft_BN, np.asarray(state.soft_BN) & mask)
    assert cached.soft_BN.sum() > 10 and (cached.think_end_B >= 0).any()  # not vacuous
    # Another sample (rng) and other param values: new draws, no new compile.
    params = jax.tree.map(lambda x: x * 1.01, params_for())
    other = generate(decoder, rng=6, jit=counted, params=params)
    assert not np.array_equal(other.tokens_BN, cached.tokens_BN)
    assert counted._cache_size() == 1


def test_cold_stop_forces_the_delimiter_and_the_answer_is_noise_free():
    # Every step is "low entropy" below 1.0: the delimiter is forced at step 0, and the rest is
    # discrete sampling: the same tokens whatever the soft kind's noise.
    outs = [
        generate(Decoder(k, cold_stop_steps=1, cold_stop_entropy=1.0)) for k in ("soft", "gumbel")
    ]
    for out in outs:
        assert out.think_end_B.tolist() == [0] * 6 and out.cold_stop_B.all()
        assert (out.tokens_BN[:, 0] == THINK_END).all() and not out.soft_BN.any()
    np.testing.assert_array_equal(outs[0].tokens_BN, outs[1].tokens_BN)
