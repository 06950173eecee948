"""TPC (paper 18): a truncated polynomial probe trained order by order on cached activations.

    python -m launch.train --config=configs/tpc.py:dataset=digits --workdir=/tmp/tpc
    python -m launch.train --config=configs/tpc.py:mode=joint --workdir=/tmp/tpc-joint

Options: mesh (a preset in configs/common.py), size (smoke | small | paper), dataset (digits |
prompts | planted), mode (progressive | joint | joint_all), freeze_earlier (true: the paper |
false: the released code, whose earlier orders stay trainable). One run trains the whole schedule:
`train.steps` is split into N - 1 equal stages in progressive mode, stage s training order
s + 2 with a fresh optimiser (methods/tpc/train.py), evaluated at the end of each stage. In
joint mode ("max") it is one stage of `steps_per_order` steps at order N, as the released code
(whose epoch count is per order and multiplied by N - 1 only in progressive mode); joint_all is
the same stage on the mean loss over every truncation (its "train_all"). Any field
can be overridden, e.g. --config.model.rank=32 --config.model.dropout=0.2.
"""

from ml_collections import ConfigDict

from configs.common import base_config, choose, parse_arg
from core.declarations import Declarations

DATASETS = ("digits", "prompts", "planted")
MODES = ("progressive", "joint", "joint_all")
BOOLS = {"true": True, "false": False}

SIZES = {
    # order N, rank R, steps per order, batch. small: ~40 epochs of digits' 1006 training rows
    # at batch 128 (NOTES 18's CPU run); paper: R in {64, 128, 256}, batch 1024, 50 epochs.
    "smoke": dict(order=3, rank=4, steps_per_order=1, batch=16),
    "small": dict(order=5, rank=16, steps_per_order=320, batch=128),
    "paper": dict(order=5, rank=64, steps_per_order=2000, batch=1024),
}


# What launch.aot, device_check and the generic tests need (core.declarations).
DECLARATIONS = Declarations(
    largest="size=paper",
)


def get_config(arg: str | None = None) -> ConfigDict:
    opts = parse_arg(
        arg,
        {
            "mesh": "auto",
            "size": "small",
            "dataset": "digits",
            "mode": "progressive",
            "freeze_earlier": "true",
        },
    )
    size = choose("size", opts["size"], SIZES)
    choose("dataset", opts["dataset"], DATASETS)
    mode = choose("mode", opts["mode"], MODES)
    freeze_earlier = choose("freeze_earlier", opts["freeze_earlier"], BOOLS)

    c = base_config(opts["mesh"])
    c.method = "tpc"
    c.dtype = "float32"  # tpc computes in float32 only (methods/tpc: make)
    # layer: prompts' MiniLM layer (methods/tpc/data.py); dim: planted's input width
    c.data = ConfigDict(dict(dataset=opts["dataset"], seed=0, layer=4, dim=16))
    c.model = ConfigDict(
        dict(
            order=size["order"],
            rank=size["rank"],
            mode=mode,
            freeze_earlier=freeze_earlier,
            dropout=0.0,  # term dropout p; the paper's grid: {0, 0.2, 0.5}
            lam_std=0.02,
            impl="auto",
        )
    )
    stages = size["order"] - 1 if mode == "progressive" else 1
    steps = size["steps_per_order"]
    c.train.steps = steps * stages
    c.train.batch_size = size["batch"]
    c.train.eval_every = steps  # the end of every stage
    c.train.log_every = max(1, min(100, steps // 4))
    c.train.checkpoint_every = 0 if opts["size"] == "smoke" else steps
    # AdamW, clip 1, constant LR restarted each stage (the paper's ReduceLROnPlateau is not
    # reproduced); grid lr {1e-3, 5e-4, 1e-4} x wd {1, .1, .01}.
    c.optim.name = "adamw"
    c.optim.lr = 1e-3
    c.optim.weight_decay = 0.01
    c.optim.grad_clip = 1.0
    c.optim.schedule = "constant"
    return c
