"""Oracle-efficient hybrid online learning (paper 12 of PAPERS.md): FTRL with a
truncated-entropy regulariser, solved by Frank-Wolfe over an exact ERM (linear) oracle.

- `classes.py`: thresholds / reversed thresholds / intervals on [0, 1] and their exact oracles
  (a sort and a cumulative sum), losses (squared, absolute, the game's bilinear payoff), data.
- `learner.py`: the learner as pure functions over fixed-size padded buffers: `init(T_max)`,
  `decide` (Frank-Wolfe on the two-weight objective), `update`, `step(state, x_t, r_t)`.
- `learners.py`: the same interface for the baselines: FTL/ERM, Hedge over a threshold grid,
  a Wu-2024-style FTPL. `simulate.py`: the adversaries and T rounds as one `lax.scan`.
- `game.py`: the games corollary (a bilinear game on thresholds, empirical best responses).
- `reference.py`: the learner in NumPy (tests and the benchmark's baseline).
- `experiment.py`, `bench.py`: the numerical study and the speed figures.
- here: `make(config) -> Method` for `core.train`: no loss, no optimiser. The state's params
  are the learner's buffers; each step plays `train.batch_size` rounds in order (the dataset
  gives x_t; the adversary, inside the step, draws from the step's key) through the
  experiment's round body (`simulate.play_rounds`), so a run of `train.steps` steps is
  T = steps * batch_size rounds, checkpointed and resumed like any run, and equal round by round
  to `simulate.rounds` on the same x_t and keys (tests/methods/test_hybrid_online.py).

    python -m launch.train --config=configs/hybrid_online.py --workdir=/tmp/hybrid
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from core import data, precision
from core.errors import ConfigError
from core.method import Method
from methods.hybrid_online import learner as ftrl
from methods.hybrid_online import learners
from methods.hybrid_online.classes import (
    DISTRIBUTIONS,
    H_CLASSES,
    LOSSES,
    R_CLASSES,
    best_fixed_loss,
)
from methods.hybrid_online.simulate import ADVERSARIES, adversary, play_rounds


def _check(name: str, value, known) -> None:
    if value not in known:
        raise ConfigError(
            f"hybrid.{name}={value!r} is unknown; expected one of: {', '.join(known)}"
        )


def horizon(config) -> int:
    return config.train.steps * config.train.batch_size


def settings_from(config) -> ftrl.Settings:
    h = config.hybrid
    _check("h_class", h.h_class, H_CLASSES)
    _check("r_class", h.r_class, R_CLASSES)
    _check("loss", h.loss, tuple(LOSSES))
    _check("adversary", h.adversary, ADVERSARIES)
    _check("distribution", h.distribution, DISTRIBUTIONS)
    precision.compute_dtype(
        config.dtype,
        ("float32",),
        "through core.train; the experiment runs the same functions in float64",
    )
    T = horizon(config)
    if T < 2:
        raise ConfigError(f"train.steps * train.batch_size = {T}: the horizon needs T >= 2 rounds")
    return ftrl.settings(
        T,
        h_class=h.h_class,
        loss=h.loss,
        eta_scale=h.eta_scale,
        gap_scale=h.gap_scale,
        max_iters=h.max_iters,
    )


def init(rng, batch_spec, *, T: int):
    state = ftrl.init(T, jnp.float32)
    b = state.buffer
    params = {"x": b.x, "w0": b.w0, "w1": b.w1, "n": b.n}
    params |= {"up_sum": state.up_sum, "down_sum": state.down_sum}
    history = {"x": jnp.full((T,), jnp.inf), "y": jnp.zeros((T,)), "loss": jnp.zeros((T,))}
    return {"params": params, "history": history}


def _as_state(p) -> ftrl.FTRLState:
    return ftrl.FTRLState(ftrl.Buffer(p["x"], p["w0"], p["w1"], p["n"]), p["up_sum"], p["down_sum"])


def _as_params(state: ftrl.FTRLState) -> dict:
    b = state.buffer
    return {"x": b.x, "w0": b.w0, "w1": b.w1, "n": b.n, "up_sum": state.up_sum,
            "down_sum": state.down_sum}  # fmt: skip


def step(state, batch, *, rng, s: ftrl.Settings, choose):
    """`train.batch_size` rounds in order, by the experiment's own round body
    (`simulate.play_rounds`, round t's key the t-th of the step key's split); metrics: the
    step's mean loss, the largest gap, the oracle calls, and the regret so far against the exact
    best fixed hypothesis."""
    x_B = batch["x"]
    start = state.params["n"]  # rounds played before this step
    learner_state, played = play_rounds(
        learners.ftrl_fw(s),
        choose,
        _as_state(state.params),
        x_B,
        jax.random.split(rng, x_B.shape[0]),
        loss=s.loss,
    )
    history = {
        name: jax.lax.dynamic_update_slice(state.extra["history"][name], values_B, (start,))
        for name, values_B in (("x", x_B), ("y", played.label_T), ("loss", played.loss_T))
    }
    valid_T = jnp.arange(s.T) < learner_state.buffer.n
    best = best_fixed_loss(history["x"], history["y"], LOSSES[s.loss], s.h_class, valid_T)
    metrics = {
        "loss": jnp.mean(played.loss_T),
        "gap_max": jnp.max(played.gap_T) / s.eta,  # on F_t: compare with epsilon
        "oracle_calls": jnp.sum(played.calls_T),
        "regret": jnp.sum(history["loss"]) - best,
        "rounds": learner_state.buffer.n,
    }
    new_state = state.replace(
        params=_as_params(learner_state), extra={**state.extra, "history": history}
    )
    return new_state, metrics


def make(config) -> Method:
    s = settings_from(config)
    h = config.hybrid
    choose = adversary(h.adversary, distribution=h.distribution, loss=h.loss, r_class=h.r_class)
    distribution = h.distribution

    def example(rng: np.random.Generator):
        if distribution == "uniform":
            return {"x": np.float32(rng.uniform())}
        return {"x": np.float32(rng.beta(2.0, 5.0))}

    def dataset(split, *, shard, seed):
        if split != "train":
            raise ConfigError(f"hybrid_online has no {split!r} split: it is evaluated by regret")
        return data.synthetic(example, global_batch=config.train.batch_size, seed=seed, shard=shard)

    return Method(
        init=functools.partial(init, T=s.T),
        step=functools.partial(step, s=s, choose=choose),
        dataset=dataset,
    )
