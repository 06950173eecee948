"""RLCR noisy-witness task: the closed-form posterior against brute-force Bayes and against
sampled data, prompt layout, completion parsing, and the format warm-start data."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from methods.rlcr import witness as W

ANS, CONF, EOS, PAD, SEP = W.ANS, W.CONF, W.EOS, W.PAD, W.SEP


def _d(digit):
    return W.DIGIT0 + digit


def _c(q):
    return int(W.confidence_token(q))


def _brute_force_posterior(witnesses, rho):
    """P(a = d | w) by enumerating a: uniform prior times prod_j P(w_j | a), normalised."""
    joint = np.array(
        [np.prod([rho * (w == a) + (1 - rho) / 10 for w in witnesses]) / 10 for a in range(10)]
    )
    return joint / joint.sum()


def test_posterior_matches_brute_force_bayes():
    rng = np.random.default_rng(0)
    cases = []
    for _ in range(200):
        m = int(rng.integers(0, 12))
        cases.append((rng.integers(0, 10, m), float(rng.uniform(0.01, 0.99))))
    counts_B10 = np.array([np.bincount(w, minlength=10) for w, _ in cases])
    rho_B = np.array([rho for _, rho in cases])
    expected_B10 = np.array([_brute_force_posterior(w, rho) for w, rho in cases])
    post_B10 = W.posterior(counts_B10, rho_B)
    assert post_B10.dtype == np.float64
    # Both sides are a few float64 products and one normalisation of values in [1e-12, 1]:
    # rounding is ~1e-15, so 1e-9 only fails for a wrong formula (e.g. kappa = rho/(1-rho)).
    np.testing.assert_allclose(post_B10, expected_B10, rtol=0, atol=1e-9)
    np.testing.assert_allclose(post_B10.sum(-1), 1.0, atol=1e-12)
    # jnp inputs take the jax path (float32 under jit).
    jitted_B10 = jax.jit(W.posterior)(jnp.asarray(counts_B10), jnp.asarray(rho_B))
    np.testing.assert_allclose(jitted_B10, expected_B10, atol=1e-5)


def test_map_accuracy_matches_mean_max_posterior_on_samples():
    family = W.Family("fixed", 2, 2, (0.3,))
    data = W.sample(np.random.default_rng(1), 20000, family)
    post_B10 = W.posterior(data["counts"], data["rho"].astype(np.float64))
    hit_B = post_B10.argmax(-1) == data["answer"]
    expected = W.bayes_summary(data["counts"], data["rho"])["accuracy"]
    np.testing.assert_allclose(expected, post_B10.max(-1).mean(), rtol=1e-6)
    # The hits are independent Bernoulli(p*_i); their mean's std error is at most
    # sqrt(pbar (1 - pbar) / n), so a correct sampler + posterior lands within 3 of it
    # (~0.3% false alarm). A wrong kappa moves the prediction by ~0.1, i.e. > 20 errors.
    stderr = np.sqrt(expected * (1 - expected) / hit_B.size)
    assert abs(hit_B.mean() - expected) < 3 * stderr, (hit_B.mean(), expected, stderr)


def test_bayes_summary_and_answer_posterior():
    counts_B10 = np.zeros((2, 10), np.int32)
    counts_B10[1, 3] = 4
    rho_B = np.array([0.5, 0.9])
    summary = W.bayes_summary(counts_B10, rho_B)
    p_star = W.posterior(counts_B10, rho_B)[1, 3]
    assert p_star > 0.99
    np.testing.assert_allclose(summary["accuracy"], (0.1 + p_star) / 2, rtol=1e-9)
    np.testing.assert_allclose(summary["brier"], (0.09 + p_star * (1 - p_star)) / 2, rtol=1e-9)
    assert summary["entropy"] > np.log(10) / 2  # uniform row contributes log(10) / 2
    post_B10 = W.posterior(counts_B10, rho_B)
    got_B = W.answer_posterior(counts_B10, rho_B, np.array([7, 3]))
    np.testing.assert_allclose(got_B, [post_B10[0, 7], post_B10[1, 3]])
    np.testing.assert_array_equal(W.answer_posterior(counts_B10, rho_B, np.array([-1, 10])), 0)
    jitted_B = jax.jit(W.answer_posterior)(
        jnp.asarray(counts_B10), jnp.asarray(rho_B), jnp.array([3, -1])
    )
    np.testing.assert_allclose(jitted_B, [0.1, 0.0], atol=1e-6)


@pytest.mark.parametrize("family", [W.IN_DOMAIN, W.OUT_OF_DOMAIN], ids=lambda f: f.name)
def test_prompts_are_left_padded_and_decode_back(family):
    data = W.sample(np.random.default_rng(2), 500, family)
    prompt_nP, mask_nP = data["prompt"], data["prompt_mask"]
    m_n = data["num_witnesses"]
    assert prompt_nP.shape == (500, 3 + family.max_witnesses) and prompt_nP.dtype == np.int32
    assert m_n.min() == family.min_witnesses and m_n.max() == family.max_witnesses
    np.testing.assert_array_equal(mask_nP.sum(1), m_n + 3)
    np.testing.assert_array_equal(mask_nP, np.sort(mask_nP, axis=1))  # pads only on the left
    np.testing.assert_array_equal(prompt_nP[~mask_nP], PAD)
    np.testing.assert_array_equal(prompt_nP[:, -1], W.SEP)
    first_n = np.argmax(mask_nP, axis=1)
    rows_n = np.arange(500)
    np.testing.assert_array_equal(prompt_nP[rows_n, first_n], W.BOS)
    np.testing.assert_array_equal(W.RHO_OF_TOKEN[prompt_nP[rows_n, first_n + 1]], data["rho"])
    digit_nP = W.DIGIT_OF_TOKEN[prompt_nP]
    counts_n10 = ((digit_nP[:, :, None] == np.arange(10)) & mask_nP[:, :, None]).sum(1)
    np.testing.assert_array_equal(counts_n10, data["counts"])
    np.testing.assert_array_equal(data["counts"].sum(1), m_n)
    assert set(np.unique(data["rho"])) == {np.float32(r) for r in W.RHOS}


def test_one_example_per_generator_is_sample_of_one_from_each():
    """The training stream (`sample_each`, one generator per example, laid out together)
    equals sampling one example from each generator alone."""
    rngs = lambda: [np.random.default_rng([5, i]) for i in range(40)]  # noqa: E731
    together = W.sample_each(rngs(), W.IN_DOMAIN)
    alone = [W.sample(r, 1, W.IN_DOMAIN) for r in rngs()]
    for key, value in together.items():
        np.testing.assert_array_equal(value, np.concatenate([a[key] for a in alone]), key)


def test_family_validation():
    with pytest.raises(ValueError, match="rhos"):
        W.Family("bad", 1, 3, (0.35,))
    with pytest.raises(ValueError, match="rhos"):
        W.Family("bad", 1, 3, ())
    with pytest.raises(ValueError, match="min_witnesses"):
        W.Family("bad", 0, 3, W.RHOS)
    with pytest.raises(ValueError, match="min_witnesses"):
        W.Family("bad", 4, 3, W.RHOS)
    assert W.Family("ok", 2, 2, [0.5]).rhos == (0.5,)


# (tokens, expected (ok, answer, q)); each row is padded to the same width, mask up to EOS.
PARSE_CASES = {
    "canonical": ([ANS, _d(7), CONF, _c(0.8), EOS], (True, 7, 0.8)),
    "thinking_tokens": ([_d(1), SEP, ANS, _d(2), _d(4), CONF, _c(0.0), EOS], (True, 2, 0.0)),
    "last_answer_tag_wins": ([ANS, _d(1), ANS, _d(5), CONF, _c(1.0), EOS], (True, 5, 1.0)),
    "last_conf_tag_wins": ([ANS, _d(3), CONF, _c(0.2), CONF, _c(0.6), EOS], (True, 3, 0.6)),
    "no_eos": ([ANS, _d(7), CONF, _c(0.8), PAD], (False, -1, 0.0)),
    "digit_missing": ([ANS, CONF, _c(0.8), EOS], (False, -1, 0.0)),
    "last_ans_no_digit": ([ANS, _d(1), ANS, CONF, _c(0.8), EOS], (False, -1, 0.0)),
    "conf_before_ans": ([CONF, _c(0.8), ANS, _d(7), EOS], (False, -1, 0.0)),
    "junk_after_conf": ([ANS, _d(7), CONF, _c(0.8), _d(1), EOS], (False, -1, 0.0)),
    "conf_token_missing": ([ANS, _d(7), CONF, EOS], (False, -1, 0.0)),
    "conf_then_digit": ([ANS, _d(7), CONF, _d(9), EOS], (False, -1, 0.0)),
    "no_answer_tag": ([_d(7), CONF, _c(0.8), EOS], (False, -1, 0.0)),
}


def _parse_batch(rows, width=12, mask_after_eos=False):
    tokens_BN = np.full((len(rows), width), PAD, np.int32)
    mask_BN = np.zeros((len(rows), width), bool)
    for b, row in enumerate(rows):
        tokens_BN[b, : len(row)] = row
        stop = width if mask_after_eos else (row.index(EOS) + 1 if EOS in row else len(row))
        mask_BN[b, :stop] = True
    return jnp.asarray(tokens_BN), jnp.asarray(mask_BN)


def test_parse_cases_eager_and_jitted():
    names = list(PARSE_CASES)
    tokens_BN, mask_BN = _parse_batch([PARSE_CASES[k][0] for k in names])
    eager = W.parse(tokens_BN, mask_BN)
    jitted = jax.jit(W.parse)(tokens_BN, mask_BN)
    for got, want in zip(jitted, eager, strict=True):
        np.testing.assert_array_equal(got, want)
    ok_B, answer_B, q_B = eager
    assert ok_B.dtype == jnp.bool_ and answer_B.dtype == jnp.int32 and q_B.dtype == jnp.float32
    for b, name in enumerate(names):
        want_ok, want_answer, want_q = PARSE_CASES[name][1]
        got = (bool(ok_B[b]), int(answer_B[b]), float(q_B[b]))
        assert got[:2] == (want_ok, want_answer) and np.isclose(got[2], want_q), (name, got)


def test_parse_ignores_tokens_after_first_eos():
    rows = [
        [ANS, _d(7), CONF, _c(0.8), EOS, ANS, _d(1), CONF, _c(0.1), EOS],
        [ANS, _d(7), CONF, EOS, _c(0.8), EOS],  # a valid tail after EOS must not rescue it
    ]
    # Even with the mask (wrongly) True after EOS, only the first EOS's prefix counts.
    ok_B, answer_B, q_B = jax.jit(W.parse)(*_parse_batch(rows, mask_after_eos=True))
    np.testing.assert_array_equal(ok_B, [True, False])
    np.testing.assert_array_equal(answer_B, [7, -1])
    np.testing.assert_allclose(q_B, [0.8, 0.0])
    # A masked-out EOS is not an EOS.
    tokens_BN, mask_BN = _parse_batch([[ANS, _d(7), CONF, _c(0.8), EOS]])
    ok_B, _, _ = W.parse(tokens_BN, mask_BN.at[:, 4].set(False))
    assert not bool(ok_B[0])
