"""Evaluating a policy on the witness task: answers, confidences, baselines, voting.

    outcome = answer(cfg, params, data)          # greedy: answer, stated q, answer-token prob
    summary(outcome["q"], outcome["correct"])    # accuracy, ECE, Brier, AUROC
    votes = vote(cfg, params, data, rng=key, num_samples=8, temperature=0.7)

The confidences compared (arms of the experiment):
- verbalized: the confidence token the policy states (RLCR trains it; RLVR does not), and
  its expectation under the policy (`mean_q`);
- answer probability: softmax probability of the emitted answer token (temperature 1);
- post-hoc probe: logistic regression on the frozen final hidden state at the answer token,
  fitted to correctness on fresh training-distribution questions (`fit_probe`).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from sklearn.linear_model import LogisticRegression

from core.nn import sampler, transformer
from methods.rlcr import calibration, policy, witness

EVAL_BATCH = 1024  # rows per decode call: bounds memory, one compile per shape


def _in_batches(fn, data) -> tuple[np.ndarray, ...]:
    """`fn(chunk_index, prompt_BP, mask_BP) -> tuple of [B, ...]` over chunks of EVAL_BATCH
    questions, concatenated on the host."""
    parts = []
    for i, start in enumerate(range(0, len(data["prompt"]), EVAL_BATCH)):
        rows = slice(start, start + EVAL_BATCH)
        parts.append(jax.device_get(fn(i, data["prompt"][rows], data["prompt_mask"][rows])))
    return tuple(np.concatenate(x) for x in zip(*parts, strict=True))


def summary(q_N, correct_N) -> dict[str, float]:
    """Accuracy, ECE (10 bins), Brier and AUROC of confidences against correctness."""
    q_N, correct_N = jnp.asarray(q_N, jnp.float32), jnp.asarray(correct_N, bool)
    return {
        "accuracy": float(calibration.accuracy(correct_N)),
        "ece": float(calibration.ece(q_N, correct_N)),
        "brier": float(calibration.brier_score(q_N, correct_N)),
        "auroc": float(calibration.auroc(q_N, correct_N)),
    }


@functools.partial(jax.jit, static_argnames=("cfg",))
def _greedy(cfg, params, prompt_BP, prompt_mask_BP):
    out = sampler.sample(
        transformer.policy(cfg),
        params,
        prompt_BP,
        rng=jax.random.key(0),  # unused by greedy decoding
        max_new_tokens=policy.MAX_NEW_TOKENS,
        prompt_mask_BP=prompt_mask_BP,
        temperature=0.0,
        eos_id=witness.EOS,
        pad_id=witness.PAD,
    )
    format_ok_B, answer_B, q_B = witness.parse(out.tokens_BN, out.mask_BN)
    # The answer digit sits right after the last ANS; greedy log-probs are at temperature 1.
    is_ans_BN = (out.tokens_BN == witness.ANS) & out.mask_BN
    ans_pos_B = witness.last_index(is_ans_BN) + 1
    ans_pos_B = jnp.clip(ans_pos_B, 0, out.tokens_BN.shape[1] - 1)
    ans_logp_B = jnp.take_along_axis(out.logprobs_BN, ans_pos_B[:, None], axis=1)[:, 0]
    seq_BT = jnp.concatenate([prompt_BP, out.tokens_BN], axis=1)
    key_mask_BT = jnp.concatenate([prompt_mask_BP, out.mask_BN], axis=1)
    positions_BT = jnp.maximum(jnp.cumsum(key_mask_BT, axis=1, dtype=jnp.int32) - 1, 0)
    teacher = dict(positions_BT=positions_BT, key_mask_BT=key_mask_BT)
    at = lambda x_BT, pos_B: jnp.take_along_axis(x_BT, pos_B[:, None, None], axis=1)[:, 0]  # noqa: E731
    P = prompt_BP.shape[1]
    # Hidden state where the answer digit is the input: it has read the prompt and the answer.
    hidden_BD = at(transformer.features(cfg, params, seq_BT, **teacher), P + ans_pos_B)
    # The policy's distribution over confidence tokens where it states one (input: CONF).
    is_conf_BN = (out.tokens_BN == witness.CONF) & out.mask_BN
    conf_pos_B = witness.last_index(is_conf_BN)
    logits_BV = at(transformer.apply(cfg, params, seq_BT, **teacher)[0], P + conf_pos_B)
    conf_probs_BK = jax.nn.softmax(logits_BV[:, witness.CONF0 :], axis=-1)
    mean_q_B = conf_probs_BK @ jnp.asarray(witness.CONF_VALUES, jnp.float32)
    answer_prob_B = jnp.where(format_ok_B, jnp.exp(ans_logp_B), 0.0)
    mean_q_B = jnp.where(format_ok_B, mean_q_B, 0.0)
    return format_ok_B, answer_B, q_B, mean_q_B, answer_prob_B, hidden_BD


def answer(cfg, params, data: dict) -> dict[str, np.ndarray]:
    """Greedy completions of `data` (from `witness.sample`), parsed, as numpy arrays.

    Keys: format_ok, answer (-1 on format failure), q (stated confidence, 0 on failure),
    mean_q (the expected stated confidence under the policy's distribution over confidence
    tokens at that point, renormalised over them: a readout without the mode's arbitrariness
    when that distribution is flat, as after the warm start), correct, answer_prob, ideal_q
    (the exact posterior of the given answer: what a calibrated policy states), hidden (the
    final hidden state at the answer token).
    """
    format_ok, answer_, q, mean_q, answer_prob, hidden = _in_batches(
        lambda i, prompt_BP, mask_BP: _greedy(cfg, params, prompt_BP, mask_BP), data
    )
    return {
        "format_ok": format_ok,
        "answer": answer_,
        "q": q,
        "mean_q": mean_q,
        "correct": format_ok & (answer_ == data["answer"]),
        "answer_prob": answer_prob,
        "ideal_q": witness.answer_posterior(
            data["counts"], data["rho"].astype(np.float64), answer_
        ),
        "hidden": hidden,
    }


def fit_probe(hidden_ND, correct_N, *, seed: int = 0) -> LogisticRegression:
    """Logistic regression of correctness on frozen hidden states (the post-hoc baseline)."""
    if correct_N.all() or not correct_N.any():
        raise ValueError("fit_probe needs both correct and wrong answers to learn from")
    return LogisticRegression(C=1.0, max_iter=2000, random_state=seed).fit(hidden_ND, correct_N)


def probe_confidence(probe: LogisticRegression, hidden_ND) -> np.ndarray:
    return probe.predict_proba(hidden_ND)[:, 1].astype(np.float32)


@functools.partial(jax.jit, static_argnames=("cfg", "num_samples", "temperature"))
def _sampled(cfg, params, prompt_BP, prompt_mask_BP, rng, *, num_samples, temperature):
    out = sampler.sample(
        transformer.policy(cfg),
        params,
        jnp.repeat(prompt_BP, num_samples, axis=0),
        rng=rng,
        max_new_tokens=policy.MAX_NEW_TOKENS,
        prompt_mask_BP=jnp.repeat(prompt_mask_BP, num_samples, axis=0),
        temperature=temperature,
        eos_id=witness.EOS,
        pad_id=witness.PAD,
    )
    format_ok_R, answer_R, q_R = witness.parse(out.tokens_BN, out.mask_BN)
    shape = (prompt_BP.shape[0], num_samples)
    return format_ok_R.reshape(shape), answer_R.reshape(shape), q_R.reshape(shape)


def vote_scores(format_ok_BK, answer_BK, weight_BK):
    """[B, 10] summed weight of the well-formed samples naming each digit."""
    one_hot_BKD = (answer_BK[..., None] == np.arange(witness.NUM_DIGITS)) & format_ok_BK[..., None]
    return (one_hot_BKD * weight_BK[..., None]).sum(axis=1)


def vote(cfg, params, data, *, rng, num_samples: int, temperature: float) -> dict[str, float]:
    """Accuracy of test-time aggregation over `num_samples` sampled completions per question.

    majority: the most frequent answer; weighted: the answer with the largest summed stated
    confidence (RLCR's confidence-weighted vote); max_confidence: the single most confident
    sample. Ties go to the smaller digit, the same rule for every scheme.
    """
    ok_BK, answer_BK, q_BK = _in_batches(
        lambda i, prompt_BP, mask_BP: _sampled(
            cfg,
            params,
            prompt_BP,
            mask_BP,
            jax.random.fold_in(rng, i),
            num_samples=num_samples,
            temperature=temperature,
        ),
        data,
    )
    majority_B = vote_scores(ok_BK, answer_BK, np.ones_like(q_BK)).argmax(1)
    weighted_B = vote_scores(ok_BK, answer_BK, q_BK).argmax(1)
    best_B = np.where(ok_BK, q_BK, -1.0).argmax(1)
    max_conf_B = np.take_along_axis(np.where(ok_BK, answer_BK, -1), best_B[:, None], 1)[:, 0]
    truth_B = data["answer"]
    return {
        "single": float(((answer_BK[:, 0] == truth_B) & ok_BK[:, 0]).mean()),
        "majority": float((majority_B == truth_B).mean()),
        "weighted": float((weighted_B == truth_B).mean()),
        "max_confidence": float((max_conf_B == truth_B).mean()),
    }
