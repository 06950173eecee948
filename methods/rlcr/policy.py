"""The RLCR policy on the noisy-witness task: model, rewards from token ids, format warm start.

    cfg = model_config(config.model, dtype)
    rewards_R, metrics = token_rewards(batch_R, tokens_RN, mask_RN, weights=(0.5, 0.5, 0.5))

Everything here is jittable: the reward reads the answer and the confidence from token ids
(`witness.parse`), so rollout, reward and update run in one compiled step.
"""

import jax
import jax.numpy as jnp

from core import grpo
from core.nn import transformer
from methods.rlcr import calibration, rewards, witness

# Canonical completion [ANS, digit, CONF, conf_tok, EOS] plus one slot, so a policy that fails
# to stop is seen as a truncated (format-failing) completion rather than cut at its eos.
MAX_NEW_TOKENS = witness.COMPLETION_LEN + 1


def model_config(model, dtype: str) -> transformer.TransformerConfig:
    return transformer.TransformerConfig(
        vocab_size=witness.VOCAB_SIZE,
        num_layers=model.num_layers,
        d_model=model.d_model,
        num_heads=model.num_heads,
        d_ff=model.d_ff,
        max_len=witness.OUT_OF_DOMAIN.prompt_len + MAX_NEW_TOKENS,
        dtype=dtype,
    )


def token_rewards(batch_R, tokens_RN, mask_RN, *, weights):
    """RLCR reward of each completion; `weights = (format, correct, brier)`, brier 0 = RLVR.

    Also returns the rollout's format rate, accuracy, Brier score and mean stated confidence
    (over well-formed completions) as metrics.
    """
    w_format, w_correct, w_brier = weights
    format_ok_R, answer_R, q_R = witness.parse(tokens_RN, mask_RN)
    correct_R = format_ok_R & (answer_R == batch_R["answer"])
    reward_R = rewards.rlcr_reward(
        format_ok_R, correct_R, q_R, w_format=w_format, w_correct=w_correct, w_brier=w_brier
    )
    ok_R = format_ok_R.astype(jnp.float32)
    n_ok = jnp.maximum(ok_R.sum(), 1.0)
    metrics = {
        "format_rate": ok_R.mean(),
        "sample_accuracy": calibration.accuracy(correct_R),
        "sample_brier": (ok_R * rewards.brier_B(q_R, correct_R)).sum() / n_ok,
        "sample_confidence": (ok_R * q_R).sum() / n_ok,
    }
    return reward_R, metrics


WARM_START_ANSWERS = ("witness", "random")


def random_completions(rng, prompt_BP, prompt_mask_BP, answers: str = "witness"):
    """Canonical completions [B, 5] (jnp) with a uniform confidence and a random answer digit.

    answers="witness": the digit of a uniformly chosen witness of the prompt, i.e. answer with a
    span of the context, as an extractive QA model does; nothing about which witness to trust.
    answers="random": a uniform digit, no relation to the prompt at all.
    """
    digit_rng, conf_rng = jax.random.split(rng)
    B = prompt_BP.shape[0]
    if answers == "witness":
        is_witness_BP = prompt_mask_BP & (prompt_BP >= witness.DIGIT0)
        is_witness_BP &= prompt_BP < witness.DIGIT0 + witness.NUM_DIGITS
        pick_B = jax.random.categorical(digit_rng, jnp.where(is_witness_BP, 0.0, -jnp.inf))
        digit_B = jnp.take_along_axis(prompt_BP, pick_B[:, None], axis=1)[:, 0]
    elif answers == "random":
        digit_B = witness.DIGIT0 + jax.random.randint(digit_rng, (B,), 0, witness.NUM_DIGITS)
    else:
        raise ValueError(f"answers={answers!r} is unknown; expected one of {WARM_START_ANSWERS}")
    conf_B = witness.CONF0 + jax.random.randint(conf_rng, (B,), 0, len(witness.CONF_VALUES))
    fixed = lambda tok: jnp.full((B,), tok, jnp.int32)  # noqa: E731
    return jnp.stack(
        [fixed(witness.ANS), digit_B, fixed(witness.CONF), conf_B, fixed(witness.EOS)], axis=1
    ).astype(jnp.int32)


def warm_start_loss(cfg, params, batch, *, rng, extra=None, answers: str = "witness"):
    """Mean NLL of a random canonical completion after each prompt (`random_completions`).

    It teaches the format: the confidence is uniform and independent of everything, so the
    warm-started policy states uninformative confidences; its answer is a random witness (or a
    random digit), so which answer is right has to be learned from the reward.
    """
    del extra
    prompt_BP, prompt_mask_BP = batch["prompt"], batch["prompt_mask"]
    completion_BN = random_completions(rng, prompt_BP, prompt_mask_BP, answers)
    logp_BN = grpo.token_logprobs(
        transformer.policy(cfg),
        params,
        prompt_BP,
        prompt_mask_BP,
        completion_BN,
        jnp.ones(completion_BN.shape, bool),
        temperature=1.0,
    )
    format_BN = (completion_BN == witness.ANS) | (completion_BN == witness.CONF)
    format_BN |= completion_BN == witness.EOS
    # How surely the fixed tokens (ANS, CONF, EOS) are produced: the format being learned.
    format_prob = (jnp.exp(logp_BN) * format_BN).sum() / format_BN.sum()
    num_tokens = jnp.float32(completion_BN.size)  # the trained tokens, as GRPO counts them
    return -logp_BN.mean(), {"format_token_prob": format_prob, "num_tokens": num_tokens}
