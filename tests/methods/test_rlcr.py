"""RLCR method: rewards from token ids, the warm start's data, evaluation helpers, the Method."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import rlcr as rlcr_config
from core.errors import ConfigError
from core.nn import transformer
from methods import rlcr
from methods.rlcr import evaluation, policy, witness


def completion(digit, q):
    return [
        witness.ANS,
        witness.DIGIT0 + digit,
        witness.CONF,
        int(witness.confidence_token(q)),
        witness.EOS,
    ]


def test_token_rewards_follow_the_official_weights():
    tokens_RN = jnp.array(
        [completion(3, 1.0), completion(3, 0.0), completion(5, 0.0), completion(5, 1.0)]
        + [[witness.ANS, witness.DIGIT0 + 3, witness.EOS, 0, 0]]  # no confidence: format fails
    )
    mask_RN = tokens_RN != witness.PAD
    batch_R = {"answer": jnp.full((5,), 3)}
    rlcr_R, metrics = policy.token_rewards(batch_R, tokens_RN, mask_RN, weights=(0.5, 0.5, 0.5))
    # fmt + acc + (1 - (q - c)^2), each x 0.5: right & sure 1.5, right & unsure 1.0,
    # wrong & unsure 1.0, wrong & sure 0.5, malformed 0.
    np.testing.assert_allclose(rlcr_R, [1.5, 1.0, 1.0, 0.5, 0.0])
    rlvr_R, _ = policy.token_rewards(batch_R, tokens_RN, mask_RN, weights=(0.5, 0.5, 0.0))
    np.testing.assert_allclose(rlvr_R, [1.0, 1.0, 0.5, 0.5, 0.0])  # confidence is ignored
    np.testing.assert_allclose(metrics["format_rate"], 0.8)
    np.testing.assert_allclose(metrics["sample_accuracy"], 0.4)
    np.testing.assert_allclose(metrics["sample_confidence"], 0.5)  # over well-formed only


def test_warm_start_completions_are_well_formed_and_say_nothing_of_the_answer():
    data = witness.sample(np.random.default_rng(0), 4000, witness.IN_DOMAIN)
    prompt, mask = jnp.asarray(data["prompt"]), jnp.asarray(data["prompt_mask"])
    for answers in ("witness", "random"):
        tokens_NK = policy.random_completions(jax.random.key(0), prompt, mask, answers)
        ok_N, answer_N, q_N = witness.parse(tokens_NK, jnp.ones(tokens_NK.shape, bool))
        assert bool(ok_N.all())
        assert abs(float(q_N.mean()) - 0.5) < 0.03  # uniform q: sd of the mean ~ .005
        named_N = np.take_along_axis(data["counts"], np.asarray(answer_N)[:, None], 1)[:, 0] > 0
        if answers == "random":  # uniform digits: each ~400 of 4000 (sd ~19), 5 sd margins
            counts = np.bincount(np.asarray(answer_N), minlength=10)
            assert counts.min() > 300 and counts.max() < 500, counts
            assert named_N.mean() < 0.6  # in domain, a uniform digit is named by a witness ~1/3
        else:  # always a digit some witness named, drawn per witness (not per distinct digit)
            assert named_N.all()
            frac = np.take_along_axis(data["counts"], np.asarray(answer_N)[:, None], 1)[:, 0]
            expected = (data["counts"] ** 2).sum(1) / data["num_witnesses"] ** 2
            # E[n_answer / m] under a uniform witness pick is sum_d n_d^2 / m^2; 4000 draws.
            assert abs((frac / data["num_witnesses"]).mean() - expected.mean()) < 0.02


def test_vote_schemes_count_as_documented():
    ok_BK = np.array([[True, True, True, False], [True, True, True, True]])
    answer_BK = np.array([[1, 1, 2, 2], [4, 4, 7, 7]])
    q_BK = np.array([[0.1, 0.2, 0.9, 1.0], [0.2, 0.2, 0.3, 0.3]], np.float32)
    majority = evaluation.vote_scores(ok_BK, answer_BK, np.ones_like(q_BK))
    weighted = evaluation.vote_scores(ok_BK, answer_BK, q_BK)
    np.testing.assert_allclose(majority[0, [1, 2]], [2, 1])  # the malformed sample has no vote
    np.testing.assert_allclose(weighted[0, [1, 2]], [0.3, 0.9])
    assert majority.argmax(1).tolist() == [1, 4]  # 4 and 7 tie at 2: the smaller digit wins
    assert weighted.argmax(1).tolist() == [2, 7]


def test_probe_refuses_a_single_class():
    with pytest.raises(ValueError, match="both correct and wrong"):
        evaluation.fit_probe(np.zeros((5, 3)), np.ones(5, bool))


def test_summary_of_a_constant_confidence_has_uninformative_auroc():
    correct_N = np.arange(100) % 4 == 0
    scores = evaluation.summary(np.full(100, 0.9), correct_N)
    np.testing.assert_allclose(scores["accuracy"], 0.25)
    np.testing.assert_allclose(scores["ece"], 0.65, rtol=1e-5)  # float32 sum of 100 x 0.9
    assert scores["auroc"] == 0.5


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("warm_start.steps", 10**6, "warm_start.steps"),
        ("rewards.w_brier", -1.0, "rewards weights"),
        ("grpo.aggregation", "bnpo", "aggregation"),
    ],
)
def test_bad_config_fields_give_one_line_errors(field, value, match):
    c = rlcr_config.get_config("size=smoke")
    section, name = field.split(".")
    c[section][name] = value
    with pytest.raises(ConfigError, match=match):
        rlcr.make(c)


def test_greedy_evaluation_reads_answers_and_states_through_the_transformer():
    c = rlcr_config.get_config("size=smoke")
    cfg = policy.model_config(c.model, "float32")
    params = transformer.init_params(cfg, jax.random.key(0))
    data = witness.sample(np.random.default_rng(0), 6, witness.IN_DOMAIN)
    out = evaluation.answer(cfg, params, data)
    assert out["hidden"].shape == (6, c.model.d_model)
    assert set(out) >= {"q", "correct", "answer_prob", "ideal_q"}
    # An untrained policy rarely produces the format; what it does not produce scores 0.
    assert np.all(out["q"][~out["format_ok"]] == 0) and np.all(
        out["answer"][~out["format_ok"]] == -1
    )


def _program_policy(transitions_VV):
    """A transformer whose next-token logits depend only on the current token: one-hot
    embeddings, attention and MLP outputs zeroed (every block adds 0 to the residual), and an
    output head that reads row `transitions_VV[token]` (up to the final norm's constant
    scale). Greedy decoding then follows the table, so every position is known."""
    V = witness.VOCAB_SIZE
    cfg = transformer.TransformerConfig(
        vocab_size=V, num_layers=1, d_model=48, num_heads=2, d_ff=16, max_len=19,
        dtype="float32",
    )  # fmt: skip
    params = jax.tree_util.tree_map(np.asarray, transformer.init_params(cfg, jax.random.key(0)))
    params["embed"]["embedding"] = np.eye(V, cfg.d_model, dtype=np.float32)
    params["blocks"][0]["attn"]["o"]["kernel"] = np.zeros((48, 48), np.float32)
    params["blocks"][0]["mlp"]["down"]["kernel"] = np.zeros((16, 48), np.float32)
    head_DV = np.zeros((cfg.d_model, V), np.float32)
    head_DV[:V] = transitions_VV / np.sqrt(cfg.d_model)  # RMSNorm scales a one-hot by sqrt(D)
    params["lm_head"]["kernel"] = head_DV
    return cfg, params


def test_evaluation_readouts_sit_at_the_answer_digit_and_the_confidence_tag():
    # Greedy completion [free, ANS, 3, CONF, 0.70, EOS]: the hidden state is read where the
    # answer digit is the input, mean_q where CONF is; a readout one position off lands on a
    # different token (a different one-hot hidden state, a uniform confidence distribution).
    free, digit, q_tok = witness.DIGIT0 + 7, witness.DIGIT0 + 3, witness.CONF0 + 14
    T_VV = np.zeros((witness.VOCAB_SIZE, witness.VOCAB_SIZE), np.float32)
    for token, nxt in [
        (witness.SEP, free), (free, witness.ANS), (digit, witness.CONF), (q_tok, witness.EOS),
    ]:  # fmt: skip
        T_VV[token, nxt] = 20.0
    T_VV[witness.ANS, digit], T_VV[witness.ANS, digit + 1] = 3.0, 2.0  # answer prob < 1
    T_VV[witness.CONF, witness.CONF0 :] = np.linspace(-2.0, 2.0, len(witness.CONF_VALUES))
    T_VV[witness.CONF, q_tok] = 4.0  # the mode, stated greedily; the mean differs from it
    cfg, params = _program_policy(T_VV)
    data = witness.sample(np.random.default_rng(0), 3, witness.IN_DOMAIN)
    out = evaluation.answer(cfg, params, data)
    assert out["format_ok"].all() and (out["answer"] == 3).all()
    np.testing.assert_allclose(out["q"], 0.7)

    def single_token(fn, token):  # every block adds 0, so a lone token gives its readout
        return np.asarray(fn(cfg, params, jnp.array([[token]]))[0, 0])

    logits = lambda *a: transformer.apply(*a)[0]  # noqa: E731
    hidden_D = single_token(transformer.features, digit)
    np.testing.assert_allclose(out["hidden"], np.tile(hidden_D, (3, 1)))  # same ops: ~exact
    conf_probs_K = jax.nn.softmax(single_token(logits, witness.CONF)[witness.CONF0 :])
    expected_mean_q = float(conf_probs_K @ np.asarray(witness.CONF_VALUES))
    assert abs(expected_mean_q - 0.5) > 0.1  # the neighbours' rows give exactly 0.5
    # float32 softmax and a 21-term dot: rounding ~1e-7; 1e-5 leaves room for the reduction order
    np.testing.assert_allclose(out["mean_q"], expected_mean_q, atol=1e-5)
    answer_prob = jax.nn.softmax(single_token(logits, witness.ANS))[digit]
    np.testing.assert_allclose(out["answer_prob"], answer_prob, rtol=1e-5)  # same rounding


def test_each_family_is_its_own_evaluation_stream(monkeypatch):
    """The Method's two named streams (eval/in_domain/..., eval/out_of_domain/...) equal the
    per-family loop they replaced, each on its own family's examples."""
    from core import train

    config = rlcr_config.get_config("mesh=cpu,size=smoke")
    session = train.init(config, rlcr.make(config), devices=jax.devices()[:1])
    asked, eval_data = [], rlcr.eval_data
    monkeypatch.setattr(
        rlcr, "eval_data", lambda family, *a: asked.append(family.name) or eval_data(family, *a)
    )
    metrics = session.evaluate()
    # At init every score is 0 in both families, so the routing is checked by what was asked.
    assert asked == ["in_domain", "out_of_domain"]
    cfg = policy.model_config(config.model, "float32")
    for family in (witness.IN_DOMAIN, witness.OUT_OF_DOMAIN):
        data = eval_data(family, config.eval.num_examples, config.seed)
        outcome = evaluation.answer(cfg, session.state.params, data)
        expected = evaluation.summary(outcome["q"], outcome["correct"])
        expected["format"] = float(outcome["format_ok"].mean())
        got = {k.split("/", 1)[1]: v for k, v in metrics.items() if k.startswith(family.name)}
        assert got.keys() == expected.keys()
        # The same function on the same examples: bitwise, NaN (undefined AUROC) included.
        np.testing.assert_array_equal([got[k] for k in expected], list(expected.values()))
