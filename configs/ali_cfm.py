"""ALI-CFM (adversarially learnt interpolants for multi-marginal flow matching).

    python -m launch.train --config=configs/ali_cfm.py:role=pretrain --workdir=/tmp/ali_p
    python -m launch.train --config=configs/ali_cfm.py:role=gan,pretrained=/tmp/ali_p \\
        --workdir=/tmp/ali_g
    python -m launch.train --config=configs/ali_cfm.py:role=cfm,interpolant=/tmp/ali_g \\
        --workdir=/tmp/ali_c
    python -m launch.train --config=configs/ali_cfm.py:role=mmfm,held_out=3 --workdir=/tmp/mm

Options: mesh (a preset in configs/common.py); size (smoke: tests | quick | small: a CPU
budget, GAN 5k steps of the paper's 70k); role (pretrain: G regressed onto coupled intermediate
knots | gan: G against D, RpGAN | cfm: the velocity on the frozen G of the run `interpolant`
names | icfm | otcfm | mmfm: the baselines | linear: the straight OT-paired path, no
intermediate); dataset (trimodal | knot | rotating_gmm | krumsiek11); held_out (the marginal
left out and evaluated; -1: none, every intermediate is evaluated); reg (linear | piecewise |
second_derivative | none: G's regulariser); pretrained (gan: a pretrain run's workdir, else G
starts fresh); interpolant (cfm: a gan run's workdir); normalise (yes: min-max to [0, 1] over
all times, as the official single-cell loader | no: raw coordinates, as its toy scripts);
coupling (pretrain and gan batches: full, the OT chain through every marginal | triple: only
x0 -> x_i -> x1).
"""

from ml_collections import ConfigDict

from configs.common import base_config, choose, parse_arg
from core.declarations import Declarations
from core.errors import ConfigError

ROLES = ("pretrain", "gan", "cfm", "icfm", "otcfm", "mmfm", "linear")  # methods/ali_cfm ROLES
DATASETS = ("trimodal", "knot", "rotating_gmm", "krumsiek11")
REGS = ("linear", "piecewise", "second_derivative", "none")
STAGE = {"pretrain": 0, "gan": 1}  # index into SIZES' steps; every flow role is stage 2
SIZES = {
    # steps (pretrain, gan, flow), batch, width (G, D and u_theta), W1 samples per marginal.
    # small: a CPU budget (pretrain 1k, GAN 5k of the paper's 70k, CFM 2k); quick: less.
    "smoke": dict(steps=(2, 2, 2), batch=16, width=8, eval_samples=32),
    "quick": dict(steps=(200, 1500, 300), batch=128, width=64, eval_samples=300),
    "small": dict(steps=(1000, 5000, 2000), batch=128, width=64, eval_samples=1000),
}
LR = {"pretrain": 1e-3, "gan": 5e-5}  # the official GAN lr for G and D; 1e-3 elsewhere

DECLARATIONS = Declarations(largest="size=small", largest_overrides={"train.batch_size": 256})


def _int(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not an integer") from None


def get_config(arg: str | None = None) -> ConfigDict:
    opts = parse_arg(
        arg,
        {
            "mesh": "auto",
            "size": "small",
            "role": "gan",
            "dataset": "trimodal",
            "held_out": "-1",
            "reg": "linear",
            "pretrained": "",
            "interpolant": "",
            "normalise": "yes",
            "coupling": "full",
        },
    )
    size = choose("size", opts["size"], SIZES)
    role = choose("role", opts["role"], ROLES)
    c = base_config(opts["mesh"])
    c.method = "ali_cfm"
    c.dtype = "float32"  # small MLPs and an ODE solve: no bfloat16
    steps = size["steps"][STAGE.get(role, 2)]
    c.train.steps = steps
    c.train.batch_size = size["batch"]
    c.train.log_every = max(1, min(100, steps // 10))
    c.train.checkpoint_every = steps  # the final state, which the next stage reads
    c.train.eval_every = 0  # W1 at the end
    # The official: plain Adam at a constant rate, no clipping, no warmup.
    c.optim.name = "adam"
    c.optim.lr = LR.get(role, 1e-3)
    c.optim.schedule = "constant"
    c.ali = ConfigDict(
        dict(
            role=role,
            dataset=choose("dataset", opts["dataset"], DATASETS),
            data_seed=0,  # the data set's draw (fixed; config.seed drives batches and init)
            data_options={},  # the data set's own options (data.load's keywords), e.g. knot's k
            # Min-max to [0, 1] over all times (the official single-cell loader); its toy
            # scripts (trimodal, knot) train on raw coordinates.
            normalise=choose("normalise", opts["normalise"], {"yes": True, "no": False}),
            held_out=_int("held_out", opts["held_out"]),
            gan="rpgan",  # losses.GANS
            reg=choose("reg", opts["reg"], REGS),
            # pretrain / gan batches: "full" chains every training marginal by OT (the
            # official); "triple" only x0 -> x_i -> x1, the knots those stages read.
            coupling=choose("coupling", opts["coupling"], ("full", "triple")),
            reg_weight=1.0,  # the official `correct_coeff`
            width=size["width"],
            pretrained=opts["pretrained"],  # gan: a pretrain run's workdir ("": fresh G)
            interpolant=opts["interpolant"],  # cfm: a gan run's workdir
            eval_samples=size["eval_samples"],  # per marginal, for W1 (0: no evaluation)
        )
    )
    return c
