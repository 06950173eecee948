"""ALI-CFM: multi-marginal flow matching with adversarially learnt interpolants.

- `data.py`: the trimodal, knot, rotating-GMM and krumsiek11 marginals, min-max normalised,
  and the leave-one-out split of the official evaluation.
- `batches.py`: host batches, one draw per training marginal per example, OT-chained.
- `nets.py`: the interpolant G, the discriminator and the velocity field as pure functions.
- `losses.py`: pretraining, the GAN pair with its regularisers, the CFM loss on the frozen
  interpolant, the baselines' losses; `paths.py`: the baselines' fixed paths.
- `evaluation.py`: W1 in data units of the flow (dopri5) or of G against the marginals.
- here: `make(config) -> Method` for `core.train`, by `config.ali.role`:
  pretrain: G regressed onto the coupled intermediate knot; gan: D then G each step
  (`core.steps.alternating_step`), G from the `pretrained` run or fresh; cfm: u_theta on the
  frozen G of the `interpolant` run; icfm | otcfm | mmfm: the baselines (u_theta alone);
  linear: flow matching on the straight OT-paired path x0 -> x1, no intermediate marginal read.

    python -m launch.train --config=configs/ali_cfm.py:role=pretrain --workdir=/tmp/ali_p
    python -m launch.train --config=configs/ali_cfm.py:role=gan,pretrained=/tmp/ali_p \\
        --workdir=/tmp/ali_g
    python -m launch.train --config=configs/ali_cfm.py:role=cfm,interpolant=/tmp/ali_g \\
        --workdir=/tmp/ali_c
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from core import checkpoint, optim, steps
from core import data as pipeline  # `data` is this package's data.py (a submodule attribute)
from core.errors import ConfigError
from core.method import Method
from core.precision import compute_dtype
from methods.ali_cfm import batches, evaluation, losses, nets
from methods.ali_cfm import data as ali_data

ROLES = ("pretrain", "gan", "cfm", "icfm", "otcfm", "mmfm", "linear")
FLOW_ROLES = (
    "cfm",
    "icfm",
    "otcfm",
    "mmfm",
    "linear",
)  # a velocity field: evaluated by its ODE flow
GAN_ROLES = ("pretrain", "gan")  # read the batch's intermediate knot


def _check(config) -> None:
    a = config.ali
    if a.role not in ROLES:
        raise ConfigError(f"ali.role={a.role!r}; expected one of: {', '.join(ROLES)}")
    if a.gan not in losses.GANS:
        raise ConfigError(f"ali.gan={a.gan!r}; expected one of: {', '.join(losses.GANS)}")
    if a.coupling not in ("full", "triple"):
        raise ConfigError(f"ali.coupling={a.coupling!r}; expected one of: full, triple")
    if a.reg not in losses.REGULARISERS:
        raise ConfigError(f"ali.reg={a.reg!r}; expected one of: {', '.join(losses.REGULARISERS)}")
    if not a.reg_weight >= 0:
        raise ConfigError(f"ali.reg_weight={a.reg_weight}; must be >= 0")
    for field in ("width", "eval_samples"):
        value, low = a[field], 1 if field == "width" else 0
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"ali.{field}={value!r}; must be an integer >= {low}")
    if a.pretrained and a.role != "gan":
        raise ConfigError(f"ali.pretrained={a.pretrained!r} is for role=gan, not {a.role}")
    if a.interpolant and a.role != "cfm":
        raise ConfigError(f"ali.interpolant={a.interpolant!r} is for role=cfm, not {a.role}")
    if a.role == "cfm" and not a.interpolant:
        raise ConfigError("ali.interpolant is empty; role=cfm needs a gan run's workdir")


def interpolant_params(workdir: str, dim: int, width: int, option: str) -> dict:
    """G's params from the run in `workdir` (a pretrain or gan run: only "g" is read), numpy."""
    init = lambda k: {"g": nets.init_interpolant(k, dim, width)}
    params = checkpoint.run_params(workdir, init, what=f"ali.{option}")
    return jax.tree.map(np.asarray, params["g"])


def gan_batch(times_K, batch):
    """(x0, x1, xt, t_B) of a coupled batch: the endpoints and the knot at index i_B."""
    x_BKD, i_B = batch["x_BKD"], batch["i_B"]
    xt_BD = jnp.take_along_axis(x_BKD, i_B[:, None, None], axis=1)[:, 0]
    return x_BKD[:, 0], x_BKD[:, -1], xt_BD, jnp.asarray(times_K, x_BKD.dtype)[i_B]


def pretrain_objective(times_K, params, batch, *, rng, extra=None):
    del extra
    return losses.pretrain_loss(params["g"], *gan_batch(times_K, batch), rng), {}


def d_objective(times_K, gan, params, batch, *, rng, extra=None):
    """D's phase. G's sample is rebuilt from the step's rng, the same key `g_objective` gets."""
    del extra
    return losses.d_loss(params["d"], params["g"], *gan_batch(times_K, batch), rng, gan=gan), {}


def g_objective(times_K, gan, reg, reg_weight, params, batch, *, rng, extra=None):
    del extra
    args = gan_batch(times_K, batch)
    return losses.g_loss(
        params["g"], params["d"], *args, rng, gan=gan, reg=reg, reg_weight=reg_weight
    )


def flow_objective(role, times_K, params, batch, *, rng, extra=None):
    """The flow-matching loss of `role` at t ~ U[0, 1] per row."""
    del extra
    x_BKD = batch["x_BKD"]
    t_B = jax.random.uniform(rng, x_BKD.shape[:1], x_BKD.dtype)
    x0_BD, x1_BD, v = x_BKD[:, 0], x_BKD[:, -1], params["v"]
    if role == "cfm":
        return losses.cfm_loss(v, params["g"], x0_BD, x1_BD, t_B), {}
    if role in ("icfm", "linear"):  # x0, x1 independent (icfm) or paired by OT (linear)
        return losses.icfm_loss(v, x0_BD, x1_BD, t_B), {}
    knots_KBD = jnp.swapaxes(x_BKD, 0, 1)
    path_loss = losses.piecewise_cfm_loss if role == "otcfm" else losses.mmfm_loss
    return path_loss(v, knots_KBD, jnp.asarray(times_K, x_BKD.dtype), t_B), {}


def gan_step(phases, state, batch, *, rng):
    """D's phase then G's (`phases`, one rng for both); "loss" is G's objective, the
    model this stage delivers (the logger and the generic tests read a "loss")."""
    state, metrics = phases(state, batch, rng=rng)
    return state, {"loss": metrics["g/loss"], **metrics}


def _adam_pair(config) -> optim.Scoped:
    """G and D each with their own optimiser of `config.optim` (the official: Adam, 5e-5)."""
    make = lambda: optim.make(config.optim, config.train.steps)
    return optim.scoped([(r"^g/", "g"), (r"^d/", "d")], {"g": make(), "d": make()})


def data_of(config) -> ali_data.Marginals:
    """The marginals `config.ali` names (data set, draw, normalisation, the set's options)."""
    a = config.ali
    options = dict(a.data_options)
    return ali_data.load(a.dataset, seed=a.data_seed, normalise=a.normalise, **options)


def make(config) -> Method:
    _check(config)
    compute_dtype(config.dtype, ("float32",), "small MLPs and an ODE solve in float32")
    a = config.ali
    marginals = data_of(config)
    K = len(marginals.times)
    if a.held_out != -1 and not (isinstance(a.held_out, int) and 0 < a.held_out < K - 1):
        raise ConfigError(f"ali.held_out={a.held_out!r}; -1 (none) or 0 < k < {K - 1}")
    split = batches.split_marginals(marginals, a.held_out)
    times_K = tuple(float(t) for t in split.train.times)  # static: baked into the step
    dim, width, role = split.train.samples[0].shape[1], a.width, a.role
    gan = role in GAN_ROLES
    if gan and len(split.train.times) < 3:
        raise ConfigError(
            f"ali.held_out={a.held_out} leaves {a.dataset} no intermediate marginal for {role}"
        )

    frozen = None
    if role == "gan" and a.pretrained:
        frozen = interpolant_params(a.pretrained, dim, width, "pretrained")
    if role == "cfm":
        frozen = interpolant_params(a.interpolant, dim, width, "interpolant")

    def init(rng, batch_spec):
        del batch_spec
        k_g, k_d, k_v = jax.random.split(rng, 3)
        g = frozen if frozen is not None else nets.init_interpolant(k_g, dim, width)
        if role == "pretrain":
            return {"params": {"g": g}}
        if role == "gan":
            return {"params": {"g": g, "d": nets.init_discriminator(k_d, dim, width)}}
        v = nets.init_velocity(k_v, dim, width)
        return {"params": {"v": v, "g": g} if role == "cfm" else {"v": v}}

    def dataset(split_name, *, shard, seed):
        del split_name  # only "train": evaluation is the host's W1
        train = split.train
        if role == "linear":  # the endpoints alone, paired by OT: no intermediate is read
            train = train._replace(
                times=train.times[[0, -1]], samples=train.samples[:: len(train.samples) - 1]
            )
        coupling = "independent" if role == "icfm" else a.coupling if gan else "full"
        examples = batches.examples_fn(train, seed, coupling=coupling, gan=gan)
        return pipeline.synthetic(
            examples_fn=examples,
            global_batch=config.train.batch_size,
            seed=seed,
            shard=shard,
            indexed=True,
        )

    def evaluate(state, *, seed):
        params = jax.device_get(state.params)
        if role in FLOW_ROLES:
            return evaluation.flow_w1(params["v"], split, n=a.eval_samples, seed=seed)
        return evaluation.interpolant_w1(params["g"], split, n=a.eval_samples, seed=seed)

    common = dict(init=init, dataset=dataset, evaluate=evaluate if a.eval_samples else None)
    if role == "pretrain":
        loss = functools.partial(pretrain_objective, times_K)
        return Method(loss=loss, tx=optim.make(config.optim, config.train.steps), **common)
    if role == "gan":
        tx = _adam_pair(config)
        d_loss = functools.partial(d_objective, times_K, a.gan)
        g_loss = functools.partial(g_objective, times_K, a.gan, a.reg, float(a.reg_weight))
        phases = steps.alternating_step([("d", ["d"], d_loss), ("g", ["g"], g_loss)], tx)
        return Method(step=functools.partial(gan_step, phases), tx=tx, **common)
    tx = optim.make(config.optim, config.train.steps)
    if role == "cfm":  # G frozen: no optimiser state, never differentiated, bitwise kept
        tx = optim.scoped([(r"^v/", "v"), (r"^g/", None)], {"v": tx})
    return Method(loss=functools.partial(flow_objective, role, times_K), tx=tx, **common)
