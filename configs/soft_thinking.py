"""Soft thinking's task model: a small decoder trained on the shuffled modular sum.

    python -m launch.train --config=configs/soft_thinking.py --workdir=/tmp/soft-thinking
    python -m launch.reproduce --methods=soft_thinking   # the experiment (decoders, probes)

Options: mesh (a preset in configs/common.py), size (smoke | quick | full). The task
(`methods/soft_thinking/task.py`) is a sum of num_terms terms mod `modulus` whose scratchpad
adds the terms in any order. Any field can be overridden, e.g. --config.task.num_terms=6.
The model is trained with a constant learning rate after warmup, so that the experiment can
stop it at any step (it picks the step on validation data) without a schedule depending on it.
"""

from ml_collections import ConfigDict

from configs.common import base_config, choose, parse_arg
from core.declarations import Declarations

# The task per size: the quick model gets a shorter sum to learn in fewer steps.
TASKS = {"smoke": dict(modulus=7, num_terms=3), "quick": dict(modulus=7, num_terms=4)}
TASKS["full"] = dict(modulus=11, num_terms=4)

SIZES = {
    # layers, d_model, heads, d_ff, steps, batch, lr
    "smoke": dict(num_layers=1, d_model=32, num_heads=2, d_ff=64, steps=2, batch_size=8, lr=1e-3),
    "quick": dict(
        num_layers=2, d_model=64, num_heads=4, d_ff=192, steps=200, batch_size=64, lr=3e-3
    ),
    "full": dict(
        num_layers=4, d_model=96, num_heads=4, d_ff=256, steps=800, batch_size=64, lr=3e-3
    ),
}


# What launch.aot, device_check and the generic tests need (core.declarations).
DECLARATIONS = Declarations(
    largest="size=full",
    largest_overrides={"train.batch_size": 256},
)


def get_config(arg: str | None = None) -> ConfigDict:
    opts = parse_arg(arg, {"mesh": "auto", "size": "full"})
    size = choose("size", opts["size"], SIZES)

    c = base_config(opts["mesh"])
    c.method = "soft_thinking"
    c.task = ConfigDict(TASKS[opts["size"]])
    c.model = ConfigDict(
        dict(
            num_layers=size["num_layers"],
            d_model=size["d_model"],
            num_heads=size["num_heads"],
            d_ff=size["d_ff"],
            position="rope",
        )
    )
    c.train.steps = size["steps"]
    c.train.batch_size = size["batch_size"]
    c.train.log_every = max(1, min(100, size["steps"] // 10))
    c.train.checkpoint_every = 0
    c.optim.lr = size["lr"]
    c.optim.warmup_steps = min(100, size["steps"] // 10)
    c.optim.schedule = "constant"
    c.optim.grad_clip = 1.0
    c.optim.weight_decay = 0.01
    # Teacher-forced metrics of the core's evaluation: this many validation prompts.
    c.eval = ConfigDict(dict(num_validation=16 if opts["size"] == "smoke" else 256))
    return c
