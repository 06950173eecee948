"""RLCR's GRPO rollout: the jitted sampler against a Python-loop decode; a step's time split.

    python -m launch.bench --methods=rlcr     # 64 prompts x group 16, 6 and 64 new tokens

One process, the RLCR task and model (`configs/rlcr.py:size=small`, float32, freshly initialised
params, in-domain noisy-witness prompts, temperature `grpo.temperature`), R = prompts x group
rows, each time the median of `repeats` calls after a warm-up (which also compiles):
  1. decode throughput (generated tokens/s, tokens counted up to and including eos, as the
     sampler's `lengths_B`) of
     (a) `core.nn.sampler.sample_jit`: prefill, then a `lax.while_loop` over new tokens, all in
         one compiled call;
     (b) `python_loop_decode` below: the same model and cache driven from a Python `for` loop,
         one jitted prefill, then one jitted call (forward of one token + categorical, the
         cache donated so it is updated in place) per new token, stopping once every row has
         emitted eos (a host sync per token): what one writes without putting the loop under
         jit;
     figure: (a) / (b) in tokens/s. Each new-token count N runs with eos_id=None (every row
     generates exactly N tokens, so the comparison is the decode loop and not eos timing; the
     cache and `max_len` sized P + N); N = `policy.MAX_NEW_TOKENS` also runs with the task's
     eos. With random params the policy rarely emits eos, so the two rows are close.
  2. one GRPO step split into (a) `core.grpo.rollout` jitted alone, (b) `core.grpo.update`
     jitted alone on a fixed scored rollout (the reference log-probs of the KL term, the
     gradient and the Adam update, as in training), and (c) the whole `grpo.make_step` jitted
     (rollout, reward, advantages, update in one call); figures: the rollout's fraction of
     (a) + (b), and (c) / ((a) + (b)).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

import configs.rlcr
import methods.rlcr
from core import grpo
from core.benchmark import Ratio, Result, median_seconds
from core.nn import sampler, transformer
from core.state import TrainState
from methods.rlcr import policy, witness

REWARD_WEIGHTS = (0.5, 0.5, 0.5)  # the RLCR arm: format, correct, brier


@dataclasses.dataclass(frozen=True)
class Setup:
    """The model, its params, the GRPO settings and one prompt batch (B prompts, numpy)."""

    cfg: transformer.TransformerConfig
    gcfg: grpo.GRPOConfig
    params: dict
    batch: dict


def setup(size: str = "small", prompts: int = 64, group: int = 16) -> Setup:
    config = configs.rlcr.get_config(f"size={size}")
    config.grpo.group_size = group
    cfg = policy.model_config(config.model, "float32")
    batch = witness.sample(np.random.default_rng(0), prompts, witness.IN_DOMAIN)
    batch = {k: batch[k] for k in ("prompt", "prompt_mask", "answer")}
    params = transformer.init_params(cfg, jax.random.key(0))
    return Setup(cfg, methods.rlcr.grpo_config(config), params, batch)


def group_prompts(s: Setup) -> tuple[jax.Array, jax.Array]:
    """prompt_RP, prompt_mask_RP: every prompt repeated `group_size` times, as rollout does."""
    return grpo.repeat_groups(
        (jnp.asarray(s.batch["prompt"]), jnp.asarray(s.batch["prompt_mask"])), s.gcfg.group_size
    )


# ------------------------------------------------------------------ 1. the Python-loop decode


def _choose(logits_BV, key, temperature: float):
    if temperature == 0:
        return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
    return jax.random.categorical(key, logits_BV / temperature, axis=-1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("cfg", "max_new_tokens", "temperature"))
def _prefill(cfg, params, prompt_BP, prompt_mask_BP, rng, *, max_new_tokens, temperature):
    """The first new token [B] and the filled cache, as `sampler.sample` starts."""
    B, P = prompt_BP.shape
    positions_BP = jnp.maximum(jnp.cumsum(prompt_mask_BP, axis=1, dtype=jnp.int32) - 1, 0)
    cache = transformer.init_cache(cfg, B, P + max_new_tokens - 1)
    logits_BPV, cache = transformer.apply(
        cfg, params, prompt_BP, positions_BT=positions_BP, key_mask_BT=prompt_mask_BP, cache=cache
    )
    return _choose(logits_BPV[:, -1], jax.random.fold_in(rng, 0), temperature), cache


# The cache is donated: without it each call would copy the whole cache to write one slot, a
# cost the while_loop (updating in place) does not have, and the comparison is about the loop.
@functools.partial(
    jax.jit, static_argnames=("cfg", "temperature", "eos_id"), donate_argnames=("cache",)
)
def _decode_step(
    cfg, params, tok_B, next_pos_B, done_B, cache, rng, i, *, temperature, eos_id, pad_id
):
    """New token i per row; rows already done get pad_id and stay out of the mask."""
    pos_B1 = (next_pos_B + i - 1)[:, None]  # token i-1 sits right after the prompt's last
    logits_B1V, cache = transformer.apply(
        cfg, params, tok_B[:, None], positions_BT=pos_B1, cache=cache
    )
    live_B = ~done_B
    new_B = jnp.where(
        live_B, _choose(logits_B1V[:, 0], jax.random.fold_in(rng, i), temperature), pad_id
    )
    if eos_id is not None:
        done_B = done_B | (live_B & (new_B == eos_id))
    return new_B, live_B, done_B, cache


def python_loop_decode(
    cfg,
    params,
    prompt_BP,
    prompt_mask_BP,
    *,
    rng,
    max_new_tokens,
    temperature,
    eos_id=None,
    pad_id=0,
):
    """(tokens_BN, mask_BN) like `sampler.sample`'s (same key per token, so the same draws), with
    the loop over new tokens in Python: a dispatch per token and, with an eos, a host sync."""
    prompt_mask_BP = jnp.asarray(prompt_mask_BP, bool)
    tok_B, cache = _prefill(
        cfg,
        params,
        prompt_BP,
        prompt_mask_BP,
        rng,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
    )
    B, N = tok_B.shape[0], max_new_tokens
    done_B = jnp.zeros((B,), bool) if eos_id is None else tok_B == eos_id
    next_pos_B = prompt_mask_BP.sum(axis=1, dtype=jnp.int32)
    tokens, live = [tok_B], [jnp.ones((B,), bool)]
    for i in range(1, N):
        # The check a host loop needs to stop early; it waits for the previous step.
        if eos_id is not None and bool(done_B.all()):
            break
        tok_B, live_B, done_B, cache = _decode_step(
            cfg,
            params,
            tok_B,
            next_pos_B,
            done_B,
            cache,
            rng,
            i,
            temperature=temperature,
            eos_id=eos_id,
            pad_id=pad_id,
        )
        tokens.append(tok_B)
        live.append(live_B)
    pad = N - len(tokens)  # an early stop leaves the tail as pad, as the sampler does
    tokens_BN = jnp.pad(jnp.stack(tokens, axis=1), ((0, 0), (0, pad)), constant_values=pad_id)
    mask_BN = jnp.pad(jnp.stack(live, axis=1), ((0, 0), (0, pad)))
    return jax.block_until_ready((tokens_BN, mask_BN))


def _decode_row(s: Setup, new_tokens: int, eos_id, repeats: int) -> dict:
    """Tokens/s of sample_jit and of the Python loop at one length, on the same R rows."""
    prompt_RP, prompt_mask_RP = group_prompts(s)
    cfg = dataclasses.replace(s.cfg, max_len=prompt_RP.shape[1] + new_tokens)
    kw = dict(
        rng=jax.random.key(1),
        max_new_tokens=new_tokens,
        temperature=s.gcfg.temperature,
        eos_id=eos_id,
        pad_id=s.gcfg.pad_id,
    )
    jit_fn = lambda: jax.block_until_ready(
        sampler.sample_jit(cfg, s.params, prompt_RP, prompt_mask_BP=prompt_mask_RP, **kw)
    )
    loop_fn = lambda: python_loop_decode(cfg, s.params, prompt_RP, prompt_mask_RP, **kw)
    jit_s, loop_s = median_seconds(jit_fn, repeats), median_seconds(loop_fn, repeats)
    jit_tokens = int(jit_fn().lengths_B.sum())
    loop_tokens = int(loop_fn()[1].sum())
    return {
        "new_tokens": new_tokens,
        "eos": "none" if eos_id is None else "EOS",
        "rows": int(prompt_RP.shape[0]),
        "jit_seconds": jit_s,
        "python_loop_seconds": loop_s,
        "jit_tokens": jit_tokens,
        "python_loop_tokens": loop_tokens,
        "jit_tokens_per_s": jit_tokens / jit_s,
        "python_loop_tokens_per_s": loop_tokens / loop_s,
        "jit_over_python_loop": (jit_tokens / jit_s) / (loop_tokens / loop_s),
    }


# ------------------------------------------------------------------ 2. the GRPO step's split


def _scored_rollout(s: Setup, reward_fn, rolled) -> grpo.Scored:
    """A rollout's tensors with its advantages and loss weights, as make_step scores them."""
    prompt_RP, prompt_mask_RP, out = rolled
    batch_R = grpo.repeat_groups(s.batch, s.gcfg.group_size)
    rewards_R, _ = reward_fn(batch_R, out.tokens_BN, out.mask_BN)
    adv_R, informative_R = grpo.group_advantages(rewards_R, s.gcfg.group_size)
    weight_RN = grpo.loss_weights(out, informative_R, s.gcfg)
    return grpo.Scored(prompt_RP, prompt_mask_RP, out.tokens_BN, out.mask_BN, adv_R, weight_RN)


def _measure_split(s: Setup, repeats: int = 5) -> dict:
    tx = optax.adam(1e-4)
    reward_fn = functools.partial(policy.token_rewards, weights=REWARD_WEIGHTS)
    rollout_jit = jax.jit(grpo.rollout, static_argnames=("policy", "gcfg"))
    rollout_fn = lambda: jax.block_until_ready(
        rollout_jit(
            s.cfg,
            s.params,
            s.batch["prompt"],
            s.batch["prompt_mask"],
            rng=jax.random.key(1),
            gcfg=s.gcfg,
        )
    )
    scored = _scored_rollout(s, reward_fn, rollout_fn())
    # make_step's own update (the KL's reference is the params themselves: same cost).
    update = jax.jit(functools.partial(grpo.update, s.cfg, tx, s.gcfg))
    opt_state = tx.init(s.params)
    update_fn = lambda: jax.block_until_ready(update(s.params, opt_state, scored, s.params))
    step = jax.jit(grpo.make_step(s.cfg, tx, reward_fn, s.gcfg))
    extra = {"reference": s.params}
    state = TrainState(jnp.int32(0), jax.random.PRNGKey(0), s.params, opt_state, extra)
    batch = jax.tree.map(jnp.asarray, s.batch)
    step_fn = lambda: jax.block_until_ready(step(state, batch, rng=jax.random.key(1)))
    rollout_s, update_s = median_seconds(rollout_fn, repeats), median_seconds(update_fn, repeats)
    step_s = median_seconds(step_fn, repeats)
    return {
        "rollout_seconds": rollout_s,
        "update_seconds": update_s,
        "step_seconds": step_s,
        "rollout_fraction": rollout_s / (rollout_s + update_s),
        "update_fraction": update_s / (rollout_s + update_s),
        "step_over_rollout_plus_update": step_s / (rollout_s + update_s),
    }


# ------------------------------------------------------------------ the figures


def measure(*, smoke: bool = False) -> Result:
    if smoke:
        s, new_tokens, repeats = setup("smoke", prompts=4, group=4), (3,), 1
    else:
        s, new_tokens, repeats = setup("small", prompts=64, group=16), (6, 64), 3
    decode = [_decode_row(s, n, None, repeats) for n in new_tokens]
    # The real task: the configured length and the task's eos.
    decode.append(_decode_row(s, s.gcfg.max_new_tokens, s.gcfg.eos_id, repeats))
    split = _measure_split(s, repeats)
    rows = f"{decode[0]['rows']} rows"
    ratios = [
        Ratio(
            f"decode {r['new_tokens']} new tokens, "
            f"{'no eos' if r['eos'] == 'none' else 'the task eos'}, {rows}",
            "sample_jit",
            r["jit_tokens_per_s"],
            "Python-loop decode",
            r["python_loop_tokens_per_s"],
            "tokens/s",
        )
        for r in decode
    ]
    both = split["rollout_seconds"] + split["update_seconds"]
    ratios += [
        Ratio(
            f"GRPO step, {rows}", "rollout", split["rollout_seconds"], "rollout + update", both, "s"
        ),
        Ratio(
            f"GRPO step, {rows}",
            "make_step (one jit)",
            split["step_seconds"],
            "rollout + update (jitted apart)",
            both,
            "s",
        ),
    ]
    details = {
        "setup": {
            "prompts": len(s.batch["prompt"]),
            "group": s.gcfg.group_size,
            "prompt_len": int(s.batch["prompt"].shape[1]),
            "temperature": s.gcfg.temperature,
            "model": dataclasses.asdict(s.cfg),
            "num_params": transformer.num_params(s.params),
            "repeats": repeats,
        },
        "decode": decode,
        "grpo_step": split,
    }
    return Result(ratios, details)
