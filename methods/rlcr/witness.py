"""Noisy-witness QA: a synthetic RLCR task whose probability of being correct is exact.

A hidden answer a is uniform over the digits 0..9. The prompt shows a reliability token for rho
and m witness digits; each witness is a with probability rho and otherwise uniform over all 10
digits (so it can still equal a by chance). With n_d the number of witnesses equal to d,

    P(a = d | w, rho)  ∝  prod_j (rho 1[w_j = d] + (1 - rho) / 10)  ∝  (1 + kappa)^{n_d},

kappa = 10 rho / (1 - rho), i.e. the posterior is softmax_d(n_d log(1 + kappa)). Digits that no
witness names keep n_d = 0 and share the remaining mass.

    prompt     [BOS, rho_tok, w_1 .. w_m, SEP], LEFT-padded with PAD to 3 + max_witnesses
    completion [free tokens ..., ANS, digit, free tokens ..., CONF, conf_tok, EOS]

Data (`sample`, `bayes_summary`) is numpy on the host;
`parse` is jittable; `posterior`, `answer_posterior` and `confidence_token` return numpy for
numpy inputs (float64 stays exact) and jnp for jax inputs (jittable).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

PAD, BOS, EOS, SEP, ANS, CONF = 0, 1, 2, 3, 4, 5
NUM_DIGITS = 10
DIGIT0 = 6  # tokens 6..15 are the digits 0..9, for witnesses and answers alike
RHOS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
RHO0 = DIGIT0 + NUM_DIGITS  # tokens 16..22
CONF_VALUES = tuple(k / 20 for k in range(21))  # 0.00, 0.05, .., 1.00
CONF0 = RHO0 + len(RHOS)  # tokens 23..43
VOCAB_SIZE = CONF0 + len(CONF_VALUES)
COMPLETION_LEN = 5  # canonical completion [ANS, digit, CONF, conf_tok, EOS]

# Token -> value lookup tables; index with jnp.asarray(...) inside jit.
DIGIT_OF_TOKEN = np.full(VOCAB_SIZE, -1, np.int32)
DIGIT_OF_TOKEN[DIGIT0 : DIGIT0 + NUM_DIGITS] = np.arange(NUM_DIGITS)
RHO_OF_TOKEN = np.full(VOCAB_SIZE, np.nan, np.float32)
RHO_OF_TOKEN[RHO0 : RHO0 + len(RHOS)] = RHOS
CONF_OF_TOKEN = np.full(VOCAB_SIZE, np.nan, np.float32)  # NaN: not a confidence token
CONF_OF_TOKEN[CONF0:] = CONF_VALUES


@dataclasses.dataclass(frozen=True)
class Family:
    """A task distribution: m uniform in [min_witnesses, max_witnesses], rho uniform in rhos."""

    name: str
    min_witnesses: int
    max_witnesses: int
    rhos: tuple[float, ...]

    def __post_init__(self):
        object.__setattr__(self, "rhos", tuple(self.rhos))  # keep the dataclass hashable
        if not 1 <= self.min_witnesses <= self.max_witnesses:
            raise ValueError(f"need 1 <= min_witnesses <= max_witnesses, got {self}")
        if not self.rhos or any(r not in RHOS for r in self.rhos):
            raise ValueError(f"rhos must be a non-empty subset of {RHOS}, got {self.rhos}")

    @property
    def prompt_len(self) -> int:
        return 3 + self.max_witnesses  # BOS, rho token, witnesses, SEP


IN_DOMAIN = Family("in_domain", 1, 6, RHOS)
# More witnesses than training ever shows: a length shift with the same exact posterior.
OUT_OF_DOMAIN = Family("out_of_domain", 7, 10, RHOS)


def _xp(*arrays):
    """jnp if any input is a jax array (tracers included), else numpy (keeps float64 exact)."""
    return jnp if any(isinstance(a, jax.Array) for a in arrays) else np


def rho_token(rho):
    return RHO0 + RHOS.index(rho)


def confidence_token(q):
    """Nearest confidence token for q in [0, 1] (values outside clip to the end tokens)."""
    xp = _xp(q)
    k = xp.clip(xp.round(xp.asarray(q) * (len(CONF_VALUES) - 1)), 0, len(CONF_VALUES) - 1)
    return (CONF0 + k).astype(xp.int32)


def _witnesses(rng, answer_n, rho_n, width):
    """[n, width] witnesses: the answer with probability rho, else a uniform digit."""
    honest_nW = rng.random((answer_n.shape[0], width)) < rho_n[:, None]
    noise_nW = rng.integers(0, NUM_DIGITS, (answer_n.shape[0], width))
    return np.where(honest_nW, answer_n[:, None], noise_nW)


def _layout_prompt(rho_tok_n, witness_nW, m_n, prompt_len):
    """Left-padded [BOS, rho_tok, w_1 .. w_m, SEP] and its non-pad mask."""
    pad_n = prompt_len - (m_n + 3)
    r_nP = np.arange(prompt_len)[None, :] - pad_n[:, None]  # index within the real tokens
    w_idx_nP = np.clip(r_nP - 2, 0, witness_nW.shape[1] - 1)
    witness_tok_nP = DIGIT0 + np.take_along_axis(witness_nW, w_idx_nP, axis=1)
    prompt_nP = np.select(
        [r_nP < 0, r_nP == 0, r_nP == 1, r_nP == m_n[:, None] + 2],
        [PAD, BOS, rho_tok_n[:, None], SEP],
        witness_tok_nP,
    )
    return prompt_nP.astype(np.int32), r_nP >= 0


def sample(rng: np.random.Generator, n: int, family: Family) -> dict:
    """n examples of `family` as numpy arrays (see module docstring for the layout)."""
    return _build(_draw(rng, n, family), family)


def sample_each(rngs: list[np.random.Generator], family: Family) -> dict:
    """One example per generator, each drawing exactly what `sample(rng, 1, family)` draws,
    laid out in one vectorised call (`core.data.synthetic(examples_fn=)`)."""
    draws = [_draw(rng, 1, family) for rng in rngs]
    return _build({k: np.concatenate([d[k] for d in draws]) for k in draws[0]}, family)


def _draw(rng: np.random.Generator, n: int, family: Family) -> dict:
    W = family.max_witnesses
    answer_n = rng.integers(0, NUM_DIGITS, n)
    m_n = rng.integers(family.min_witnesses, W + 1, n)
    rho_idx_n = rng.integers(0, len(family.rhos), n)
    rho_n = np.asarray(family.rhos, np.float64)[rho_idx_n]
    witness_nW = _witnesses(rng, answer_n, rho_n, W)
    return {"answer": answer_n, "m": m_n, "rho_idx": rho_idx_n, "witness": witness_nW}


def _build(draws: dict, family: Family) -> dict:
    W = family.max_witnesses
    answer_n, m_n, rho_idx_n, witness_nW = (draws[k] for k in ("answer", "m", "rho_idx", "witness"))
    rho_n = np.asarray(family.rhos, np.float64)[rho_idx_n]
    used_nW = np.arange(W)[None, :] < m_n[:, None]
    counts_n10 = ((witness_nW[:, :, None] == np.arange(NUM_DIGITS)) & used_nW[:, :, None]).sum(1)
    rho_tok_n = np.asarray([rho_token(r) for r in family.rhos])[rho_idx_n]
    prompt_nP, mask_nP = _layout_prompt(rho_tok_n, witness_nW, m_n, family.prompt_len)
    return {
        "prompt": prompt_nP,
        "prompt_mask": mask_nP,
        "answer": answer_n.astype(np.int32),
        "counts": counts_n10.astype(np.int32),
        "rho": rho_n.astype(np.float32),
        "num_witnesses": m_n.astype(np.int32),
    }


def posterior(counts_B10, rho_B):
    """P(a = d | witnesses, rho) = softmax_d(n_d log(1 + kappa)), kappa = 10 rho / (1 - rho)."""
    xp = _xp(counts_B10, rho_B)
    rho_B = xp.asarray(rho_B)
    # log(1 + kappa) = log((1 + 9 rho) / (1 - rho)), written with log1p for small rho.
    log_odds_B = xp.log1p(9 * rho_B) - xp.log1p(-rho_B)
    logits_B10 = xp.asarray(counts_B10) * log_odds_B[:, None]
    if xp is jnp:
        return jax.nn.softmax(logits_B10, axis=-1)
    exp_B10 = np.exp(logits_B10 - logits_B10.max(-1, keepdims=True))
    return exp_B10 / exp_B10.sum(-1, keepdims=True)


def answer_posterior(counts_B10, rho_B, answer_B):
    """Posterior of the given answers: the ideal stated confidence. Non-digits (-1) give 0."""
    xp = _xp(counts_B10, rho_B, answer_B)
    answer_B = xp.asarray(answer_B)
    valid_B = (answer_B >= 0) & (answer_B < NUM_DIGITS)
    safe_B = xp.clip(answer_B, 0, NUM_DIGITS - 1)
    p_B = xp.take_along_axis(posterior(counts_B10, rho_B), safe_B[:, None], axis=1)[:, 0]
    return xp.where(valid_B, p_B, 0.0)


def bayes_summary(counts_B10, rho_B) -> dict:
    """Mean over examples of what the Bayes-optimal MAP answerer achieves (Python floats).

    accuracy: mean max posterior p*. brier: mean p*(1 - p*), the expected Brier of stating
    q = p* for the MAP answer. entropy: mean posterior entropy in nats.
    """
    post_B10 = posterior(np.asarray(counts_B10), np.asarray(rho_B, np.float64))
    p_star_B = post_B10.max(-1)
    entropy_B = -(post_B10 * np.log(np.maximum(post_B10, 1e-300))).sum(-1)
    return {
        "accuracy": float(p_star_B.mean()),
        "brier": float((p_star_B * (1 - p_star_B)).mean()),
        "entropy": float(entropy_B.mean()),
    }


def last_index(hit_BN):
    """Index of the last True per row, -1 if none."""
    return jnp.max(jnp.where(hit_BN, jnp.arange(hit_BN.shape[1]), -1), axis=1)


def _token_at(tokens_BN, idx_B):
    """tokens[b, idx_b], PAD where idx_b is out of range."""
    N = tokens_BN.shape[1]
    tok_B = jnp.take_along_axis(tokens_BN, jnp.clip(idx_B, 0, N - 1)[:, None], axis=1)[:, 0]
    return jnp.where((idx_B >= 0) & (idx_B < N), tok_B, PAD)


def parse(tokens_BN, mask_BN):
    """(format_ok_B, answer_B, q_B) from completions; jittable. See the module docstring.

    Mirrors the official regex with last-tag semantics: the last ANS before the first EOS is
    followed by a digit, the last CONF comes after it and is followed by a confidence token,
    and that token is the last one before EOS. Failure gives answer -1 and q 0.
    """
    tokens_BN = jnp.where(mask_BN, jnp.asarray(tokens_BN), PAD)  # unmasked tokens never count
    is_eos_BN = tokens_BN == EOS
    has_eos_B = is_eos_BN.any(1)
    eos_B = jnp.argmax(is_eos_BN, axis=1)  # first EOS
    before_eos_BN = jnp.arange(tokens_BN.shape[1])[None, :] < eos_B[:, None]
    ans_B = last_index(before_eos_BN & (tokens_BN == ANS))
    conf_B = last_index(before_eos_BN & (tokens_BN == CONF))
    digit_B = jnp.asarray(DIGIT_OF_TOKEN)[_token_at(tokens_BN, ans_B + 1)]
    q_B = jnp.asarray(CONF_OF_TOKEN)[_token_at(tokens_BN, conf_B + 1)]
    ok_B = (
        has_eos_B
        & (ans_B >= 0)
        & (digit_B >= 0)
        & (conf_B > ans_B)  # implied by the EOS check below; kept as the rule reads
        & ~jnp.isnan(q_B)
        & (conf_B + 2 == eos_B)  # nothing between the confidence token and EOS
    )
    return ok_B, jnp.where(ok_B, digit_B, -1), jnp.where(ok_B, q_B, 0.0)
