"""ODPV (paper 9): a tiny YOLO-like detector on synthetic scenes, trained to be verified.

    python -m launch.train --config=configs/od_verify.py --workdir=/tmp/od
    python -m launch.train --config=configs/od_verify.py:size=quick,image=32 --workdir=/tmp/od32

Options: mesh (a preset in configs/common.py), size (smoke: tests | quick: the quick
experiment | small: the full experiment), image (64 | 32: the image side in px; the detector's
grid is image / 8 cells a side). `verify` holds the verifier's settings (methods/od_verify).
"""

from ml_collections import ConfigDict

from configs.common import base_config, choose, parse_arg
from core.declarations import Declarations

SIZES = {
    # detector widths (3 stride-2 convs, then 3x3 convs), steps at image 64 / 32, batch, peak
    # lr, validation / test scenes. Measured on 2 CPU cores (data seed 0, model seeds 0-2):
    # quick reaches validation mAP50 ~0.95 at 64 in 500 steps (0.988 in 800, ~15 s of training;
    # 500 keeps the quick experiment's 3 seeds near 30 s) (0.88 at 32 in ~13 s),
    # small ~0.996 at 64 in ~60 s (0.985 at 32 in ~60 s). At 32 the objects are 5-12 px and
    # telling a disc from a square takes longer, hence more (cheaper) steps.
    "smoke": dict(channels=(8, 8, 8, 8), steps={64: 2, 32: 2}, batch=8, lr=1e-2, scenes=16),
    "quick": dict(channels=(16, 32, 64, 64), steps={64: 500, 32: 2000}, batch=32, lr=1e-2,
                  scenes=256),
    "small": dict(channels=(16, 32, 64, 64), steps={64: 2000, 32: 5000}, batch=64, lr=1e-2,
                  scenes=512),
}  # fmt: skip
IMAGES = {"64": 64, "32": 32}

DECLARATIONS = Declarations(
    largest="size=small",
    largest_overrides={"train.batch_size": 256},  # divides over 256 chips and 64 GPUs
)


def get_config(arg: str | None = None) -> ConfigDict:
    opts = parse_arg(arg, {"mesh": "auto", "size": "small", "image": "64"})
    size = choose("size", opts["size"], SIZES)
    image = choose("image", opts["image"], IMAGES)

    c = base_config(opts["mesh"])
    c.method = "od_verify"
    c.dtype = "float32"  # od_verify computes in float32 only (methods/od_verify: make)
    c.model = ConfigDict(dict(channels=size["channels"], image=image))
    # The scenes (methods/od_verify/data.py): a data seed (the same scenes for every model
    # seed), the pixel noise sigma, the fixed validation and test set sizes.
    c.data = ConfigDict(dict(seed=0, noise=0.04, validation=size["scenes"], test=size["scenes"]))
    c.train.steps = size["steps"][image]
    c.train.batch_size = size["batch"]
    c.train.log_every = max(1, c.train.steps // 10)
    c.train.eval_every = 0  # validation mAP50 at the end
    c.train.checkpoint_every = c.train.steps
    # AdamW, 5 % warm-up, cosine decay to 0, gradients clipped at 1.
    c.optim.name = "adamw"
    c.optim.lr = size["lr"]
    c.optim.warmup_steps = max(1, c.train.steps // 20)
    c.optim.schedule = "cosine"
    c.optim.weight_decay = 1e-4
    c.optim.grad_clip = 1.0
    # The verifier's settings: error rate alpha and confidence beta of the probabilistic
    # guarantee, the confidence threshold iota and the NMS IoU threshold eta.
    c.verify = ConfigDict(dict(alpha=0.05, beta=0.05, iota=0.25, eta=0.45))
    return c
