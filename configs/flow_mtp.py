"""Parallel Token Prediction (paper 19): an O-PTP student distilled from the toy teacher.

    python -m launch.train --config=configs/flow_mtp.py:size=toy --workdir=/tmp/ptp
    python -m launch.train --config=configs/flow_mtp.py:size=toy,u=off --workdir=/tmp/ptp_no_u

Options: mesh (a preset in configs/common.py), size (smoke | toy), u (on | off: off is the
no-u baseline, the same network with every slot fed one constant: independent multi-token
prediction). Any field can be overridden, e.g. --config.ptp.completion_len=8.
"""

from ml_collections import ConfigDict

from configs.common import base_config, choose, parse_arg, set_training
from core.declarations import Declarations

SIZES = {
    # layers, d_model, heads, d_ff, context C, completion L, steps, batch, lr; completions
    # start at a uniform position in [1, max_start] of a teacher sequence
    "smoke": dict(
        num_layers=1,
        d_model=32,
        num_heads=2,
        d_ff=64,
        C=4,
        L=4,
        steps=2,
        batch=8,
        lr=1e-3,
        max_start=8,
    ),
    # Our plan's toy run: 2 layers, d = 64, L = 16, batch 64, AdamW 3e-3, warmup + cosine.
    "toy": dict(
        num_layers=2,
        d_model=64,
        num_heads=4,
        d_ff=256,
        C=16,
        L=16,
        steps=8000,
        batch=64,
        lr=3e-3,
        max_start=64,
    ),
}
U = {"on": True, "off": False}


# What launch.aot, device_check and the generic tests need (core.declarations).
DECLARATIONS = Declarations(
    largest="size=toy",
    largest_overrides={"train.batch_size": 256},
)


def get_config(arg: str | None = None) -> ConfigDict:
    opts = parse_arg(arg, {"mesh": "auto", "size": "toy", "u": "on"})
    size = choose("size", opts["size"], SIZES)
    use_u = choose("u", opts["u"], U)

    c = base_config(opts["mesh"])
    c.method = "flow_mtp"
    c.dtype = "float32"  # a toy on CPU; the bin edges are float32 whatever the compute dtype
    # The teacher and its sampling transform (the same in bin edges and verification).
    c.teacher = ConfigDict(
        dict(name="increasing_sequence", vocab_size=100, temperature=1.0, top_k=0, top_p=1.0)
    )
    c.ptp = ConfigDict(
        dict(
            context_len=size["C"],
            # Completions start at a uniform position in [1, max_start] of a teacher sequence.
            max_start=size["max_start"],
            completion_len=size["L"],
            use_u=use_u,
            num_anchors=3,  # LinearInterpolationEmbedding's anchors (u = 0, 1/2, 1)
            beta=0.3,  # training u = left + width * Beta(beta, beta)
            # Slots one position earlier, as the official code (`model.py`); off: slot k at s + k.
            shift_positions=False,
        )
    )
    c.model = ConfigDict({k: size[k] for k in ("num_layers", "d_model", "num_heads", "d_ff")})
    set_training(c, steps=size["steps"], batch_size=size["batch"], lr=size["lr"])
    c.optim.weight_decay = 0.01
    c.eval = ConfigDict(
        dict(num_examples=size["batch"] * (2 if opts["size"] == "smoke" else 16), split="test")
    )
    return c
