"""TPC training through `core.train`: the whole order-by-order schedule as one run.

    fit = fit_progressive(config, splits, workdir)          # the paper's method
    fit = fit_progressive(config, splits, workdir, freeze_earlier=False)   # the released code
    fit = fit_joint(config, splits, workdir)                # "max": all orders at once at order N
    fit = fit_joint(config, splits, workdir, every_truncation=True)  # "train_all": mean loss
    fit.params   # {"w0", "w1", "U", "lam"} numpy;  fit.stages: [(step, order, val F1)]

One `core.train.run` trains every stage (`make_method`): `config.train.steps` is split into
equal stages (N - 1 in progressive mode, stage s training order s + 2; one in joint mode),
and the step (`staged_step`: `core.steps.switch` over one branch per stage) finds its stage
from `state.step`. Per stage:
- trainable blocks (a [K] mask over U, lam): order n's alone (the paper), or every order
  <= n (`freeze_earlier=False`: the released code, whose freeze loop misses U and lam), or all
  (joint). Gradients are masked before clipping (frozen blocks take no share of the clip norm)
  and updates after the optimiser (AdamW's weight decay would move them), so frozen blocks stay
  bit-identical. Blocks above n are outside this truncation's loss and masked too, as the
  released code's AdamW skips parameters without gradients.
- joint modes train every block in one stage at order N: "joint" (the released code's "max")
  on the order-N truncation's loss alone, "joint_all" (its "train_all", which it uses for the
  EE-MLP) on the mean loss over every truncation, so the intermediate truncations are trained
  too (`model.train_logits_all`).
- a fresh optimiser: the state is re-initialised at the stage's first step (the switch's
  reset), so Adam's moments,
  its count and the learning-rate schedule (built over one stage) restart: the paper's LR reset.
- the loss: BCE on the truncation at n with term dropout (`model.train_logit`).
The linear term (sklearn, `linear.fit`) lives in `state.extra["linear"]`, never trained.
Everything is a function of `state.step`, so a run resumes mid-schedule from its checkpoint.
`evaluate` logs validation F1 at every order and at the stage's own (`eval/val_f1`), and test
F1 per order; with `train.eval_every` = one stage it runs at the end of each stage.
"""

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from core import data, optim, steps
from core import train as core_train
from core.errors import ConfigError
from core.method import Method
from methods.tpc import linear, model

MODES = ("progressive", "joint", "joint_all")


@dataclasses.dataclass(frozen=True)
class ProbeConfig:
    order: int = 5  # N
    rank: int = 16  # R, every order
    mode: str = "progressive"
    freeze_earlier: bool = True  # progressive: the paper (True) or the released code (False)
    dropout: float = 0.0  # term dropout p
    lam_std: float = model.LAM_STD
    impl: str = "auto"  # poly_probe.op's implementation

    def __post_init__(self):
        for name, low in (("order", 2), ("rank", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"model.{name}={value!r} must be an int >= {low}")
        if self.mode not in MODES:
            raise ConfigError(f"model.mode={self.mode!r} is unknown; expected one of: {MODES}")
        if not isinstance(self.freeze_earlier, bool):
            raise ConfigError(f"model.freeze_earlier={self.freeze_earlier!r} must be a bool")
        if not 0 <= self.dropout <= 1:
            raise ConfigError(f"model.dropout={self.dropout!r} must be in [0, 1]")

    @property
    def num_stages(self) -> int:
        return self.order - 1 if self.mode == "progressive" else 1


def probe_config(config) -> ProbeConfig:
    m = config.model
    return ProbeConfig(
        order=m.order,
        rank=m.rank,
        mode=m.mode,
        freeze_earlier=m.freeze_earlier,
        dropout=float(m.dropout),
        lam_std=float(m.lam_std),
        impl=m.impl,
    )


def stage_order(cfg: ProbeConfig, stage):
    """The truncation order that stage `stage` trains."""
    return stage + 2 if cfg.mode == "progressive" else cfg.order


def trainable(cfg: ProbeConfig, stage) -> jax.Array:
    """[K] float32: 1 for the blocks (order k + 2) trained in `stage`, else 0."""
    k_K = jnp.arange(cfg.order - 1)
    if cfg.mode != "progressive":
        return jnp.ones(k_K.shape, jnp.float32)
    on_K = (k_K == stage) if cfg.freeze_earlier else (k_K <= stage)
    return on_K.astype(jnp.float32)


def loss_fn(cfg: ProbeConfig, params, batch, *, rng, extra):
    """BCE of the truncation at `extra["order"]` (joint_all: the mean over every truncation),
    with term dropout."""
    order = extra["order"]
    Y_BN = model.logits({**extra["linear"], **params}, batch["x"], impl=cfg.impl)
    y_B = batch["y"].astype(jnp.float32)
    if cfg.mode == "joint_all":
        train_BN = model.train_logits_all(model.terms(Y_BN), cfg.dropout, rng)
        loss = jnp.mean(optax.sigmoid_binary_cross_entropy(train_BN, y_B[:, None]))
        logit_B = train_BN[:, -1]
    else:
        logit_B = model.train_logit(model.terms(Y_BN), order, cfg.dropout, rng)
        loss = jnp.mean(optax.sigmoid_binary_cross_entropy(logit_B, y_B))
    return loss, {"acc": jnp.mean((logit_B > 0) == (y_B > 0.5)), "order": order}


def keep_blocks(mask_K) -> optax.GradientTransformation:
    """Stateless: U's and lam's updates times the [K] block mask (0 for frozen blocks)."""

    def update(updates, state, params=None):
        del params
        return {
            "U": updates["U"] * mask_K[:, None, None],
            "lam": updates["lam"] * mask_K[:, None],
        }, state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def stage_tx(cfg: ProbeConfig, tx, stage: int) -> optax.GradientTransformation:
    """`tx` on stage `stage`'s trainable blocks: gradients masked before it (before clipping)
    and updates after it (after weight decay). The masks hold no state, so every stage's
    optimiser state has the same structure (the switch re-initialises it at stage starts)."""
    keep = keep_blocks(trainable(cfg, stage))
    return optax.chain(keep, tx, keep)


def staged_step(cfg: ProbeConfig, loss, tx, steps_per_stage: int):
    """Stage s for steps [s, s + 1) x steps_per_stage (the last stage runs on), each starting
    from a fresh optimiser state: `core.steps.switch` on the step count with a reset. Stage s
    is the core's gradient step with `stage_tx`, its loss seeing `extra["order"]`."""
    lengths = [steps_per_stage] * (cfg.num_stages - 1)

    def stage_step(stage):
        order = stage_order(cfg, stage)
        step = steps.gradient_step(loss, stage_tx(cfg, tx, stage))
        return steps.with_schedules(step, {"order": lambda _: jnp.int32(order)})

    return steps.switch(
        [stage_step(s) for s in range(cfg.num_stages)],
        steps.by_step(lengths),
        reset=steps.at_branch_start(lengths),
        tx=stage_tx(cfg, tx, 0),
    )


def steps_per_stage(config) -> int:
    return max(config.train.steps // probe_config(config).num_stages, 1)


def make_method(config, splits, probe: linear.Probe) -> Method:
    """The Method training `config`'s whole schedule on `splits` from the linear `probe`."""
    cfg = probe_config(config)
    D = splits.x_train.shape[1]
    sps = steps_per_stage(config)
    tx = optim.make(config.optim, sps)  # one stage long: the schedule restarts with the state
    loss = functools.partial(loss_fn, cfg)
    forward = jax.jit(lambda full, x: model.logits(full, x, impl=cfg.impl))

    def init(rng, batch_spec):
        del batch_spec
        p = model.init_params(
            D, cfg.order, cfg.rank, rng, linear=(probe.w0, probe.w1), lam_std=cfg.lam_std
        )
        return {
            "params": {"U": p["U"], "lam": p["lam"]},
            "linear": {"w0": p["w0"], "w1": p["w1"]},
        }

    def dataset(split, *, shard, seed):
        del split  # the probe trains on the train split; evaluate reads val and test
        arrays = {"x": splits.x_train, "y": splits.y_train}
        return data.in_memory(arrays, global_batch=config.train.batch_size, seed=seed, shard=shard)

    def evaluate(state, *, seed):
        del seed
        step = int(state.step)
        order = stage_order(cfg, min(max(step - 1, 0) // sps, cfg.num_stages - 1))
        full = {**state.extra["linear"], **state.params}
        Y_val = np.asarray(forward(full, splits.x_val))
        Y_test = np.asarray(forward(full, splits.x_test))
        y_val = splits.y_val.astype(np.float32)
        val_loss = optax.sigmoid_binary_cross_entropy(Y_val[:, order - 1], y_val).mean()
        out = {"order": order, "val_f1": model.f1_score(splits.y_val, Y_val[:, order - 1])}
        out["val_loss"] = float(val_loss)
        for n in range(1, cfg.order + 1):
            out[f"val_f1_o{n}"] = model.f1_score(splits.y_val, Y_val[:, n - 1])
            out[f"test_f1_o{n}"] = model.f1_score(splits.y_test, Y_test[:, n - 1])
        return out

    step = staged_step(cfg, loss, tx, sps)
    # Every stage's optimiser state has stage 0's structure (`stage_tx`).
    return Method(
        init=init,
        loss=loss,
        step=step,
        tx=stage_tx(cfg, tx, 0),
        dataset=dataset,
        evaluate=evaluate,
    )


class Fit(NamedTuple):
    params: dict  # {"w0", "w1", "U", "lam"} numpy
    probe: linear.Probe
    history: list  # core.train's rows
    stages: list  # [(step, order, validation F1 at that order)] at each evaluation


def with_epochs(config, n_train: int, epochs: int):
    """A copy of `config` whose stages are `epochs` passes over `n_train` examples each, with
    one evaluation at the end of every stage."""
    c = config.copy_and_resolve_references()
    per_stage = epochs * math.ceil(n_train / c.train.batch_size)
    c.train.steps = per_stage * probe_config(c).num_stages
    c.train.eval_every = per_stage
    c.train.log_every = per_stage
    return c


def fit(config, splits, workdir: str, *, probe=None, epochs=None, devices=None) -> Fit:
    """Train `config`'s schedule on `splits` (with `epochs` per stage if given, else
    `config.train.steps` in all) and return the full parameters."""
    if epochs is not None:
        config = with_epochs(config, len(splits.y_train), epochs)
    if probe is None:
        probe = linear.fit(splits.x_train, splits.y_train, splits.x_val, splits.y_val)
    method = make_method(config, splits, probe)
    result = core_train.run(config, method, workdir, devices=devices)
    state = result.state
    params = {k: np.asarray(v) for k, v in {**state.extra["linear"], **state.params}.items()}
    stages = [
        (row["step"], int(row["eval/order"]), row["eval/val_f1"])
        for row in result.history
        if "eval/val_f1" in row
    ]
    return Fit(params, probe, result.history, stages)


def _with_mode(config, mode: str, freeze_earlier: bool = True):
    c = config.copy_and_resolve_references()
    c.model.mode, c.model.freeze_earlier = mode, freeze_earlier
    return c


def fit_progressive(config, splits, workdir: str, *, freeze_earlier: bool = True, **kw) -> Fit:
    return fit(_with_mode(config, "progressive", freeze_earlier), splits, workdir, **kw)


def fit_joint(config, splits, workdir: str, *, every_truncation: bool = False, **kw) -> Fit:
    mode = "joint_all" if every_truncation else "joint"
    return fit(_with_mode(config, mode), splits, workdir, **kw)
