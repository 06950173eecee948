"""Paper 16 (fetal_gauge): the small VLM of the Fetal-Gauge harness, trained on the generated
phantom benchmark's train split (issue 45).

    python -m launch.train --config=configs/fetal_gauge.py:size=cpu --workdir=/tmp/fetal_gauge
    python -m methods.fetal_gauge.run_benchmark --model=vlm:/tmp/fetal_gauge --demo=/tmp/fg_demo

Options: mesh (a preset in configs/common.py), size (smoke | cpu).
- cpu, what the experiment trains: 64 x 64 RGB phantoms in 8 x 8 patches (64 ViT tokens, 2
  layers, d 64), a 2 x 2 merger (16 image tokens), a 2-layer decoder d 96; batch 64; the
  benchmark's 300 patients (180 train patients, ~3,600 training questions, clinical style only).
"""

from ml_collections import ConfigDict

from configs.common import base_config, choose, parse_arg, set_training
from core.declarations import Declarations

SIZES = {
    "smoke": dict(
        model=dict(patch_size=16, vit_d_model=16, vit_heads=2, vit_d_ff=32, vit_layers=1,
                   merge=1, d_model=32, num_heads=2, d_ff=64, num_layers=1),
        steps=2, batch_size=8, lr=1e-3, num_patients=10,
    ),
    "cpu": dict(
        model=dict(patch_size=8, vit_d_model=64, vit_heads=2, vit_d_ff=128, vit_layers=2,
                   merge=2, d_model=96, num_heads=2, d_ff=256, num_layers=2),
        steps=1500, batch_size=64, lr=1e-3, num_patients=300,
    ),
}  # fmt: skip

DECLARATIONS = Declarations(largest="size=cpu", largest_overrides={"train.batch_size": 256})


def get_config(arg: str | None = None) -> ConfigDict:
    opts = parse_arg(arg, {"mesh": "auto", "size": "cpu"})
    size = choose("size", opts["size"], SIZES)
    c = base_config(opts["mesh"])
    c.method = "fetal_gauge"
    c.model = ConfigDict(size["model"])
    # the benchmark: patients 60/20/20 % to train / validation / test; training reads the
    # train split in train_styles only (the paper's phantom gap: the other style never seen)
    c.data = ConfigDict(dict(num_patients=size["num_patients"], seed=0, train_styles="clinical"))
    set_training(c, steps=size["steps"], batch_size=size["batch_size"], lr=size["lr"])
    c.optim.weight_decay = 0.01
    c.eval = ConfigDict(dict(batch_size=size["batch_size"]))
    return c
