"""DUPA (paper 10): a tiny DDT on scikit-learn digits, one arm per run.

    python -m launch.train --config=configs/dupa.py:size=quick,arm=dupa --workdir=/tmp/dupa
    python -m launch.train --config=configs/dupa.py:size=full,arm=ddt_2b --workdir=/tmp/ddt2b

Options: mesh (a preset in configs/common.py), size (smoke | quick | full), arm (ddt | ddt_2b |
dual | dupa | dupa_sg | repa: methods/dupa/__init__.py), backbone (sincos: additive sin-cos
positions, the first study's; rope: DDT's 2-D RoPE and QK-norm, no additive positions),
align (projector: -cos of a trainable projector's outputs, the first two studies'; retest:
InfoNCE between the two paths' own encoder tokens centred on the batch, from a pass with the
null label; ALIGNS; the single options, config.dupa.align_*, are methods/dupa ALIGN_OPTIONS).
train.batch_size is images per step (B; 2B for ddt_2b); the dual-path arms run K = 2 paths per
image, a forward of 2B rows.
Evaluation (FD-digits, conditional accuracy, probe; eval.num_samples > 0) trains the digits
classifier once into eval.classifier_cache.
"""

import os

from ml_collections import ConfigDict

from configs.common import base_config, choose, parse_arg, set_training
from core.declarations import Declarations

# arm -> config.dupa fields and the batch factor (images per step: B or 2B).
ARMS = {
    "ddt": dict(paths=1, align_weight=0.0, stop_gradient=False, target="none", batch_factor=1),
    "ddt_2b": dict(paths=1, align_weight=0.0, stop_gradient=False, target="none", batch_factor=2),
    "dual": dict(paths=2, align_weight=0.0, stop_gradient=False, target="paths", batch_factor=1),
    "dupa": dict(paths=2, align_weight=0.5, stop_gradient=False, target="paths", batch_factor=1),
    "dupa_sg": dict(paths=2, align_weight=0.5, stop_gradient=True, target="paths", batch_factor=1),
    "repa": dict(
        paths=1, align_weight=0.5, stop_gradient=False, target="classifier", batch_factor=1
    ),
}
# align -> the alignment's options (methods/dupa ALIGN_OPTIONS, README "Re-test (issue 47)").
# The default is the first two studies', so their run configs mean what they meant.
ALIGNS = {
    "projector": dict(align_head="projector", align_label="shared", align_loss="cosine"),
    "retest": dict(align_head="centred", align_label="null", align_loss="infonce"),
}
# backbone -> core.nn.dit position and qk_norm
BACKBONES = {
    "sincos": dict(position="sincos", qk_norm=False),
    "rope": dict(position="rope2d", qk_norm=True),
}
SIZES = {
    # d_model, heads, d_ff, encoder / decoder blocks, align block, steps, batch B, samples
    "smoke": dict(d=32, heads=2, ff=64, enc=2, dec=1, align=0, steps=2, batch=8, samples=0),
    # Our plan's tiny DDT (patch 2 -> 16 tokens, 4 + 2 blocks, align at encoder block 2 of 4,
    # i.e. index 1) at the width and length the experiment affords on 2 shared cores.
    "quick": dict(d=32, heads=2, ff=64, enc=4, dec=2, align=1, steps=150, batch=32, samples=100),
    "full": dict(d=64, heads=4, ff=128, enc=4, dec=2, align=1, steps=450, batch=32, samples=200),
}


# What launch.aot, device_check and the generic tests need (core.declarations).
DECLARATIONS = Declarations(
    largest="size=full,arm=dupa",
    largest_overrides={"train.batch_size": 256},
)


def get_config(arg: str | None = None) -> ConfigDict:
    opts = parse_arg(arg, {"mesh": "auto", "size": "full", "arm": "dupa", "backbone": "sincos",
                           "align": "projector"})  # fmt: skip
    alignment = choose("align", opts["align"], ALIGNS)
    size = choose("size", opts["size"], SIZES)
    arm = choose("arm", opts["arm"], ARMS)
    backbone = choose("backbone", opts["backbone"], BACKBONES)

    c = base_config(opts["mesh"])
    c.method = "dupa"
    c.model = ConfigDict(
        dict(
            patch_size=2,
            d_model=size["d"],
            num_heads=size["heads"],
            d_ff=size["ff"],
            encoder_blocks=size["enc"],
            decoder_blocks=size["dec"],
            **backbone,
        )
    )
    c.dupa = ConfigDict(
        dict(
            arm=opts["arm"],
            paths=arm["paths"],
            align_weight=arm["align_weight"],
            stop_gradient=arm["stop_gradient"],
            target=arm["target"],
            align_block=size["align"],
            **alignment,
            align_temperature=0.2,  # InfoNCE's (MoCo v2's default), untuned; cosine: unused
            projector_dim=64,
            projector_gain=0.5,  # "small-gain Xavier" after a Kaiming layer; never zero
            label_dropout=0.1,
            ema_decay=0.999,
            ema_warmup=True,
        )
    )
    # AdamW, no weight decay, 10 % warm-up, constant rate: our plan's recipe (3e-4 over 2-3k
    # steps at batch 64) scaled to runs 4-20x shorter: 1e-3, fixed before the first full run,
    # untuned, the same for every arm.
    set_training(c, steps=size["steps"], batch_size=size["batch"] * arm["batch_factor"], lr=1e-3)
    c.optim.schedule, c.optim.weight_decay = "constant", 0.0
    c.train.checkpoint_every = 0 if opts["size"] == "smoke" else c.train.checkpoint_every
    c.eval = ConfigDict(
        dict(
            num_samples=size["samples"],
            sample_steps=50,
            cfg_scale=1.5,
            cfg_t_min=0.3,
            cfg_t_max=1.0,
            split="test",
            classifier_cache=os.path.expanduser("~/.cache/iclr26-jax"),
        )
    )
    return c
