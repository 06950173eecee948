"""Per-sample rewards for RLVR and RLCR, on already-parsed quantities.

Every function takes `format_ok_B` (bool: the completion has the expected tags and a confidence
that parses into [0, 1]), `correct_B` (bool: the answer matches the reference) and, where used,
`q_B` (float confidence in [0, 1]). Parsing token ids into these is a separate, later step.

As in the official code (`reward_fns.py`), a format failure zeroes every term, and the Brier term
is shifted by +1 (1 - (q - c)^2) so that a format failure scores below every valid Brier value.
Defaults are the official weights 0.5 / 0.5 / 0.5.
"""

import jax.numpy as jnp


def rlvr_reward(format_ok_B, correct_B, *, w_format=0.5, w_correct=0.5):
    """Binary baseline: w_format * fmt + w_correct * acc, with acc = 0 when the format fails."""
    fmt_B = format_ok_B.astype(jnp.float32)
    acc_B = fmt_B * correct_B.astype(jnp.float32)
    return w_format * fmt_B + w_correct * acc_B


def brier_B(q_B, correct_B):
    """Per-sample Brier score (q - c)^2; lower is better."""
    return (q_B - correct_B.astype(q_B.dtype)) ** 2


def rlcr_reward(format_ok_B, correct_B, q_B, *, w_format=0.5, w_correct=0.5, w_brier=0.5):
    """RLVR plus w_brier * (1 - (q - c)^2), the Brier term zeroed on format failure.

    Proper (maximised in expectation at q = P(correct)) for any w_brier > 0, and still rewards
    being correct whenever w_brier <= w_correct (the paper's Theorem 1).
    """
    fmt_B = format_ok_B.astype(jnp.float32)
    score_B = fmt_B * (1.0 - brier_B(q_B, correct_B))
    return rlvr_reward(format_ok_B, correct_B, w_format=w_format, w_correct=w_correct) + (
        w_brier * score_B
    )


def log_score_reward(
    format_ok_B, correct_B, q_B, *, w_format=0.5, w_correct=0.5, w_log=0.5, eps=1e-6
):
    """RLVR plus w_log * log-score (log q if correct else log(1 - q)); for the pitfall test only.

    Proper in q, but unbounded below: an honest attempt with small P(correct) loses more than
    the correctness term gives, so answering deliberately wrong with q = 0 scores higher. `eps`
    clips q so the score stays finite.
    """
    fmt_B = format_ok_B.astype(jnp.float32)
    q_B = jnp.clip(q_B, eps, 1.0 - eps)
    log_score_B = jnp.where(correct_B, jnp.log(q_B), jnp.log1p(-q_B))
    return rlvr_reward(format_ok_B, correct_B, w_format=w_format, w_correct=w_correct) + (
        w_log * fmt_B * log_score_B
    )
