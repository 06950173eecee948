"""THE training loop: `run(config, method, workdir)`, and `init(config, method)` for notebooks.

Both share one setup (`init`): the mesh, shardings from rules, the sharded initial state (with
host arrays placed, or parameters restored with `train.init_from`: another run's workdir, or
`pretrained:<name or path>`, a checkpoint `core.pretrained` loads), the jitted
step with donation, the jitted evaluation step, and the data iterator turned into global
arrays. A method that trains nothing (no loss, no step) gets an evaluate-only run. A notebook
can step by hand:

    session = core.train.init(config, method)
    rows = session.train(10)          # session.state is now the state after 10 steps
"""

import dataclasses
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import numpy as np
from etils import epath
from jax.sharding import Mesh

from core import (
    data,
    evaluation,
    optim,
    precision,
    preemption,
    profile,
    sharding,
    storage,
    validate,
)
from core import metrics as metrics_lib
from core import workdir as workdir_lib
from core.checkpoint import Checkpointer, abstract_with_shardings
from core.errors import ConfigError, method_name
from core.initial_state import (  # noqa: F401 (re-exported: train.place, train.seed_key, ...)
    check_init_from,
    host_leaves,
    initial_state,
    make_state_fn,
    place,
    restore_params,
    seed_key,
    with_host_leaves,
)
from core.mesh import make_mesh
from core.method import Method
from core.metrics import MetricsLogger
from core.state import TrainState
from core.steps import gradient_step


@dataclasses.dataclass
class Session:
    """A ready-to-step training setup. `step` is jitted and donates its state argument."""

    config: Any
    method: Method
    mesh: Mesh
    state: TrainState
    step: Callable[[TrainState, Any], tuple[TrainState, dict]] | None  # None: trains nothing
    data_iter: Iterator | None  # None: the method has no dataset (its step gets batch=None)
    state_shardings: Any
    batch_sharding: Any
    streams: tuple[evaluation.Stream, ...] = ()  # evaluation streams, eval steps jitted

    def next_batch(self):
        if self.data_iter is None:
            return None
        return data.to_global(next(self.data_iter), self.batch_sharding)

    def train(self, num_steps: int = 1) -> list[dict[str, float]]:
        """Advance `self.state` by `num_steps` steps on the next batches; returns each step's
        metrics as host floats. The session always holds the current state (the jitted step
        donates the old one), so a notebook cell calling this can be run again."""
        if self.step is None:
            raise ConfigError("this method trains nothing (no loss, no step): use evaluate()")
        rows = []
        for _ in range(num_steps):
            self.state, metrics = self.step(self.state, self.next_batch())
            step = int(self.state.step)
            rows.append({"step": step, **metrics_lib.to_host(metrics)})
            self.state = apply_hook(self, self.state, step)
        return rows

    def evaluate(self, state: TrainState | None = None) -> dict[str, float]:
        """Every evaluation stream of `state` (default: the session's): each eval step over one
        pass of its split on the mesh, then its host `evaluate`; host floats, keyed
        ``<metric>`` (the method's own stream) and ``<name>/<metric>`` (named ones)."""
        return evaluate(self, self.state if state is None else state)


@dataclasses.dataclass
class RunResult:
    state: TrainState
    history: list[dict[str, float]]  # one row per step (+ eval rows), as written to JSONL
    preempted: bool = False  # stopped early by SIGTERM, after saving a checkpoint


def _optimiser(config, method: Method):
    """The optimiser: the config's for the core's gradient step, else the method's own (or none)."""
    if method.step is not None or method.loss is None:
        return method.tx
    if isinstance(method.tx, Mapping):
        raise ConfigError(
            "Method.tx is a dict of optimisers but the method has no step to use them: give "
            "a step (e.g. core.steps.switch) or a single transformation"
        )
    return method.tx or optim.make(config.optim, config.train.steps)


def _train_step(method_step: Callable, mesh: Mesh) -> Callable:
    def train_step(state: TrainState, batch):
        # The mesh is visible while tracing (`jax.sharding.get_abstract_mesh()`), so a method can
        # put a Pallas kernel, which XLA cannot partition, under `jax.shard_map`.
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            rng = jax.random.fold_in(state.rng, state.step)
            new_state, metrics = method_step(state, batch, rng=rng)
            return new_state.replace(step=state.step + 1), metrics

    return train_step


@dataclasses.dataclass
class Plan:
    """What a run compiles, with nothing materialised: the mesh, the state's abstract shapes and
    shardings, the batch's, and the jitted steps. `init` builds a Session from it; an
    ahead-of-time compile (`core.aot`) traces the same `step` for another platform's devices."""

    mesh: Mesh
    make_state: Callable[[Any], TrainState]  # of `seed_key(config.seed)`
    abstract_state: Any  # ShapeDtypeStructs of the TrainState
    state_shardings: Any
    batch_spec: Any  # ShapeDtypeStructs of one global batch (None: no batch)
    batch_sharding: Any
    step: Callable | None  # jitted, donates the state; None: the method trains nothing
    streams: tuple[evaluation.Stream, ...] = ()

    @property
    def eval_step(self) -> Callable | None:
        """The jitted eval step of the method's own stream ("eval"), or of its first named one."""
        return next((s.eval_step for s in self.streams if s.eval_step is not None), None)


def _batch_spec(config, method: Method, mesh: Mesh):
    """The spec of one global training batch (None: the method has no dataset), checked
    against `train.batch_size`. A separate iterator gives it, leaving the run's own untouched."""
    if method.dataset is None:
        return None
    sharding.check_batch_size(config.train.batch_size, mesh)
    spec = evaluation.first_batch(config, method, "train", "training")
    leading = {x.shape[0] for x in jax.tree.leaves(spec)}
    if leading != {config.train.batch_size}:
        raise ConfigError(
            f"{method_name(config)}: the dataset yields global batches of {sorted(leading)} but "
            f"train.batch_size={config.train.batch_size}"
        )
    return spec


def plan(config, method: Method, *, devices=None) -> Plan:
    """The mesh over `devices` (default: all of `jax.devices()`), the state and batch layouts
    and the jitted steps (training and every evaluation stream) of `config` and `method`. The
    batch shapes come from one batch of each split read; no array is placed on a device, and
    nothing is written. `devices` may be another platform's (`jax.experimental.topologies`):
    the result can then be compiled, not run."""
    with validate.naming(config):  # every error names the method
        return _plan(config, method, devices)


def _plan(config, method: Method, devices) -> Plan:
    validate.config(config)
    profile.parse(config.train.get("profile", ""), config.train.steps, method=method_name(config))
    if method.needs_init_from and not config.train.get("init_from"):
        raise ConfigError(
            f"{method_name(config)}: evaluates another run's parameters: set train.init_from to "
            "that run's workdir"
        )
    mesh = make_mesh(config.mesh, devices)
    tx = _optimiser(config, method)
    batch_sharding = sharding.batch_sharding(mesh)
    batch_spec = _batch_spec(config, method, mesh) if method.trains else None
    # Every program the core traces (init, step, eval step) gets the config's matmul precision.
    with_precision = functools.partial(precision.traced_with, config)
    # An evaluate-only method's init sees the batch of the split it evaluates.
    if batch_spec is None and not method.trains and method.dataset is not None:
        batch_spec = _eval_spec(config, method)
    make_state = with_precision(make_state_fn(method, tx, batch_spec))
    abstract = jax.eval_shape(make_state, seed_key(config.seed))
    check_init_from(config.train.get("init_from", ""), abstract.params)  # pretrained: metadata
    state_shardings = sharding.tree_shardings(
        abstract, mesh, method.sharding_rules, config.get("fsdp_min_size", 2**14)
    )
    streams = evaluation.streams(config, method, mesh, state_shardings, batch_sharding)
    if not method.trains and not streams:
        raise ConfigError("no loss, no step and no evaluation: nothing to run")
    step = None
    if method.trains:
        method_step = method.step or gradient_step(method.loss, tx)
        step = jax.jit(
            with_precision(_train_step(method_step, mesh)),
            in_shardings=(state_shardings, batch_sharding if batch_spec is not None else None),
            out_shardings=(state_shardings, sharding.replicated(mesh)),
            donate_argnums=(0,),
        )
    return Plan(
        mesh, make_state, abstract, state_shardings, batch_spec, batch_sharding, step, streams
    )


def _eval_spec(config, method: Method):
    """The batch spec an evaluate-only method's `init` sees: its first stream's split."""
    for ev in evaluation.declared(method):
        if ev.eval_step is not None:
            return evaluation.first_batch(config, method, ev.split, "evaluation")
    return evaluation.first_batch(config, method, "eval", "evaluation")


def init(config, method: Method, *, devices=None) -> Session:
    """Build the mesh, the sharded initial state, the jitted steps and the data iterator.

    `devices` restricts the mesh to a subset of `jax.devices()` (e.g. one device in a notebook).
    """
    return start_session(config, method, plan(config, method, devices=devices))


def start_session(config, method: Method, p: Plan, *, seed=None, dataset=None) -> Session:
    """A Session of `p` (a `plan` of `config` and `method`) from the initial state of `seed`
    (default `config.seed`) reading `dataset` (default `method.dataset`; one of the same batch
    shapes): many seeds or data streams of one compiled program (an experiment's arms)."""
    seed = config.seed if seed is None else seed
    dataset = method.dataset if dataset is None else dataset
    data_iter = None
    if method.trains and dataset is not None:
        data_iter = dataset("train", shard=(jax.process_index(), jax.process_count()), seed=seed)
    state = initial_state(p.make_state, seed_key(seed), p.state_shardings)
    if config.train.get("init_from"):
        state = restore_params(state, p.state_shardings, config.train.init_from)
    return Session(
        config,
        method,
        p.mesh,
        state,
        p.step,
        data_iter,
        p.state_shardings,
        p.batch_sharding,
        p.streams,
    )


def evaluate(session: Session, state: TrainState, streams=None) -> dict:
    """The metrics of `streams` (default: every evaluation stream of the session) on `state`."""
    streams = session.streams if streams is None else streams
    return evaluation.evaluate(
        streams, session.config, session.method, state, session.batch_sharding, session.mesh
    )


def _leaf_type(x) -> tuple:
    return tuple(np.shape(x)), np.dtype(x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype)


def apply_hook(session: Session, state: TrainState, step: int) -> TrainState:
    """`state`, or the state `Method.hook` returns after `step`, placed with the state's
    shardings (a hook may return host arrays)."""
    if session.method.hook is None:
        return state
    with precision.scope(session.config):
        new = session.method.hook(state, step=step)
    if new is None:
        return state
    if jax.tree.structure(new) != jax.tree.structure(state):
        raise ConfigError(
            f"Method.hook at step {step} returned a state whose structure differs from the "
            "train state's (it must replace values, not add or drop leaves)"
        )
    old_leaves = jax.tree.leaves(state)
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(new)[0], old_leaves, strict=True):
        if _leaf_type(a) != _leaf_type(b):
            raise ConfigError(
                f"Method.hook at step {step} changed {sharding.path_str(path)} from "
                f"{_leaf_type(b)} to {_leaf_type(a)}; a hook may change values only"
            )
    return jax.tree.map(place, new, session.state_shardings)


def run(
    config,
    method: Method,
    workdir: epath.PathLike,
    *,
    devices=None,
    allow_config_change: bool = False,
) -> RunResult:
    """Train `method` for `config.train.steps`, resuming from `workdir` if it holds a checkpoint.

    SIGTERM (preemption) saves a checkpoint at the current step and returns early with
    `preempted=True` (inside `core.cache.cached` it raises `core.preemption.Preempted`
    instead); the same call later continues from there. A method that trains nothing
    (no loss, no step) is evaluated once (`evaluate_only`).
    """
    p = plan(config, method, devices=devices)  # every check before anything is written
    events = metrics_lib.tensorboard_dir(config, workdir)
    workdir = storage.prepare_workdir(workdir)
    is_main = jax.process_index() == 0
    config_json = config.to_dict()
    workdir_lib.check_and_record_config(
        workdir, config_json, allow_change=allow_config_change, write=is_main
    )
    session = start_session(config, method, p)
    if not method.trains:
        return evaluate_only(session, workdir)
    train = config.train
    ckpt = Checkpointer(workdir / "checkpoints", max_to_keep=train.keep_checkpoints)
    target = abstract_with_shardings(session.state, session.state_shardings)
    state = ckpt.restore_latest_good(target, session.data_iter) or session.state
    start = int(state.step)
    if is_main:
        # Also at step 0: a run killed before its first checkpoint committed left rows to drop.
        workdir_lib.rewind_metrics(workdir, start)
        if start:
            print(f"resumed from {ckpt.directory}/{start}", flush=True)
    logger = MetricsLogger(
        workdir,
        total_steps=train.steps,
        global_batch=train.batch_size if method.dataset is not None else 0,
        log_every=train.log_every,
        write=is_main,
        tensorboard_dir=events,
        tensorboard_resume_step=start,
    )
    profiler = profile.StepProfiler(
        train.get("profile", ""), train.steps, workdir, write=is_main, method=method_name(config)
    )
    watcher = preemption.PreemptionWatcher()
    step, preempted = start, False
    every = train.eval_every
    try:
        for step in range(start + 1, train.steps + 1):
            profiler.before(step)
            state, metrics = session.step(state, session.next_batch())
            profiler.after(step, (state, metrics))
            logger.push(step, metrics)
            state = apply_hook(session, state, step)
            if train.checkpoint_every and step % train.checkpoint_every == 0:
                logger.flush()  # this step's row is stored before its checkpoint can commit
                ckpt.save(step, state, session.data_iter, config_json)
            last = step == train.steps  # every stream due now shares this step's row
            due = [
                s
                for s in session.streams
                if s.periodic_at(step, every) or (last and s.at_end(train.steps, every))
            ]
            if due:
                logger.flush()
                logger.log_eval(step, evaluate(session, state, due))
            if step < train.steps and watcher.should_stop(step):
                preempted = True
                break
        logger.flush()  # every row stored before the last checkpoint
        if step > start and ckpt.latest_step() != step and (preempted or train.checkpoint_every):
            ckpt.save(step, state, session.data_iter, config_json)
        if preempted:
            preemption.mark()
            if is_main:
                print(f"preempted: checkpoint saved at step {step}; rerun to continue", flush=True)
        elif step == start and (due := [s for s in session.streams if s.at_end(step, every)]):
            # A finished run started again: its final evaluation, as at its end.
            logger.log_eval(step, evaluate(session, state, due))
    finally:
        profiler.close()
        watcher.close()
        logger.close()
        ckpt.close()
    if preempted:
        preemption.raise_if_raising()  # inside core.cache.cached: after the checkpoint closed
    return RunResult(state=state, history=logger.history, preempted=preempted)


def evaluate_only(session: Session, workdir: epath.Path) -> RunResult:
    """The run of a method that trains nothing: its initial state (init, host weights or
    `train.init_from`) evaluated once, logged at step 0 like any evaluation."""
    logger = MetricsLogger(
        workdir,
        total_steps=0,
        global_batch=0,
        log_every=1,
        write=jax.process_index() == 0,
        tensorboard_dir=metrics_lib.tensorboard_dir(session.config, workdir),
    )
    try:
        logger.log_eval(0, evaluate(session, session.state))
    finally:
        logger.close()
    return RunResult(state=session.state, history=logger.history)
