"""DOIT (paper 14): optimiser switching on the 2-D test functions, through core.train.

    python -m launch.train --config=configs/doit.py --workdir=/tmp/doit
    python -m launch.train --config=configs/doit.py:task=camel,policy=random --workdir=/tmp/d2

Options: mesh, size (smoke | full), task (rosenbrock | camel | digits), policy (doit | random |
periodic | single), single (the optimiser of policy=single), schedule (self_consistent |
printed: kappa's halving rule). One train step is one cycle of `doit.tau` steps
(core/cycles.py), so `train.steps` counts cycles.
"""

from ml_collections import ConfigDict

from configs.common import base_config, choose, parse_arg
from core.declarations import Declarations

SIZES = {  # cycles, tau, cold-start cycles (full: the 2-D functions' 2000 steps)
    "smoke": dict(steps=4, tau=5, n_ini=2),
    "full": dict(steps=80, tau=25, n_ini=10),
}
# The digits MLP (issue 25's plan): 80 cycles of 10 steps at batch 64 (800 steps, ~47 epochs),
# the PCA of the last two kernels.
DIGITS = dict(tau=10, batch=64, layers="dense_[12]/kernel")

# Fixed before any run: stable from every start in the boxes of methods/doit/problems.py.
POOLS = {
    "rosenbrock": {
        "sgd": {"kind": "sgd", "lr": 2e-4},
        "sgdm": {"kind": "sgd", "lr": 1e-4, "momentum": 0.9},
        "adagrad": {"kind": "adagrad", "lr": 0.3},
        "rmsprop": {"kind": "rmsprop", "lr": 1e-2},
        "adam": {"kind": "adam", "lr": 3e-2},
    },
    "digits": {  # issue 25's learning rates, stated before any run
        "sgd": {"kind": "sgd", "lr": 0.1},
        "sgdm": {"kind": "sgd", "lr": 0.05, "momentum": 0.9},
        "adagrad": {"kind": "adagrad", "lr": 0.05},
        "rmsprop": {"kind": "rmsprop", "lr": 1e-3},
        "adam": {"kind": "adam", "lr": 1e-3},
    },
    "camel": {
        "sgd": {"kind": "sgd", "lr": 1e-2},
        "sgdm": {"kind": "sgd", "lr": 5e-3, "momentum": 0.9},
        "adagrad": {"kind": "adagrad", "lr": 0.3},
        "rmsprop": {"kind": "rmsprop", "lr": 1e-2},
        "adam": {"kind": "adam", "lr": 3e-2},
    },
}


# What launch.aot, device_check and the generic tests need (core.declarations).
DECLARATIONS = Declarations(
    # The digits MLP: the 2-D functions have no batch, so nothing to spread over chips.
    largest="size=full,task=digits",
    largest_overrides={"train.batch_size": 256},
    aot_smoke="size=smoke,task=digits",
    no_matmul="its default task is a 2-D test function (Rosenbrock): elementwise arithmetic only",
)


def get_config(arg: str | None = None) -> ConfigDict:
    opts = parse_arg(
        arg,
        {
            "mesh": "auto",
            "size": "full",
            "task": "rosenbrock",
            "policy": "doit",
            "single": "adam",
            "schedule": "self_consistent",
        },
    )
    size = choose("size", opts["size"], SIZES)
    pool = choose("task", opts["task"], POOLS)
    c = base_config(opts["mesh"])
    c.method = "doit"
    c.dtype = "float32"
    c.doit = ConfigDict(
        dict(
            task=opts["task"],
            policy=opts["policy"],
            single=opts["single"],
            pool=pool,
            tau=size["tau"],
            inherit=False,  # the paper: a switch restarts the optimiser's state
            n_ini=size["n_ini"],
            components=2,
            layers=".*",  # the 2-D point itself
            alpha=0.0,  # not given in the paper: the score is progress alone
            w_min=0.05,
            halving=10,
            omega_t=0.0,  # from scratch
            schedule=opts["schedule"],
        )
    )
    # Dummy rows (the loss is the function of the point): 8 split over 8 test devices.
    c.train.steps, c.train.batch_size = size["steps"], 8
    if opts["task"] == "digits":
        c.train.batch_size, c.doit.layers = DIGITS["batch"], DIGITS["layers"]
        if opts["size"] == "full":
            c.doit.tau = DIGITS["tau"]
    c.train.log_every, c.train.checkpoint_every = 10, 20
    c.train.eval_every = -1
    return c
