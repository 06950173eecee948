"""Hybrid online learning (paper 12): FTRL-FW run through core.train, one round per example.

    python -m launch.train --config=configs/hybrid_online.py --workdir=/tmp/hybrid
    python -m launch.train --config=configs/hybrid_online.py:size=quick,adversary=oblivious \
        --workdir=/tmp/hybrid_quick

Options: mesh (a preset in configs/common.py), size (smoke | quick | full: T = 16 / 400 / 2000
rounds), adversary (adaptive | oblivious | two_function), loss (absolute | squared),
distribution (uniform | beta25). The horizon is T = train.steps * train.batch_size (rounds per
step: 1 for quick and full, so the metrics are per round; 8 for smoke, which the tests run on 8
fake devices, and a batch must divide over the data-parallel devices). No loss and no
optimiser: the step is the learner's (methods/hybrid_online/__init__.py).
"""

from ml_collections import ConfigDict

from configs.common import base_config, choose, parse_arg
from core.declarations import Declarations

SIZES = {
    # steps, rounds per step (batch), log/checkpoint every
    "smoke": dict(steps=2, batch=8, log_every=1, checkpoint_every=0),
    "quick": dict(steps=400, batch=1, log_every=50, checkpoint_every=200),
    "full": dict(steps=2000, batch=1, log_every=100, checkpoint_every=500),
}


# What launch.aot, device_check and the generic tests need (core.declarations).
DECLARATIONS = Declarations(
    # One round per step in the full run; 256 rounds per step over 8 steps: T = 2048.
    largest="size=full",
    largest_overrides={"train.batch_size": 256, "train.steps": 8},
    no_matmul="an online learner over sorted buffers: sorts and cumulative sums",
    sequential="an online learner: every chip plays the same rounds",
)


def get_config(arg: str | None = None) -> ConfigDict:
    opts = parse_arg(
        arg,
        {
            "mesh": "auto",
            "size": "full",
            "adversary": "adaptive",
            "loss": "absolute",
            "distribution": "uniform",
        },
    )
    size = choose("size", opts["size"], SIZES)
    c = base_config(opts["mesh"])
    c.method = "hybrid_online"
    # Buffers and the duality gap in float32 under core.train (the experiment: float64).
    c.dtype = "float32"
    c.hybrid = ConfigDict(
        dict(
            h_class="thresholds",  # thresholds | intervals
            r_class="thresholds",  # thresholds (both orientations) | intervals
            loss=opts["loss"],
            adversary=opts["adversary"],
            distribution=opts["distribution"],
            eta_scale=1.0,  # eta = eta_scale * sqrt(T / (L^2 log T))
            gap_scale=1.0,  # epsilon = gap_scale / eta on F_t (README: "Choices")
            max_iters=100_000,  # Frank-Wolfe's cap per round (a violation if reached)
        )
    )
    c.train.steps, c.train.batch_size = size["steps"], size["batch"]
    c.train.log_every, c.train.checkpoint_every = size["log_every"], size["checkpoint_every"]
    c.train.eval_every = -1  # nothing to evaluate: the regret is a training metric
    return c
