"""DEQL (paper 8): EASE / EDLAE / DEQL fitted in closed form on MovieLens-100k.

    python -m launch.train --config=configs/deql.py --workdir=/tmp/deql
    python -m launch.train --config=configs/deql.py:model=edlae,split=weak --workdir=/tmp/edlae

Options: mesh (a preset in configs/common.py), size (smoke: a synthetic 60 x 40 matrix |
ml100k), model (deql | edlae | ease), split (strong: 100 validation + 100 test users held
out | weak: every user's 70/10/20). One step is one closed-form fit (`train.steps = 1`): the
Gram matrix of the train matrix (users sharded over the mesh), then the solve in float64.
The default hyperparameters are each model's most frequent validation choice in
`methods/deql/results/full_v1.json` (ML-100k, strong, 10 splits; DEQL(L2)'s lam there is on EDLAE's
scale, 100, which is 62.5 on DEQL's own at b = 2, p = 0.5); override any, e.g. --config.model.b=1.5
--config.model.lam=30 --config.model.zero_diag=true. The evaluation reports validation
Recall@20/50 and NDCG@100; test users are never touched here.
"""

from ml_collections import ConfigDict

from configs.common import base_config, choose, parse_arg
from core.declarations import Declarations

MODELS = {
    # lam is on each model's own scale (DEQL's H0 carries p a^2 (1 - p)^2).
    "deql": dict(model="deql", a=1.0, b=2.0, p=0.5, lam=62.5, zero_diag=False),
    "edlae": dict(model="edlae", a=1.0, b=0.0, p=0.25, lam=100.0, zero_diag=True),
    "ease": dict(model="ease", a=1.0, b=0.0, p=0.0, lam=300.0, zero_diag=True),
}
SPLITS = ("strong", "weak")
SIZES = {
    # source, users, items (synthetic only), held-out users per split, batch (>= train users,
    # divisible by the device count: users are padded with zero rows)
    "smoke": dict(source="synthetic", users=60, items=40, n_heldout=8, batch=64),
    "ml100k": dict(source="ml100k", users=0, items=0, n_heldout=100, batch=1024),
}


# What launch.aot, device_check and the generic tests need (core.declarations): the
# defaults (the largest config is the default one).
DECLARATIONS = Declarations()


def get_config(arg: str | None = None) -> ConfigDict:
    opts = parse_arg(arg, {"mesh": "auto", "size": "ml100k", "model": "deql", "split": "strong"})
    size = choose("size", opts["size"], SIZES)
    model = choose("model", opts["model"], MODELS)
    split = choose("split", opts["split"], SPLITS)

    c = base_config(opts["mesh"])
    c.method = "deql"
    c.dtype = "float32"  # deql computes in float32 only (methods/deql: make)
    c.data = ConfigDict(
        dict(
            source=size["source"],
            n_users=size["users"],
            n_items=size["items"],
            split=split,
            n_val=size["n_heldout"],
            n_test=size["n_heldout"],
            seed=0,  # draws the held-out users (strong) or the per-user split (weak)
        )
    )
    c.model = ConfigDict(model)
    c.train.steps = 1  # one closed-form fit
    c.train.batch_size = size["batch"]
    c.train.log_every = 1
    c.train.eval_every = 0  # at the end
    c.train.checkpoint_every = 0 if opts["size"] == "smoke" else 1
    return c
