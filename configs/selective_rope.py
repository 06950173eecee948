"""Selective RoPE (paper 5) in a 1-layer GLA or softmax transformer on state tracking / recall.

    python -m launch.train --config=configs/selective_rope.py:model=gla,position=selective \
        --workdir=/tmp/sr
    python -m launch.train --config=configs/selective_rope.py:model=transformer,position=rope,\
task=mqar --workdir=/tmp/sr-mqar

Options: mesh (a preset in configs/common.py), size (smoke | small), model (gla | transformer),
position (selective | rope | none), task (parity | mqar). Any field can be overridden, e.g.
--config.task.length=128 --config.model.use_gate=True. RoPE and none are widened to the
selective variant's parameter count (model.match_params).
"""

from ml_collections import ConfigDict

from configs.common import base_config, choose, parse_arg, set_training
from core.declarations import Declarations

MODELS = ("gla", "transformer")
POSITIONS = ("selective", "rope", "none")

# Task parameters, passed to core.tasks.make_task(name, **options).
TASKS = {
    "parity": dict(length=64),  # prefix parity (S2 state tracking), a label at every position
    "mqar": dict(num_pairs=8, num_keys=32, num_values=32, num_queries=8),
}

SIZES = {
    # layers, d_model, heads, d_ff, steps, batch, lr
    "smoke": dict(num_layers=1, d_model=16, num_heads=2, d_ff=32, steps=2, batch_size=8, lr=1e-3),
    "small": dict(
        num_layers=1, d_model=64, num_heads=4, d_ff=128, steps=1000, batch_size=128, lr=2e-3
    ),
}


# What launch.aot, device_check and the generic tests need (core.declarations).
DECLARATIONS = Declarations(
    largest="size=small",
    largest_overrides={"train.batch_size": 256},
)


def get_config(arg: str | None = None) -> ConfigDict:
    opts = parse_arg(
        arg,
        {
            "mesh": "auto",
            "size": "small",
            "model": "gla",
            "position": "selective",
            "task": "parity",
        },
    )
    size = choose("size", opts["size"], SIZES)
    task = choose("task", opts["task"], TASKS)
    choose("model", opts["model"], MODELS)
    choose("position", opts["position"], POSITIONS)
    smoke = opts["size"] == "smoke"

    c = base_config(opts["mesh"])
    c.method = "selective_rope"
    c.task = ConfigDict({"name": opts["task"], **task})
    if smoke and opts["task"] == "parity":
        c.task.length = 16
    c.model = ConfigDict(
        dict(
            kind=opts["model"],
            position=opts["position"],
            num_layers=size["num_layers"],
            d_model=size["d_model"],
            num_heads=size["num_heads"],
            d_ff=size["d_ff"],  # the selective variant's; RoPE/none get more (match_params)
            match_params=True,
            # Selective RoPE, as in the authors' state-tracking runs: low-rank phi (r=16), short
            # conv 4 without SiLU, bias on, no phase gate, rope-type temperature with theta=1.
            phi_parametrization="low-rank",
            phi_rank=16,
            conv_size=4,
            conv_silu=False,
            use_bias=True,
            use_gate=False,
            temp_type="rope",
            temp_theta=1.0,
            temp_max=1.0,
            rotary_impl="auto",
            rope_base=10000.0,
            qk_norm=True,
            output_gate=True,
        )
    )
    set_training(c, steps=size["steps"], batch_size=size["batch_size"], lr=size["lr"])
    c.eval = ConfigDict(
        dict(
            num_examples=16 if smoke else 512,
            # parity: also tested at these lengths (length generalisation)
            lengths=(32,) if smoke else (128, 256, 512),
        )
    )
    return c
