"""VideoZoomer's multi-turn rollout: one jitted while_loop against a Python loop over turns; a GRPO
step's rollout / update split.

    python -m launch.bench --methods=videozoomer     # 16 videos x group 8, 5 rounds

One process, the VideoZoomer model (`configs/videozoomer.py:size=small`, float32) after a short
cold start (`COLD_START_STEPS` SFT steps, so that turns end, zooms run and episodes finish at
different rounds, as in training), held-out SyntheticZoom videos, temperature 1; R = videos x
group rows; each time the median of `repeats` calls after a warm-up (which also compiles):
  1. rollout throughput, tokens/s (every transcript token, the policy's and the environment's,
     `mask_RN.sum()`) of
     (a) `core.multiturn.rollout` jitted: prefill, then one `lax.while_loop` over rounds, all in
         one compiled call;
     (b) the same pieces (`core.multiturn.player`) driven from a Python loop over turns: one
         jitted prefill, one jitted call per round (the policy's turn and the environment's
         reply, the cache donated), a host check whether any episode goes on after each (a sync
         per turn), one jitted finish;
     figure: (a) / (b). Both draw the same tokens (same keys per round), checked.
  2. one GRPO step split into (a) the multi-turn rollout_fn jitted alone, (b) `core.grpo.update`
     jitted alone on its scored rollout (the KL's reference forward, the gradient, the Adam
     update), and (c) the whole `grpo.make_step` jitted; figures: the rollout's fraction of
     (a) + (b), and (c) / ((a) + (b)).
"""

import dataclasses
import functools
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import optax

import configs.videozoomer
import methods.videozoomer as vz
from core import grpo, multiturn, train
from core.benchmark import Ratio, Result, median_seconds
from core.nn import transformer
from core.state import TrainState
from methods.videozoomer import env, evaluation, policy

COLD_START_STEPS = 100
REWARD_WEIGHTS = (0.9, 0.1, 0.1)


@dataclasses.dataclass(frozen=True)
class Setup:
    cfg: transformer.TransformerConfig
    gcfg: grpo.GRPOConfig
    params: dict
    batch: dict  # one batch of videos (numpy), not repeated


def setup(size: str, videos: int, group: int, cold_start: int, workdir: str) -> Setup:
    config = configs.videozoomer.get_config(f"size={size},arm=sft_only")
    config.grpo.group_size = group
    config.sft.steps = config.train.steps = cold_start
    config.train.batch_size = videos
    config.train.log_every, config.train.checkpoint_every = cold_start, 0
    config.train.eval_every = -1
    config.dtype = "float32"
    params = train.run(config, vz.make(config), workdir, devices=jax.devices()[:1]).state.params
    cfg = policy.model_config(config.model, "float32")
    batch = evaluation.held_out(-(-videos // 3), seed=0)
    batch = {k: x[:videos] for k, x in batch.items()}
    return Setup(cfg, vz.grpo_config(config), params, batch)


def _repeated(s: Setup):
    return jax.tree.map(jnp.asarray, grpo.repeat_groups(s.batch, s.gcfg.group_size))


def _rollouts(s: Setup):
    """(jitted rollout, Python-loop rollout): each () -> Transcript on the same rows and keys."""
    batch_R = _repeated(s)
    args = (s.params, batch_R["prompt"], batch_R["prompt_mask"])
    state = env.init(batch_R)
    kw = dict(temperature=s.gcfg.temperature, pad_id=s.gcfg.pad_id)
    pol = policy.policy_of(s.cfg)
    rng = jax.random.key(1)
    whole = jax.jit(functools.partial(multiturn.rollout, pol, env=env.ENV, layout=env.LAYOUT, **kw))
    p = multiturn.player(pol, env.ENV, env.LAYOUT, **kw)
    start, finish = jax.jit(p.start), jax.jit(p.finish)
    play_round = jax.jit(p.play_round, donate_argnums=2)
    running = jax.jit(p.running)

    def by_turn():
        carry = start(*args, state)
        while bool(running(carry)):  # the host waits for each turn
            carry = play_round(s.params, rng, carry)
        return jax.block_until_ready(finish(carry))

    return (lambda: jax.block_until_ready(whole(*args, env_state=state, rng=rng))), by_turn


def _measure_rollout(s: Setup, repeats: int) -> dict:
    whole, by_turn = _rollouts(s)
    a, b = whole(), by_turn()
    for name in ("tokens_RN", "mask_RN", "policy_mask_RN"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    tokens = int(a.mask_RN.sum())
    jit_s, loop_s = median_seconds(whole, repeats), median_seconds(by_turn, repeats)
    return {
        "rows": int(a.tokens_RN.shape[0]),
        "tokens": tokens,
        "policy_tokens": int(a.policy_mask_RN.sum()),
        "mean_rounds": float(a.rounds_R.mean()),
        "jit_seconds": jit_s,
        "python_loop_seconds": loop_s,
        "jit_tokens_per_s": tokens / jit_s,
        "python_loop_tokens_per_s": tokens / loop_s,
        "jit_over_python_loop": loop_s / jit_s,
    }


def _measure_split(s: Setup, repeats: int) -> dict:
    tx = optax.adam(1e-4)
    reward_fn = functools.partial(policy.reward, weights=REWARD_WEIGHTS)
    rollout_fn = multiturn.grpo_rollout(env.init, env.ENV, env.LAYOUT)
    batch = jax.tree.map(jnp.asarray, s.batch)
    pol = policy.policy_of(s.cfg)
    rollout = jax.jit(lambda p, b, rng: rollout_fn(pol, p, b, rng=rng, gcfg=s.gcfg))
    rollout_call = lambda: jax.block_until_ready(rollout(s.params, batch, jax.random.key(1)))
    rolled = rollout_call()
    rewards_R, _ = reward_fn(_repeated(s), rolled.tokens_RN, rolled.mask_RN, info=rolled.info)
    adv_R, informative_R = grpo.group_advantages(rewards_R, s.gcfg.group_size)
    weight_RN = grpo.policy_weights(rolled.policy_mask_RN, rolled.done_R, informative_R, s.gcfg)
    scored = grpo.Scored(rolled.prompt_RP, rolled.prompt_mask_RP, rolled.tokens_RN,
                         rolled.mask_RN, adv_R, weight_RN)  # fmt: skip
    update = jax.jit(functools.partial(grpo.update, pol, tx, s.gcfg))
    opt_state = tx.init(s.params)
    update_call = lambda: jax.block_until_ready(update(s.params, opt_state, scored, s.params))
    step = jax.jit(grpo.make_step(pol, tx, reward_fn, s.gcfg, rollout_fn=rollout_fn))
    state = TrainState(jnp.int32(0), jax.random.key(0), s.params, opt_state,
                       {"reference": s.params})  # fmt: skip
    step_call = lambda: jax.block_until_ready(step(state, batch, rng=jax.random.key(1)))
    rollout_s, update_s = (
        median_seconds(rollout_call, repeats),
        median_seconds(update_call, repeats),
    )
    step_s = median_seconds(step_call, repeats)
    return {
        "rollout_seconds": rollout_s,
        "update_seconds": update_s,
        "step_seconds": step_s,
        "rollout_fraction": rollout_s / (rollout_s + update_s),
        "update_fraction": update_s / (rollout_s + update_s),
        "step_over_rollout_plus_update": step_s / (rollout_s + update_s),
    }


def measure(*, smoke: bool = False) -> Result:
    with tempfile.TemporaryDirectory() as tmp:  # the cold start's workdir
        if smoke:
            s, repeats = setup("smoke", videos=2, group=2, cold_start=2, workdir=tmp), 1
        else:
            s, repeats = setup("small", 16, 8, COLD_START_STEPS, workdir=tmp), 3
    rollout = _measure_rollout(s, repeats)
    split = _measure_split(s, repeats)
    rows = f"{rollout['rows']} rows"
    both = split["rollout_seconds"] + split["update_seconds"]
    ratios = [
        Ratio(f"multi-turn rollout, {rows}, {env.MAX_ROUNDS} rounds max", "jitted while_loop",
              rollout["jit_tokens_per_s"], "Python loop over turns",
              rollout["python_loop_tokens_per_s"], "tokens/s"),
        Ratio(f"GRPO step, {rows}", "rollout", split["rollout_seconds"], "rollout + update",
              both, "s"),
        Ratio(f"GRPO step, {rows}", "make_step (one jit)", split["step_seconds"],
              "rollout + update (jitted apart)", both, "s"),
    ]  # fmt: skip
    details = {
        "setup": {
            "videos": len(s.batch["answer"]),
            "group": s.gcfg.group_size,
            "cold_start_steps": 2 if smoke else COLD_START_STEPS,
            "transcript_slots": env.LAYOUT.length,
            "model": dataclasses.asdict(s.cfg),
            "num_params": transformer.num_params(s.params),
            "repeats": repeats,
        },
        "rollout": rollout,
        "grpo_step": split,
    }
    return Result(ratios, details)
