"""The baseline transformer LM on a synthetic task.

    python -m launch.train --config=configs/lm.py:task=copy,size=small --workdir=/tmp/lm
    python -m launch.train --config=configs/lm.py:mesh=tpu,size=base,task=mqar --workdir=gs://...

Options: mesh (a preset in configs/common.py), size (smoke | small | base), task (copy | mqar |
parity | modular). Any field can be overridden, e.g. --config.task.length=32.
"""

from ml_collections import ConfigDict

from configs.common import base_config, choose, parse_arg, set_training
from core.declarations import Declarations

# Task parameters, passed to core.tasks.make_task(name, **options).
TASKS = {
    "copy": dict(length=16, num_symbols=16),
    "mqar": dict(num_pairs=4, num_keys=16, num_values=16, num_queries=4),
    "parity": dict(length=32),
    "modular": dict(modulus=7, num_terms=4),
}

SIZES = {
    # layers, d_model, heads, d_ff, steps, batch, lr
    "smoke": dict(num_layers=1, d_model=32, num_heads=2, d_ff=64, steps=2, batch_size=8, lr=1e-3),
    "small": dict(
        num_layers=2, d_model=128, num_heads=4, d_ff=512, steps=2000, batch_size=64, lr=1e-3
    ),
    "base": dict(
        num_layers=8, d_model=512, num_heads=8, d_ff=2048, steps=20000, batch_size=256, lr=3e-4
    ),
}


# What launch.aot, device_check and the generic tests need (core.declarations).
DECLARATIONS = Declarations(
    largest="size=base",
)


def get_config(arg: str | None = None) -> ConfigDict:
    opts = parse_arg(arg, {"mesh": "auto", "size": "small", "task": "copy"})
    size = choose("size", opts["size"], SIZES)
    task = choose("task", opts["task"], TASKS)

    c = base_config(opts["mesh"])
    c.method = "lm"
    c.task = ConfigDict({"name": opts["task"], **task})
    c.model = ConfigDict(
        dict(
            num_layers=size["num_layers"],
            d_model=size["d_model"],
            num_heads=size["num_heads"],
            d_ff=size["d_ff"],
            max_len=0,  # 0: the task's sequence length
            position="rope",
            rope_base=10000.0,
        )
    )
    set_training(c, steps=size["steps"], batch_size=size["batch_size"], lr=size["lr"])
    c.optim.weight_decay = 0.01
    c.eval = ConfigDict(dict(num_examples=64 if opts["size"] == "smoke" else 512))
    return c
