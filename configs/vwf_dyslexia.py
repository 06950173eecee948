"""Paper 6 (vwf_dyslexia): the tiny VLM trained on four tasks (issue 23).

    python -m launch.train --config=configs/vwf_dyslexia.py:size=small --workdir=/tmp/vwf

Options: mesh (a preset in configs/common.py), size (smoke | small). small is the CPU plan:
ViT 4 layers d 128 on 8 x 8 patches of 32 x 128 images (64 tokens) -> linear merger ->
4-layer decoder d 192, SwiGLU 512.
"""

from ml_collections import ConfigDict

from configs.common import base_config, choose, parse_arg, set_training

SIZES = {
    "smoke": dict(
        patch_size=8,
        vit_d_model=16,
        vit_heads=2,
        vit_d_ff=32,
        vit_layers=1,
        d_model=32,
        num_heads=2,
        d_ff=64,
        num_layers=1,
        steps=2,
        batch_size=8,
        lr=1e-3,
    ),
    "small": dict(
        patch_size=8,
        vit_d_model=128,
        vit_heads=4,
        vit_d_ff=512,
        vit_layers=4,
        d_model=192,
        num_heads=4,
        d_ff=512,
        num_layers=4,
        steps=3000,
        batch_size=64,
        lr=1e-3,
    ),
}


def get_config(arg: str | None = None) -> ConfigDict:
    opts = parse_arg(arg, {"mesh": "auto", "size": "small"})
    size = dict(choose("size", opts["size"], SIZES))
    steps, batch_size, lr = size.pop("steps"), size.pop("batch_size"), size.pop("lr")
    c = base_config(opts["mesh"])
    c.method = "vwf_dyslexia"
    c.model = ConfigDict(size)
    set_training(c, steps=steps, batch_size=batch_size, lr=lr)
    c.optim.weight_decay = 0.01
    c.eval = ConfigDict(dict(num_examples=16 if opts["size"] == "smoke" else 1024))
    return c
