"""THE training loop: `run(config, method, workdir)`, and `init(config, method)` for notebooks.

Both share one setup (`init`): the mesh, shardings from rules, the sharded initial state (with
host arrays placed, or parameters restored from another run with `train.init_from`), the jitted
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
import jax.numpy as jnp
import numpy as np
from etils import epath
from jax.sharding import Mesh

from core import data, optim, precision, preemption, sharding, storage
from core import metrics as metrics_lib
from core import workdir as workdir_lib
from core.checkpoint import Checkpointer, abstract_with_shardings
from core.errors import ConfigError
from core.mesh import data_parallel_size, make_mesh
from core.method import Method
from core.metrics import MetricsLogger
from core.state import TrainState
from core.steps import gradient_step, init_opt_state


@dataclasses.dataclass
class Session:
    """A ready-to-step training setup. `step` is jitted and donates its state argument."""

    config: Any
    method: Method
    mesh: Mesh
    state: TrainState
    step: Callable[[TrainState, Any], tuple[TrainState, dict]] | None  # None: trains nothing
    data_iter: Iterator | None
    state_shardings: Any
    batch_sharding: Any
    eval_step: Callable | None = None  # jitted `method.eval_step`, outputs replicated

    def next_batch(self):
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
        """The method's evaluation of `state` (default: the session's): `eval_step` over
        `dataset("eval")` on the mesh, then the host `evaluate`; host floats."""
        return evaluate(self, self.state if state is None else state)


@dataclasses.dataclass
class RunResult:
    state: TrainState
    history: list[dict[str, float]]  # one row per step (+ eval rows), as written to JSONL
    preempted: bool = False  # stopped early by SIGTERM, after saving a checkpoint


def _make_state_fn(method: Method, tx, batch_spec) -> Callable[[jax.Array], TrainState]:
    """`make_state(rng)`: the initial state from the key of `config.seed`. The key is an
    argument, not a constant, so runs that differ only in seed share one init program (the
    persistent compilation cache then compiles it once)."""

    def make_state(rng):
        init_rng, state_rng = jax.random.split(rng)
        variables = dict(method.init(init_rng, batch_spec))
        if "params" not in variables:
            raise ConfigError("Method.init must return a dict with a 'params' entry")
        params = variables.pop("params")
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            rng=state_rng,
            params=params,
            opt_state=init_opt_state(tx, params),
            extra=variables,
        )

    return make_state


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


def place(value, sharding):
    """A host value (numpy, or the same array on every process) as a global array with
    `sharding`; each process supplies only its addressable shards."""
    if isinstance(value, jax.Array) and value.sharding == sharding:
        return value
    host = np.asarray(value)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def host_leaves(make_state: Callable, rng) -> list:
    """For each leaf of the state `make_state(rng)` builds (flattened): the concrete array
    `init` returned for it (pretrained weights, numpy), or None where it is traced (random
    init)."""
    concrete: list = []

    def traced(rng):
        state = make_state(rng)
        concrete[:] = [
            None if isinstance(x, jax.core.Tracer) else x for x in jax.tree.leaves(state)
        ]
        return state

    jax.eval_shape(traced, rng)
    return concrete


def with_host_leaves(make_state: Callable, concrete: list) -> Callable:
    """`make_state` with its concrete leaves taken from an argument (the list of them), so a
    jitted initialisation receives them as inputs instead of compiling them in."""

    def make(rng, supplied_leaves):
        leaves, treedef = jax.tree.flatten(make_state(rng))
        supplied = iter(supplied_leaves)
        leaves = [x if c is None else next(supplied) for x, c in zip(leaves, concrete, strict=True)]
        return treedef.unflatten(leaves)

    return make


def seed_key(seed: int) -> np.ndarray:
    """The key of `config.seed` as host data: the same on every process, and an input of the
    jitted init rather than a constant, so runs differing only in seed share one program."""
    return np.asarray(jax.random.PRNGKey(seed))


def _initial_state(make_state: Callable, rng, state_shardings) -> TrainState:
    """The initial state, built under `jit` with its shardings. Leaves `init` returns as
    concrete arrays (pretrained weights) would become constants of that program, copied into
    the executable and every device: they are placed from the host and passed in instead."""
    concrete = host_leaves(make_state, rng)
    if all(x is None for x in concrete):
        return jax.jit(make_state, out_shardings=state_shardings)(rng)
    shardings = jax.tree.leaves(state_shardings)
    placed = [place(x, s) for x, s in zip(concrete, shardings, strict=True) if x is not None]
    make = with_host_leaves(make_state, concrete)
    return jax.jit(make, out_shardings=state_shardings)(rng, placed)


def _restore_params(state: TrainState, state_shardings, source: str) -> TrainState:
    """`state` with its params replaced by those of another run's newest good checkpoint
    (`source`: that run's workdir or its checkpoints/ folder), placed in this run's layout."""
    directory = storage.resolve(source, what="train.init_from")
    if (directory / "checkpoints").exists():
        directory = directory / "checkpoints"
    abstract = abstract_with_shardings(state.params, state_shardings.params)
    with Checkpointer(directory, create=False) as ckpt:
        params = ckpt.restore_params(abstract)
    return state.replace(params=params)


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
    batch_spec: Any  # ShapeDtypeStructs of one global batch (None: the method has no dataset)
    batch_sharding: Any
    step: Callable | None  # jitted, donates the state; None: the method trains nothing
    eval_step: Callable | None  # jitted `method.eval_step`, outputs replicated


def plan(config, method: Method, *, devices=None) -> Plan:
    """The mesh over `devices` (default: all of `jax.devices()`), the state and batch layouts
    and the jitted steps of `config` and `method`. The batch shapes come from one batch of
    `method.dataset`; no array is placed on a device. `devices` may be another platform's
    (`jax.experimental.topologies`): the result can then be compiled, not run."""
    if method.trains and method.dataset is None:
        raise ConfigError("this method trains but has no dataset; core.train needs Method.dataset")
    if method.eval_step is not None and method.dataset is None:
        raise ConfigError("Method.eval_step reads dataset('eval'), but the method has no dataset")
    mesh = make_mesh(config.mesh, devices)
    tx = _optimiser(config, method)
    shard = (jax.process_index(), jax.process_count())
    batch_spec = None
    if method.trains:
        sharding.check_batch_size(config.train.batch_size, mesh)
        # A separate iterator gives the batch shapes, leaving the run's own untouched.
        batch_spec = data.global_spec(next(method.dataset("train", shard=shard, seed=config.seed)))
        leading = {x.shape[0] for x in jax.tree.leaves(batch_spec)}
        if leading != {config.train.batch_size}:
            raise ConfigError(
                f"the dataset yields global batches of {sorted(leading)} but "
                f"train.batch_size={config.train.batch_size}"
            )
    elif method.dataset is not None:
        batch_spec = data.global_spec(next(method.dataset("eval", shard=shard, seed=config.seed)))
    # Every program the core traces (init, step, eval step) gets the config's matmul precision.
    with_precision = functools.partial(precision.traced_with, config)
    make_state = with_precision(_make_state_fn(method, tx, batch_spec))
    abstract = jax.eval_shape(make_state, seed_key(config.seed))
    state_shardings = sharding.tree_shardings(
        abstract, mesh, method.sharding_rules, config.get("fsdp_min_size", 2**14)
    )
    batch_sharding = sharding.batch_sharding(mesh)
    step = None
    if method.trains:
        method_step = method.step or gradient_step(method.loss, tx)
        step = jax.jit(
            with_precision(_train_step(method_step, mesh)),
            in_shardings=(state_shardings, batch_sharding),
            out_shardings=(state_shardings, sharding.replicated(mesh)),
            donate_argnums=(0,),
        )
    eval_step = None
    if method.eval_step is not None:
        eval_step = jax.jit(
            with_precision(_eval_step(method.eval_step, mesh)),
            in_shardings=(state_shardings, batch_sharding, None),
            out_shardings=sharding.replicated(mesh),
        )
    return Plan(
        mesh, make_state, abstract, state_shardings, batch_spec, batch_sharding, step, eval_step
    )


def init(config, method: Method, *, devices=None) -> Session:
    """Build the mesh, the sharded initial state, the jitted steps and the data iterator.

    `devices` restricts the mesh to a subset of `jax.devices()` (e.g. one device in a notebook).
    """
    p = plan(config, method, devices=devices)
    data_iter = None
    if method.trains:
        shard = (jax.process_index(), jax.process_count())
        data_iter = method.dataset("train", shard=shard, seed=config.seed)
    state = _initial_state(p.make_state, seed_key(config.seed), p.state_shardings)
    if config.train.get("init_from"):
        state = _restore_params(state, p.state_shardings, config.train.init_from)
    return Session(
        config,
        method,
        p.mesh,
        state,
        p.step,
        data_iter,
        p.state_shardings,
        p.batch_sharding,
        p.eval_step,
    )


def _eval_step(method_eval_step: Callable, mesh: Mesh) -> Callable:
    def eval_step(state: TrainState, batch, rng):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            out = method_eval_step(state, batch, rng=rng)
        for name, value in out.items():
            if not (isinstance(value, tuple) and len(value) == 2):
                raise ConfigError(f"Method.eval_step's {name!r} must be a (sum, weight) pair")
        return {name: (jnp.sum(s), jnp.sum(w)) for name, (s, w) in out.items()}

    return eval_step


def evaluate(session: Session, state: TrainState) -> dict[str, float]:
    """`eval_step` summed over one pass of `dataset("eval")` (sums and weights added on the
    device, read once), `sum / weight` per metric (NaN for weight 0, "undefined"), merged with
    the host `evaluate`."""
    config, method = session.config, session.method
    out: dict[str, float] = {}
    if session.eval_step is not None:
        dp = data_parallel_size(session.mesh)
        shard = (jax.process_index(), jax.process_count())
        totals, base = None, jax.random.PRNGKey(config.seed)
        for index, local in enumerate(method.dataset("eval", shard=shard, seed=config.seed)):
            batch = data.to_global(local, session.batch_sharding)
            rows = {x.shape[0] for x in jax.tree.leaves(batch)}
            if any(n % dp for n in rows):
                raise ConfigError(
                    f"eval batches of {sorted(rows)} rows do not split over the data-parallel "
                    f"size {dp}; pad them (core.data.one_pass does)"
                )
            sums = session.eval_step(state, batch, jax.random.fold_in(base, index))
            totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
        if totals is None:
            raise ConfigError("Method.eval_step is set but dataset('eval') yielded no batch")
        for name, (total, weight) in jax.device_get(totals).items():
            out[name] = float(total) / float(weight) if float(weight) else float("nan")
    if method.evaluate is not None:
        with precision.scope(config):
            out |= metrics_lib.to_host(method.evaluate(state, seed=config.seed))
    return out


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
    workdir = storage.prepare_workdir(workdir)
    is_main = jax.process_index() == 0
    config_json = config.to_dict()
    workdir_lib.check_and_record_config(
        workdir, config_json, allow_change=allow_config_change, write=is_main
    )
    session = init(config, method, devices=devices)
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
        global_batch=train.batch_size,
        log_every=train.log_every,
        write=is_main,
    )
    watcher = preemption.PreemptionWatcher()
    step, preempted = start, False
    evaluates = method.evaluate is not None or method.eval_step is not None
    try:
        for step in range(start + 1, train.steps + 1):
            state, metrics = session.step(state, session.next_batch())
            logger.push(step, metrics)
            state = apply_hook(session, state, step)
            if train.checkpoint_every and step % train.checkpoint_every == 0:
                logger.flush()  # this step's row is stored before its checkpoint can commit
                ckpt.save(step, state, session.data_iter, config_json)
            if evaluates and train.eval_every > 0 and step % train.eval_every == 0:
                logger.flush()
                logger.log_eval(step, evaluate(session, state))
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
        elif (
            not preempted
            and evaluates
            and train.eval_every >= 0
            and not (train.eval_every > 0 and train.steps % train.eval_every == 0)
        ):
            logger.log_eval(train.steps, evaluate(session, state))
    finally:
        watcher.close()
        logger.close()
        ckpt.close()
    if preempted:
        preemption.raise_if_raising()  # inside core.cache.cached: after the checkpoint closed
    return RunResult(state=state, history=logger.history, preempted=preempted)


def evaluate_only(session: Session, workdir: epath.Path) -> RunResult:
    """The run of a method that trains nothing: its initial state (init, host weights or
    `train.init_from`) evaluated once, logged at step 0 like any evaluation."""
    method = session.method
    if method.evaluate is None and method.eval_step is None:
        raise ConfigError("this method has no loss, no step and no evaluation: nothing to run")
    logger = MetricsLogger(
        workdir, total_steps=0, global_batch=0, log_every=1, write=jax.process_index() == 0
    )
    try:
        logger.log_eval(0, evaluate(session, session.state))
    finally:
        logger.close()
    return RunResult(state=session.state, history=logger.history)
