"""Think-Then-Embed (paper 11): an embedder that reads a reasoning trace, on digits retrieval.

    python -m launch.train --config=configs/tte.py --workdir=/tmp/tte              # TTE_t embedder
    python -m launch.train --config=configs/tte.py:role=reasoner --workdir=/tmp/tte_r
    python -m launch.train --config=configs/tte.py:role=unified,reasoner=/tmp/tte_r \\
        --workdir=/tmp/tte_u

Options: mesh (a preset in configs/common.py); size (smoke: tests | quick: the quick experiment
| small: the full experiment); role (embedder: the VLM embedder trained with InfoNCE through
GradCache | reasoner: the VLM reasoner's SFT on teacher traces | unified: TTE_u's head on a frozen
reasoner, whose run's workdir `reasoner` names); style (none | full | final: the embedder's
query trace); families (image: the six families over digit images | text: the plain-text
compositional families, methods/tte/text.py); rho (the noisy teacher's rate); head (mhsa |
pooler: TTE_u's head).
"""

from ml_collections import ConfigDict

from configs.common import base_config, choose, parse_arg, set_training
from core.declarations import Declarations

ROLES = ("embedder", "reasoner", "unified")
HEADS = ("mhsa", "pooler")
FAMILY_SETS = ("image", "text")  # methods/tte/examples.py FAMILY_SETS
MODEL = dict(  # the VLM of every role: ViT on 4 x 4 patches of 8 x 16 images (8 tokens) -> LM
    patch_size=4,
    vit_d_model=64,
    vit_heads=2,
    vit_d_ff=128,
    vit_layers=1,
    d_model=64,
    num_heads=2,
    d_ff=128,
    num_layers=4,
)
SIZES = {
    # steps (embedder / reasoner / head), batch, GradCache chunks, evaluation queries per family.
    # quick: the trace's gain on the compositional families appears between 100 and 150 steps
    # (TTE_t - baseline: +0.04 at 100 steps, +0.19 at 150; 3 seeds, measured 2026-12-05).
    "smoke": dict(model=dict(vit_d_model=16, d_model=16, d_ff=32, vit_d_ff=32),
                  steps=(2, 2, 2), batch=16, chunks=2, queries=4),
    "quick": dict(model={}, steps=(150, 300, 150), batch=64, chunks=2, queries=50),
    "small": dict(model={}, steps=(400, 1000, 300), batch=128, chunks=2, queries=300),
}  # fmt: skip

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
            "role": "embedder",
            "style": "full",
            "rho": "0",
            "head": "mhsa",
            "reasoner": "",
            "families": "image",
        },
    )
    size = choose("size", opts["size"], SIZES)
    role = choose("role", opts["role"], ROLES)
    c = base_config(opts["mesh"])
    c.method = "tte"
    c.model = ConfigDict({**MODEL, **size["model"]})
    steps = size["steps"][ROLES.index(role)]
    set_training(c, steps=steps, batch_size=size["batch"], lr=1e-3)
    c.train.checkpoint_every = steps  # short runs: the final state only
    c.optim.weight_decay = 0.01
    c.tte = ConfigDict(
        dict(
            role=role,
            families=choose(
                "families", opts["families"], FAMILY_SETS
            ),  # image: the six image-task families | text (text.py)
            style=opts["style"],  # the query's trace (methods/tte/tasks.py)
            rho=float(opts["rho"]),
            trace_only=False,
            tau=0.02,  # the paper's temperature
            grad_cache_chunks=size["chunks"],  # 0: the plain full-batch gradient
            head=choose("head", opts["head"], HEADS),
            head_layer=1,  # TTE_u: the block whose output the head reads (mhsa)
            head_blocks=2,  # mhsa: backbone blocks copied on top of it
            pooler_queries=1,
            reasoner=opts["reasoner"],  # unified: the reasoner run's workdir
            eval_queries=size["queries"],  # per family, validation split, in core.train
            classifier_cache="~/.cache/iclr26-jax",  # the digits classifier (test-time traces)
        )
    )
    return c
