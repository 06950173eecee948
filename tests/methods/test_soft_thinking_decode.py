"""Soft-thinking decoding: the truncation pipeline against a plain NumPy spec and hand-computed
cases, the Gumbel / Dirichlet noise against their distributions, the delimiter on the post-noise
top-1, Cold Stop, noise off after the delimiter, the JS probe, one-line errors. Tiny random
transformers (logits scaled up so that distributions are peaked and a delimiter gets emitted);
whole decodes in test_soft_thinking_generate.py (with these helpers)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from core.errors import ConfigError
from core.nn import sampler, transformer
from methods.soft_thinking import decode, probes
from methods.soft_thinking.decode import Decoder

CFG = transformer.TransformerConfig(
    vocab_size=16, num_layers=1, d_model=16, num_heads=2, d_ff=32, max_len=32
)
V, N = CFG.vocab_size, 10
THINK_END, EOS = 14, 12  # with these params greedy emits 14 in rows 0, 2, 4, 5 and 12 in 0, 3


@functools.lru_cache
def params_for(seed=0):
    params = transformer.init_params(CFG, jax.random.key(seed))
    # x3 logits: peaked next-token distributions (top-1 mass ~0.4-0.99 at T = 0.6).
    params["lm_head"]["kernel"] = params["lm_head"]["kernel"] * 3
    return params


def prompts():
    lengths = jnp.array([5, 3, 1, 4, 2, 5])
    tokens_BP = jax.random.randint(jax.random.key(1), (6, 5), 1, V)
    mask_BP = jnp.arange(5)[None] >= 5 - lengths[:, None]
    return jnp.where(mask_BP, tokens_BP, 0), mask_BP


def generate(decoder, rng=2, probe=False, jit=decode.generate_jit, params=None):
    prompt_BP, mask_BP = prompts()
    return jit(
        CFG, params_for() if params is None else params, prompt_BP, prompt_mask_BP=mask_BP,
        rng=jax.random.key(rng), decoder=decoder, think_end_id=THINK_END, eos_id=EOS,
        max_new_tokens=N, probe=probe,
    )  # fmt: skip


def embed(tokens_BT):
    return transformer.embed(CFG, params_for(), tokens_BT)


@functools.partial(jax.jit, static_argnames=("decoder", "think_end_id", "thinking"))
def _rule_step(decoder, params, logits_BV, state, seed, index, *, think_end_id, thinking):
    rule = decode.next_input_rule(decoder, think_end_id)
    B = logits_BV.shape[0]
    if state is None:
        state = rule.init(B, 8)._replace(thinking_B=jnp.full((B,), thinking))
    key = jax.random.fold_in(jax.random.key(seed), index)
    embed_fn = functools.partial(transformer.embed, CFG, params)
    step_ctx = sampler.StepContext(key, index, jnp.ones((B,), bool), embed_fn, None)
    return rule.step(logits_BV, state, step_ctx)


def rule_step(decoder, logits_BV, *, thinking=True, seed=0, index=0, state=None,
              think_end_id=THINK_END):  # fmt: skip
    """One step of the decoder's rule on given logits, as the sampler would call it."""
    logits_BV = jnp.asarray(logits_BV, jnp.float32)
    return _rule_step(decoder, params_for(), logits_BV, state, seed, jnp.int32(index),
                      think_end_id=think_end_id, thinking=thinking)  # fmt: skip


soft_weights = jax.jit(decode.soft_weights, static_argnames="decoder")


def row_keys(n, seed=0):
    return jax.random.split(jax.random.key(seed), n)


# ------------------------------------------------------------------ the truncation pipeline


def spec_weights(logits_V, d: Decoder):
    """The pipeline written plainly in float64 (no noise): {token id: weight} of a concept
    token, and of the discrete sampling distribution (no max_topk)."""
    z = np.asarray(logits_V, np.float64) / d.temperature
    p = np.exp(z - z.max())
    p /= p.sum()  # temperature first, over the whole vocabulary
    order = np.argsort(-p, kind="stable")
    kept = order[: d.top_k] if d.top_k else order
    q = p[kept] / p[kept].sum()  # renormalised after top-k
    if d.top_p < 1:
        before = np.cumsum(q) - q
        kept, q = kept[before < d.top_p], q[before < d.top_p]
        q /= q.sum()
    if d.min_p > 0:
        keep = q >= d.min_p * q.max()
        kept, q = kept[keep], q[keep] / q[keep].sum()
    discrete = dict(zip(kept.tolist(), q.tolist(), strict=True))
    if d.max_topk:
        kept, q = kept[: d.max_topk], q[: d.max_topk] / q[: d.max_topk].sum()
    return dict(zip(kept.tolist(), q.tolist(), strict=True)), discrete


def as_dict(weights_K, ids_K):
    return {int(i): float(w) for w, i in zip(weights_K, ids_K, strict=True) if w > 0}


SETTINGS = [
    Decoder("soft"),  # the paper's: T 0.6, top-k 30 (> V: off), top-p 0.95, max_topk 10
    Decoder("soft", temperature=1.3, top_k=6, top_p=0.8, min_p=0.2, max_topk=3),
    Decoder("soft", temperature=0.4, top_k=0, top_p=1.0, min_p=0.05, max_topk=0),
]


@pytest.mark.parametrize("decoder", SETTINGS)
def test_soft_weights_follow_the_plain_spec(decoder):
    logits_BV = 2.0 * jax.random.normal(jax.random.key(3), (64, V))
    weights_BK, ids_BK = soft_weights(logits_BV, decoder, row_keys(64))
    probs_BK, all_ids_BK = decode.truncate(logits_BV, decoder)
    for b in range(64):
        soft, discrete = spec_weights(logits_BV[b], decoder)
        got = as_dict(weights_BK[b], ids_BK[b])
        assert got.keys() == soft.keys(), b
        # float32 softmax and sums against float64: ~1e-7 relative; 1e-5 leaves a margin.
        np.testing.assert_allclose([got[i] for i in soft], list(soft.values()), atol=1e-5)
        got = as_dict(probs_BK[b], all_ids_BK[b])
        assert got.keys() == discrete.keys(), b
        np.testing.assert_allclose([got[i] for i in discrete], list(discrete.values()), atol=1e-5)


def test_hand_computed_filters_temperature_first_and_renormalised_after_each():
    def weights(probs, **kw):
        w_BK, ids_BK = soft_weights(jnp.log(jnp.array([probs])), Decoder("soft", **kw),
                                           row_keys(1))  # fmt: skip
        return as_dict(w_BK[0], ids_BK[0])

    off = dict(temperature=1.0, top_k=0, top_p=1.0, max_topk=0)
    # T = 0.5 squares the probabilities: [.25, .09, .04] / .38 = [.658, .237, .105]; top-p 0.6
    # then keeps token 0 alone (top-p before the temperature would keep 0 and 1).
    assert weights([0.5, 0.3, 0.2], **{**off, "temperature": 0.5, "top_p": 0.6}) == {0: 1.0}
    # top-k 3 renormalises [.4, .3, .2] to [4, 3, 2] / 9; top-p 0.75 stops after 7/9 >= .75,
    # keeping two (unrenormalised, .4 + .3 < .75 would keep three): [4, 3] / 7.
    got = weights([0.4, 0.3, 0.2, 0.1], **{**off, "top_k": 3, "top_p": 0.75})
    assert got.keys() == {0, 1} and np.allclose([got[0], got[1]], [4 / 7, 3 / 7], atol=1e-6)
    # min-p 0.35 keeps p >= .35 * .5: [.5, .3] -> [5, 3] / 8.
    got = weights([0.5, 0.3, 0.15, 0.05], **{**off, "min_p": 0.35})
    assert got.keys() == {0, 1} and np.allclose([got[0], got[1]], [5 / 8, 3 / 8], atol=1e-6)
    # max_topk 2 keeps [.4, .3] -> [4, 3] / 7.
    got = weights([0.4, 0.3, 0.2, 0.1], **{**off, "max_topk": 2})
    assert got.keys() == {0, 1} and np.allclose([got[0], got[1]], [4 / 7, 3 / 7], atol=1e-6)


def test_all_filters_off_the_soft_input_is_the_probability_weighted_mean_embedding():
    decoder = Decoder("soft", temperature=0.7, top_k=0, top_p=1.0, min_p=0.0, max_topk=0)
    logits_BV = jax.random.normal(jax.random.key(4), (5, V))
    out = rule_step(decoder, logits_BV, think_end_id=None)
    E_VD = params_for()["embed"]["embedding"]
    expected_BD = jax.nn.softmax(logits_BV / 0.7) @ E_VD
    # float32 sums of 16 terms in two orders: ~1e-7 of the embedding scale (~1).
    np.testing.assert_allclose(out.embeddings_BD, expected_BD, atol=1e-6)
    assert out.state.soft_BN[:, 0].all() and out.embeddings_BD.dtype == jnp.float32


# ------------------------------------------------------------------ noise


# max_topk 4 prunes (top-p keeps 5 of the top-k 8); with 7, top-p's zeros sit inside the K.
@pytest.mark.parametrize("max_topk", [4, 7])
def test_gumbel_argmax_samples_the_truncated_distribution_and_never_a_pruned_token(max_topk):
    decoder = Decoder("gumbel", temperature=0.8, top_k=8, top_p=0.9, max_topk=max_topk)
    n = 20_000
    logits_V = 1.5 * jax.random.normal(jax.random.key(5), (V,))
    pi, discrete = spec_weights(logits_V, decoder)
    assert len(pi) == min(max_topk, 5) and len(discrete) == 5
    weights_BK, ids_BK = soft_weights(jnp.tile(logits_V, (n, 1)), decoder, row_keys(n))
    ids_BK, weights_BK = np.asarray(ids_BK), np.asarray(weights_BK)
    assert set(ids_BK[weights_BK > 0].tolist()) == pi.keys()  # pruned: weight 0, always
    assert np.all(np.diff(weights_BK, axis=1) <= 0)  # re-sorted after the noise
    support = sorted(pi)
    counts = np.array([np.sum(ids_BK[:, 0] == i) for i in support])
    expected = n * np.array([pi[i] for i in support])
    # Gumbel-max: the post-noise top-1 is an exact draw from pi. Fixed seeds make this
    # deterministic; a correct sampler fails the 1 - 1e-4 quantile with probability 1e-4.
    chi2 = np.sum((counts - expected) ** 2 / expected)
    assert chi2 < stats.chi2.ppf(1 - 1e-4, len(support) - 1), (counts, expected)
    # Not the pre-truncation distribution either (the test can tell the two apart).
    assert max(abs(c / n - pi[i]) for c, i in zip(counts, support, strict=True)) < 0.02


def test_the_discrete_draw_uses_the_filters_but_not_max_topk():
    decoder = Decoder("gumbel", temperature=0.8, top_k=8, top_p=0.9, max_topk=2)
    n = 20_000
    logits_V = 1.5 * jax.random.normal(jax.random.key(5), (V,))
    _, discrete = spec_weights(logits_V, decoder)
    out = rule_step(decoder, jnp.tile(logits_V, (n, 1)), thinking=False)
    tokens = np.asarray(out.tokens_B)
    support = sorted(discrete)
    assert set(tokens.tolist()) == set(support) and len(support) > 2
    counts = np.array([np.sum(tokens == i) for i in support])
    expected = n * np.array([discrete[i] for i in support])
    chi2 = np.sum((counts - expected) ** 2 / expected)  # as above: false alarm 1e-4
    assert chi2 < stats.chi2.ppf(1 - 1e-4, len(support) - 1), (counts, expected)


def test_dirichlet_has_mean_pi_the_alpha_spread_and_no_nan_for_tiny_alpha():
    n, alpha = 8_000, 4.0
    decoder = Decoder("dirichlet", temperature=1.0, top_k=4, top_p=1.0, max_topk=0, alpha=alpha)
    logits_V = jnp.log(jnp.array([0.4, 0.3, 0.2, 0.1] + [1e-3] * (V - 4)))
    w_BK, ids_BK = soft_weights(jnp.tile(logits_V, (n, 1)), decoder, row_keys(n))
    dense_BV = np.zeros((n, V))
    np.put_along_axis(dense_BV, np.asarray(ids_BK), np.asarray(w_BK), axis=1)
    pi = np.exp(np.asarray(logits_V[:4], np.float64))
    pi /= pi.sum()
    # Dir(alpha pi): mean pi, variance pi (1 - pi) / (alpha + 1) (<= 0.05: se of a mean over
    # 8000 draws <= 0.0025; 0.015 is 6 se).
    np.testing.assert_allclose(dense_BV[:, :4].mean(0), pi, atol=0.015)
    np.testing.assert_allclose(dense_BV[:, :4].var(0), pi * (1 - pi) / (alpha + 1), rtol=0.15)
    assert (dense_BV[:, 4:] == 0).all()  # off the support: never
    # alpha * p ~ 1e-7: plain Gamma draws underflow to 0 in every entry (0 / 0).
    tiny = decoder._replace(alpha=1e-6)
    w_BK, _ = soft_weights(jnp.tile(logits_V, (64, 1)), tiny, row_keys(64))
    assert np.isfinite(w_BK).all() and np.allclose(w_BK.sum(-1), 1, atol=1e-6)
    assert np.isfinite(rule_step(tiny, jnp.tile(logits_V, (64, 1))).embeddings_BD).all()


def test_the_delimiter_is_decided_on_the_post_noise_top1():
    n = 4_000
    # Tempered (T = 1) probabilities: token 7 0.6, the delimiter 0.4, the rest ~0.
    logits_V = jnp.full((V,), -30.0).at[7].set(jnp.log(0.6)).at[THINK_END].set(jnp.log(0.4))
    logits_BV = jnp.tile(logits_V, (n, 1))
    gumbel = Decoder("gumbel", temperature=1.0, tau=0.5)
    out = rule_step(gumbel, logits_BV)
    ended = ~np.asarray(out.state.thinking_B)
    tokens = np.asarray(out.tokens_B)
    np.testing.assert_array_equal(tokens, np.where(ended, THINK_END, 7))
    assert abs(ended.mean() - 0.4) < 0.04  # Gumbel-max: P(delimiter on top) = 0.4; se 0.008
    np.testing.assert_array_equal(out.state.think_end_B, np.where(ended, 0, -1))
    # The delimiter is fed as itself; the others get a concept token w E[7] + (1 - w) E[end]
    # with w > 1/2 (7 on top after the noise), w varying with the noise.
    E7, E_end = np.asarray(embed(jnp.array([[7, THINK_END]]))[0])
    np.testing.assert_array_equal(out.embeddings_BD[ended], np.tile(E_end, (ended.sum(), 1)))
    rest_RD, d_D = np.asarray(out.embeddings_BD[~ended]) - E_end, E7 - E_end
    w_R = rest_RD @ d_D / (d_D @ d_D)
    # float32 weighted sums: ~1e-7 off the segment.
    np.testing.assert_allclose(rest_RD, w_R[:, None] * d_D, atol=1e-5)
    assert (w_R > 0.5 - 1e-6).all() and (w_R <= 1 + 1e-6).all() and w_R.std() > 0.05
    # Vanilla soft: the pre-noise top-1 is token 7 in every row, so no row ends.
    assert out.state.soft_BN[:, 0].sum() == (~ended).sum()
    assert rule_step(gumbel._replace(kind="soft"), logits_BV).state.thinking_B.all()


def test_noise_is_off_after_the_delimiter():
    logits_BV = 2.0 * jax.random.normal(jax.random.key(6), (256, V))
    outs = {k: rule_step(Decoder(k), logits_BV, thinking=False, seed=3) for k in decode.KINDS[1:]}
    for kind, out in outs.items():
        np.testing.assert_array_equal(out.tokens_B, outs["sample"].tokens_B, err_msg=kind)
        np.testing.assert_array_equal(out.logprobs_B, outs["sample"].logprobs_B, err_msg=kind)
        if kind != "sample":
            np.testing.assert_array_equal(out.embeddings_BD, embed(out.tokens_B[:, None])[:, 0])
            assert not out.state.soft_BN.any()
    assert len(set(np.asarray(outs["sample"].tokens_B).tolist())) > 3  # the draws do vary


def test_keys_differ_per_row_and_a_row_does_not_depend_on_its_batch():
    logits_BV = jnp.tile(jax.random.normal(jax.random.key(7), (V,)), (6, 1))
    six = rule_step(Decoder("gumbel", temperature=1.0), logits_BV).embeddings_BD
    three = rule_step(Decoder("gumbel", temperature=1.0), logits_BV[:3]).embeddings_BD
    np.testing.assert_array_equal(six[:3], three)
    assert len({tuple(np.asarray(r).round(5)) for r in six}) == 6
    later = rule_step(Decoder("gumbel", temperature=1.0), logits_BV, index=1).embeddings_BD
    assert not np.isclose(later, six).all(-1).any()  # the step index moves every row's key


def test_cold_stop_counts_consecutive_low_entropy_steps():
    decoder = Decoder("soft", cold_stop_steps=3, cold_stop_entropy=0.01)
    peaked_V = jnp.zeros((V,)).at[7].set(40.0)  # H / log V ~ 0
    flat_V = jnp.zeros((V,)).at[7].set(0.1)  # H / log V ~ 1, top-1 still 7
    sequence = [peaked_V, peaked_V, flat_V, peaked_V, peaked_V, peaked_V, peaked_V]
    state = decode.next_input_rule(decoder, THINK_END).init(1, len(sequence))
    tokens = []
    for i, logits_V in enumerate(sequence):
        out = rule_step(decoder, logits_V[None], state=state, index=i)
        state, tokens = out.state, [*tokens, int(out.tokens_B[0])]
    # The flat step resets the count: the third consecutive low one is step 5.
    assert tokens == [7, 7, 7, 7, 7, THINK_END, 7]
    assert int(state.think_end_B[0]) == 5 and bool(state.cold_stop_B[0])
    assert state.soft_BN[0].tolist() == [True] * 5 + [False, False]


# ------------------------------------------------------------------ probes and errors


def test_js_divergence_hand_values():
    inf = -jnp.inf
    a = jnp.array([[0.0, inf], [0.0, 0.0], [1.0, 2.0]])
    b = jnp.array([[inf, 0.0], [0.0, inf], [1.0, 2.0]])
    # disjoint: ln 2; [.5, .5] vs [1, 0]: M = [.75, .25], (KL(p||M) + KL(q||M)) / 2
    # = (.5 ln(2/3) + .5 ln 2 + ln(4/3)) / 2; identical: 0.
    expected = [np.log(2), (0.5 * np.log(2 / 3) + 0.5 * np.log(2) + np.log(4 / 3)) / 2, 0.0]
    np.testing.assert_allclose(probes.js_divergence(a, b), expected, atol=1e-6)
    np.testing.assert_allclose(probes.js_divergence(b, a), expected, atol=1e-6)  # symmetric
    assert np.isfinite(probes.js_divergence(a, b)).all()


@pytest.mark.parametrize(
    "decoder, kwargs, field",
    [
        (Decoder("beam"), {}, "kind"),
        (Decoder("soft", top_p=0.0), {}, "top_p"),
        (Decoder("gumbel", tau=0.0), {}, "tau"),
        (Decoder("greedy"), {"probe": True}, "probe"),
        (Decoder("soft", max_topk=1), {"probe": True}, "top-2"),
    ],
)
def test_bad_settings_are_one_line_config_errors(decoder, kwargs, field):
    prompt_BP, _ = prompts()
    with pytest.raises(ConfigError, match=field) as e:
        decode.generate(CFG, params_for(), prompt_BP, rng=jax.random.key(0), decoder=decoder,
                        think_end_id=THINK_END, eos_id=EOS, max_new_tokens=4, **kwargs)  # fmt: skip
    assert "\n" not in str(e.value)
