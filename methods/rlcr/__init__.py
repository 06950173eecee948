"""RLCR (paper 1): GRPO with a Brier-score term, so that verbalized confidence becomes calibrated.

    python -m launch.train --config=configs/rlcr.py:arm=rlcr --workdir=/tmp/rlcr
    python -m launch.reproduce --methods=rlcr

- `witness.py`: the noisy-witness task (exact posterior), its vocabulary and token parsing.
- `rewards.py`: RLVR / RLCR rewards on parsed quantities; `policy.py`: the same from token ids,
  the model config and the format warm-start loss.
- `calibration.py`: accuracy, ECE, Brier, AUROC, reliability bins.
- `evaluation.py`: greedy answers and confidences, the post-hoc probe, voting.
- `experiment.py`: RLVR vs RLCR over seeds, in and out of domain.

`make(config)` returns a `core.Method` whose step is the warm start for `warm_start.steps`
steps, then `core.grpo`: `core.steps.switch` on the step count, each branch with its own
optimiser (`tx = {"warm": ..., "rl": ...}`).
"""

import functools

import numpy as np
import optax

from core import data, grpo, optim
from core.errors import ConfigError
from core.method import Evaluator, Method
from core.nn import transformer
from core.precision import compute_dtype
from core.steps import by_step, gradient_step, switch
from methods.rlcr import evaluation, policy, witness

EVAL_SEED_OFFSET = 1_000_003  # evaluation questions come from a stream training never draws


def grpo_config(config) -> grpo.GRPOConfig:
    return grpo.GRPOConfig(
        **config.grpo.to_dict(),
        max_new_tokens=policy.MAX_NEW_TOKENS,
        eos_id=witness.EOS,
        pad_id=witness.PAD,
    )


def reward_weights(config) -> tuple[float, float, float]:
    r = config.rewards
    weights = (r.w_format, r.w_correct, r.w_brier)
    if any(not isinstance(w, int | float) or w < 0 for w in weights):
        raise ConfigError(f"rewards weights must be numbers >= 0, got {r.to_dict()}")
    return tuple(float(w) for w in weights)


def examples(rngs: list[np.random.Generator], family=witness.IN_DOMAIN) -> dict[str, np.ndarray]:
    """One question per generator: prompt, its mask, the hidden answer (what the reward reads)."""
    batch = witness.sample_each(rngs, family)
    return {k: batch[k] for k in ("prompt", "prompt_mask", "answer")}


def eval_data(family, num_examples: int, seed: int) -> dict[str, np.ndarray]:
    return witness.sample(np.random.default_rng([seed, EVAL_SEED_OFFSET]), num_examples, family)


def make(config) -> Method:
    cfg = policy.model_config(config.model, compute_dtype(config.dtype))
    gcfg = grpo_config(config)
    warm_steps = config.warm_start.steps
    if not isinstance(warm_steps, int) or not 0 <= warm_steps <= config.train.steps:
        raise ConfigError(
            f"warm_start.steps={warm_steps!r} must be an int in [0, train.steps="
            f"{config.train.steps}]"
        )
    warm_tx = optax.adam(config.warm_start.lr)
    rl_tx = optim.make(config.optim, max(config.train.steps - warm_steps, 1))
    reward_fn = functools.partial(policy.token_rewards, weights=reward_weights(config))
    answers = config.warm_start.answers
    if answers not in policy.WARM_START_ANSWERS:
        raise ConfigError(
            f"warm_start.answers={answers!r} is unknown; expected one of: "
            + ", ".join(policy.WARM_START_ANSWERS)
        )
    warm_loss = functools.partial(policy.warm_start_loss, cfg, answers=answers)
    warm_step = gradient_step(warm_loss, warm_tx)
    rl_step = grpo.make_step(transformer.policy(cfg), rl_tx, reward_fn, gcfg)
    if gcfg.kl_beta > 0:
        rl_step = grpo.with_reference_from(warm_steps, rl_step)

    def init(rng, batch_spec):
        del batch_spec
        params = transformer.init_params(cfg, rng)
        return {"params": params, **({"reference": params} if gcfg.kl_beta > 0 else {})}

    def dataset(split, *, shard, seed):
        offset = 0 if split == "train" else EVAL_SEED_OFFSET
        return data.synthetic(
            examples_fn=examples,
            global_batch=config.train.batch_size,
            seed=seed + offset,
            shard=shard,
        )

    def evaluate(state, *, seed, family):
        outcome = evaluation.answer(
            cfg, state.params, eval_data(family, config.eval.num_examples, seed)
        )
        scores = evaluation.summary(outcome["q"], outcome["correct"])
        return scores | {"format": float(outcome["format_ok"].mean())}

    return Method(
        init=init,
        step=switch([warm_step, rl_step], by_step([warm_steps]), opt_keys=("warm", "rl")),
        tx={"warm": warm_tx, "rl": rl_tx},
        dataset=dataset,
        # One stream per task family: eval/in_domain/<metric>, eval/out_of_domain/<metric>.
        evaluators=tuple(
            Evaluator(f.name, evaluate=functools.partial(evaluate, family=f))
            for f in (witness.IN_DOMAIN, witness.OUT_OF_DOMAIN)
        ),
        sharding_rules=transformer.SHARDING_RULES,
    )
