"""VideoZoomer (paper 4): a glance-then-zoom agent on SyntheticZoom, cold-start SFT then GRPO.

    python -m launch.train --config=configs/videozoomer.py:arm=full --workdir=/tmp/vz

Options: mesh (a preset in configs/common.py), size (smoke | small), arm:
  full           SFT on oracle + reflection trajectories, then GRPO with the tool bonus
  sft_only       the SFT stage alone
  no_cold_start  GRPO from the random init
  no_reflection  SFT on oracle trajectories only, then GRPO
  no_bonus       as full, without the correct-conditional tool bonus
One run is `sft.steps` supervised steps (`train.batch_size` videos each), then GRPO for the
remaining `train.steps` (`train.batch_size` videos, each rolled out `grpo.group_size` times).
"""

from ml_collections import ConfigDict

from configs.common import base_config, choose, parse_arg
from core.declarations import Declarations

# sft steps (None: the size's), reflection fraction of the SFT data, RL steps (None: the
# size's), tool bonus beta
ARMS = {
    "full": dict(sft=None, reflection=0.5, rl=None, bonus=0.1),
    "sft_only": dict(sft=None, reflection=0.5, rl=0, bonus=0.1),
    "no_cold_start": dict(sft=0, reflection=0.5, rl=None, bonus=0.1),
    "no_reflection": dict(sft=None, reflection=0.0, rl=None, bonus=0.1),
    "no_bonus": dict(sft=None, reflection=0.5, rl=None, bonus=0.0),
}
SIZES = {
    # layers, d_model, heads, d_ff, SFT steps, RL steps, videos per step, group size
    "smoke": dict(layers=1, d_model=32, heads=2, d_ff=64, sft=2, rl=1, videos=8, group=2),
    "small": dict(layers=3, d_model=128, heads=4, d_ff=384, sft=800, rl=60, videos=16, group=8),
}

# What launch.aot, device_check and the generic tests need (core.declarations); the large
# targets shard the videos over up to 256 devices.
DECLARATIONS = Declarations(largest="size=small", largest_overrides={"train.batch_size": 256})


def get_config(arg: str | None = None) -> ConfigDict:
    opts = parse_arg(arg, {"mesh": "auto", "size": "small", "arm": "full"})
    size = choose("size", opts["size"], SIZES)
    arm = choose("arm", opts["arm"], ARMS)
    sft = size["sft"] if arm["sft"] is None else arm["sft"]
    rl = size["rl"] if arm["rl"] is None else arm["rl"]

    c = base_config(opts["mesh"])
    c.method = "videozoomer"
    c.arm = opts["arm"]
    c.model = ConfigDict(
        dict(
            num_layers=size["layers"],
            d_model=size["d_model"],
            num_heads=size["heads"],
            d_ff=size["d_ff"],
        )
    )
    # Cold start: next-token loss on the policy's tokens of scripted trajectories (oracle, or
    # reflection with probability `reflection`); the environment's tokens are read, not trained.
    c.sft = ConfigDict(dict(steps=sft, reflection=arm["reflection"], lr=1e-3))
    # The paper's reward: 0.9 accuracy + 0.1 format + bonus * 1[correct] * 1[>= 1 zoom].
    c.rewards = ConfigDict(dict(accuracy=0.9, format=0.1, tool_bonus=arm["bonus"]))
    # The official GRPO settings (verl): asymmetric clip 0.2 / 0.27, a KL loss of 1e-3 to the
    # policy RL starts from, entropy bonus 1e-3, zero-variance groups dropped (its rejection
    # sampling); one PPO epoch per rollout (the official runs take several mini-batches).
    c.grpo = ConfigDict(
        dict(
            group_size=size["group"],
            temperature=1.0,
            clip_low=0.2,
            clip_high=0.27,
            aggregation="token",
            kl_beta=1e-3,
            entropy_coef=1e-3,
            drop_zero_variance=True,
            ppo_epochs=1,
        )
    )
    c.train.steps = sft + rl
    c.train.batch_size = size["videos"]
    c.train.log_every = max(1, c.train.steps // 20)
    c.train.checkpoint_every = max(1, c.train.steps // 2)
    c.train.eval_every = 0
    c.optim.name = "adam"
    c.optim.lr = 1e-4  # the RL stage; SFT has its own Adam at sft.lr
    c.eval = ConfigDict(dict(num_examples=24 if opts["size"] == "smoke" else 600))
    return c
