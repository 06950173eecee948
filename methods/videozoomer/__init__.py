"""VideoZoomer (paper 4): a glance-then-zoom agent, cold-start SFT then multi-turn GRPO.

    python -m launch.train --config=configs/videozoomer.py:arm=full --workdir=/tmp/vz
    python -m launch.reproduce --methods=videozoomer

- `video.py`: SyntheticZoom videos, questions, the glance, the vocabulary.
- `env.py`: the zoom tool as a pure environment (`core.multiturn.Environment`).
- `oracle.py`: the cold-start scripts (oracle, reflection) and the perfect uniform reader.
- `policy.py`: the model config, the reward, the cold-start loss.
- `evaluation.py`: greedy episodes on held-out videos and their numbers.
- `experiment.py`: the arms and claims (`launch.reproduce`).

`make(config)` returns a `core.Method` whose step is the cold start for `sft.steps` steps, then
`core.grpo` with the multi-turn rollout (`core.multiturn.grpo_rollout`): `core.steps.switch` on
the step count, each stage with its own optimiser (`tx = {"sft": ..., "rl": ...}`).
"""

import functools

import numpy as np
import optax

from core import data, grpo, multiturn, optim
from core.errors import ConfigError
from core.method import Method
from core.nn import transformer
from core.precision import compute_dtype
from core.steps import by_step, gradient_step, switch
from methods.videozoomer import env, evaluation, oracle, policy
from methods.videozoomer import video as v


def grpo_config(config) -> grpo.GRPOConfig:
    return grpo.GRPOConfig(**config.grpo.to_dict(), max_new_tokens=env.LAYOUT.length, pad_id=v.PAD)


def reward_weights(config) -> tuple[float, float, float]:
    r = config.rewards
    weights = (r.accuracy, r.format, r.tool_bonus)
    if any(isinstance(w, bool) or not isinstance(w, int | float) or w < 0 for w in weights):
        raise ConfigError(f"videozoomer rewards must be numbers >= 0, got {r.to_dict()}")
    return tuple(float(w) for w in weights)


def examples(rngs, *, reflection: float) -> dict[str, np.ndarray]:
    """Videos with their cold-start scripts: reflection trajectories with probability
    `reflection` (drawn from each video's own generator, after its video)."""
    batch = v.examples(rngs)
    batch["script"] = oracle.scripts(batch, np.array([r.random() < reflection for r in rngs]))
    return batch


def make(config) -> Method:
    cfg = policy.model_config(config.model, compute_dtype(config.dtype))
    gcfg = grpo_config(config)
    sft = config.sft
    if isinstance(sft.steps, bool) or not isinstance(sft.steps, int):
        raise ConfigError(f"sft.steps={sft.steps!r} must be an int")
    if not 0 <= sft.steps <= config.train.steps:
        raise ConfigError(f"sft.steps={sft.steps} must be in [0, train.steps={config.train.steps}]")
    if not 0.0 <= sft.reflection <= 1.0:
        raise ConfigError(f"sft.reflection={sft.reflection!r} must be a fraction in [0, 1]")
    sft_tx = optax.adam(sft.lr)
    rl_tx = optim.make(config.optim, max(config.train.steps - sft.steps, 1))
    reward_fn = functools.partial(policy.reward, weights=reward_weights(config))
    rollout_fn = multiturn.grpo_rollout(env.init, env.ENV, env.LAYOUT)
    rl_step = grpo.make_step(policy.policy_of(cfg), rl_tx, reward_fn, gcfg, rollout_fn=rollout_fn)
    if gcfg.kl_beta > 0:
        rl_step = grpo.with_reference_from(sft.steps, rl_step)
    sft_step = gradient_step(functools.partial(policy.sft_loss, cfg), sft_tx)

    def init(rng, batch_spec):
        del batch_spec
        params = transformer.init_params(cfg, rng)
        return {"params": params, **({"reference": params} if gcfg.kl_beta > 0 else {})}

    def dataset(split, *, shard, seed):
        del split  # evaluation reads its own held-out videos (`evaluate`)
        return data.synthetic(
            examples_fn=functools.partial(examples, reflection=sft.reflection),
            global_batch=config.train.batch_size,
            seed=seed,
            shard=shard,
        )

    def evaluate(state, *, seed):
        batch = evaluation.held_out(config.eval.num_examples // len(v.KINDS), seed)
        return evaluation.summary(batch, evaluation.play(cfg, state.params, batch))

    return Method(
        init=init,
        step=switch([sft_step, rl_step], by_step([sft.steps]), opt_keys=("sft", "rl")),
        tx={"sft": sft_tx, "rl": rl_tx},
        dataset=dataset,
        evaluate=evaluate,
        sharding_rules=transformer.SHARDING_RULES,
    )
