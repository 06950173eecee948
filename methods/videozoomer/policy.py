"""The VideoZoomer policy on SyntheticZoom: model, reward, cold-start loss, all jittable.

    cfg = model_config(config.model, dtype)
    rewards_R, metrics = reward(batch_R, tokens_RN, mask_RN, info=state, weights=(.9, .1, .1))
    loss, metrics = sft_loss(cfg, params, batch)   # batch["script"]: the oracle's turns

The policy is the core decoder LM over the whole transcript: the question and the glance, then
its turns and the environment's replies (`core.multiturn`, `env.LAYOUT`). A frame is one token
embedded as its content's embedding plus its time's (`policy_of`: our plan's "frame embedding
plus a time embedding"), the same time embeddings the policy's zoom arguments use; the shared
decoder reads frames as it reads text (symbolic frames: the VLM's image path would encode
sprites, which this task does not have).
"""

import functools

import jax.numpy as jnp

from core import grpo, multiturn
from core.nn import transformer
from core.nn.policy import Policy
from methods.videozoomer import env
from methods.videozoomer import video as v

MAX_LEN = v.PROMPT_LEN + env.LAYOUT.length


def model_config(model, dtype: str) -> transformer.TransformerConfig:
    return transformer.TransformerConfig(
        vocab_size=v.VOCAB_SIZE,
        num_layers=model.num_layers,
        d_model=model.d_model,
        num_heads=model.num_heads,
        d_ff=model.d_ff,
        max_len=MAX_LEN,
        dtype=dtype,
    )


def frame_embed(cfg, params, tokens_BT):
    """Token embeddings; a frame token's is its content token's plus its time token's."""
    is_frame, content, time = v.frame_parts(tokens_BT)
    base_BTD = transformer.embed(cfg, params, jnp.where(is_frame, content, tokens_BT))
    time_BTD = transformer.embed(cfg, params, time)
    return base_BTD + jnp.where(is_frame[..., None], time_BTD, 0)


@functools.lru_cache(maxsize=16)
def policy_of(cfg: transformer.TransformerConfig) -> Policy:
    """The core LM as a `Policy` reading frames as content + time (one object per cfg, so jit
    caches hit). The frame tokens' own embedding rows are never read; the head scores them too,
    and training teaches it never to emit one."""

    def embed(params, tokens_BT):
        return frame_embed(cfg, params, tokens_BT)

    def apply(params, tokens_BT=None, *, embeddings_BTD=None, **kw):
        if embeddings_BTD is None:
            embeddings_BTD = embed(params, tokens_BT)
        return transformer.apply(cfg, params, embeddings_BTD=embeddings_BTD, **kw)

    return Policy(
        apply=apply, init_cache=functools.partial(transformer.init_cache, cfg), embed=embed
    )


def outcome(batch_R, state: env.State):
    """(correct_R, well_formed_R): a well-formed answer equal to the gold one; every turn well
    formed and a well-formed answer at the end (the paper's format term)."""
    correct_R = state.answered_R & (state.answer_R == batch_R["answer"])
    return correct_R, state.format_ok_R & state.answered_R


def reward(batch_R, tokens_RN, mask_RN, *, info: env.State, weights):
    """w_acc 1[correct] + w_fmt 1[format] + bonus 1[correct] 1[zooms >= 1], and metrics."""
    del tokens_RN, mask_RN  # everything is in the environment's state
    w_acc, w_fmt, bonus = weights
    correct_R, formed_R = outcome(batch_R, info)
    zoomed_R = info.zooms_R >= 1
    f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
    reward_R = w_acc * f32(correct_R) + w_fmt * f32(formed_R) + bonus * f32(correct_R & zoomed_R)
    metrics = {
        "sample_accuracy": f32(correct_R).mean(),
        "sample_format": f32(formed_R).mean(),
        "sample_zooms": f32(info.zooms_R).mean(),
        "sample_frames": f32(info.frames_R).mean(),
    }
    return reward_R, metrics


def sft_loss(cfg, params, batch, *, rng=None, extra=None):
    """Mean negative log-likelihood of the policy's tokens in the scripted transcripts; the
    environment's tokens are read, not trained on (as LLaMA-Factory masks non-assistant turns)."""
    del rng, extra
    out = multiturn.scripted(env.ENV, env.init(batch), batch["script"], env.LAYOUT, pad_id=v.PAD)
    logp_RN = grpo.token_logprobs(
        policy_of(cfg),
        params,
        batch["prompt"],
        batch["prompt_mask"],
        out.tokens_RN,
        out.mask_RN,
        temperature=1.0,
    )
    weight_RN = out.policy_mask_RN.astype(jnp.float32)
    count = jnp.maximum(weight_RN.sum(), 1.0)
    return -(logp_RN * weight_RN).sum() / count, {"sft_tokens": count}
