"""NAB (paper 3): fit an implicit neural representation of one CT slice to a sparse-view sinogram.

    python -m launch.train --config=configs/nab.py:phantom=industrial --workdir=/tmp/nab
    python -m launch.train --config=configs/nab.py:encoding=rff,views=12 --workdir=/tmp/nab-rff

Options: mesh (a preset in configs/common.py), size (smoke | small | paper), encoding (nab |
rff), phantom (industrial | curved | shepp_logan), views (the number of projections). Any field
can be overridden, e.g. --config.model.rff_sigma=2.0 --config.data.object_seed=3
--config.model.frozen="('u','v')". Training is full-batch: every step projects all views
(`train.batch_size` = `data.num_views`, split over the data-parallel devices).
"""

from ml_collections import ConfigDict

from configs.common import base_config, choose, parse_arg, set_training
from core.declarations import Declarations

ENCODINGS = ("nab", "rff")
PHANTOMS = ("industrial", "curved", "shepp_logan")

SIZES = {
    # image side, features, hidden width, hidden layers, steps, lr
    "smoke": dict(size=16, num_features=16, hidden=16, depth=1, steps=2, lr=1e-3),
    "small": dict(size=64, num_features=456, hidden=128, depth=3, steps=1500, lr=1e-3),
    "paper": dict(size=128, num_features=456, hidden=256, depth=3, steps=3000, lr=1e-3),
}


# What launch.aot, device_check and the generic tests need (core.declarations).
DECLARATIONS = Declarations(
    largest="size=paper,views=256",
)


def get_config(arg: str | None = None) -> ConfigDict:
    opts = parse_arg(
        arg,
        {
            "mesh": "auto",
            "size": "small",
            "encoding": "nab",
            "phantom": "industrial",
            "views": "16",
        },
    )
    size = choose("size", opts["size"], SIZES)
    choose("encoding", opts["encoding"], ENCODINGS)
    choose("phantom", opts["phantom"], PHANTOMS)
    views = 8 if opts["size"] == "smoke" else int(opts["views"])

    c = base_config(opts["mesh"])
    c.method = "nab"
    c.dtype = "float32"  # nab computes in float32 only (methods/nab: make)
    c.data = ConfigDict(
        dict(
            phantom=opts["phantom"],
            object_seed=0,  # which object of the phantom family
            num_views=views,  # angles on [0, 180) degrees
            noise=0.01,  # Gaussian, relative to the clean sinogram's RMS (phantoms.measure)
            oversample=2,  # measured on a finer grid than the reconstruction's (inverse crime)
        )
    )
    c.model = ConfigDict(
        dict(
            size=size["size"],
            encoding=opts["encoding"],
            num_features=size["num_features"],
            hidden=size["hidden"],
            depth=size["depth"],
            steepness=(1.5, 3.0),  # NAB: k * pixel of the bins, assigned in turn
            anneal=(1.0, 0.0),  # NAB: k x factor from [0] up to 1 by fraction [1] of training
            theta_init="uniform",  # NAB: initial rotations, uniform | zero (README)
            mlp_init="torch",  # PyTorch's nn.Linear default | he (model._dense)
            rff_sigma=1.0,  # the pre-protocol run's choice; the experiment chooses its own
            frozen=(),  # NAB ablations: any of u, v, h, w, theta, k, lam
            impl="auto",
        )
    )
    set_training(c, steps=size["steps"], batch_size=views, lr=size["lr"])
    c.optim.name = "adam"
    c.optim.grad_clip = 0.0  # Adam is invariant to the loss scale (line integrals ~10-100)
    c.train.checkpoint_every = 0 if opts["size"] == "smoke" else c.train.checkpoint_every
    return c
