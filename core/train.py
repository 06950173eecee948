"""THE training loop: `run(config, method, workdir)`, and `init(config, method)` for notebooks.

Both share one setup (`init`): the mesh, shardings from rules, the sharded initial state, the
jitted step with donation, and the data iterator turned into global arrays. A notebook can step
by hand:

    session = core.train.init(config, method)
    rows = session.train(10)          # session.state is now the state after 10 steps
"""

import dataclasses
import os
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from core import data, optim, sharding
from core import metrics as metrics_lib
from core import workdir as workdir_lib
from core.checkpoint import Checkpointer, abstract_with_shardings
from core.errors import ConfigError
from core.mesh import make_mesh
from core.method import Method
from core.metrics import MetricsLogger
from core.preemption import PreemptionWatcher
from core.state import TrainState
from core.steps import gradient_step


@dataclasses.dataclass
class Session:
    """A ready-to-step training setup. `step` is jitted and donates its state argument."""

    config: Any
    method: Method
    mesh: Mesh
    state: TrainState
    step: Callable[[TrainState, Any], tuple[TrainState, dict]]
    data_iter: Iterator
    state_shardings: Any
    batch_sharding: Any

    def next_batch(self):
        return data.to_global(next(self.data_iter), self.batch_sharding)

    def train(self, num_steps: int = 1) -> list[dict[str, float]]:
        """Advance `self.state` by `num_steps` steps on the next batches; returns each step's
        metrics as host floats. The session always holds the current state (the jitted step
        donates the old one), so a notebook cell calling this can be run again."""
        rows = []
        for _ in range(num_steps):
            self.state, metrics = self.step(self.state, self.next_batch())
            rows.append({"step": int(self.state.step), **metrics_lib.to_host(metrics)})
        return rows


@dataclasses.dataclass
class RunResult:
    state: TrainState
    history: list[dict[str, float]]  # one row per step (+ eval rows), as written to JSONL
    preempted: bool = False  # stopped early by SIGTERM, after saving a checkpoint


def _make_state_fn(method: Method, tx, batch_spec, seed: int) -> Callable[[], TrainState]:
    def make_state():
        rng = jax.random.PRNGKey(seed)
        init_rng, state_rng = jax.random.split(rng)
        variables = dict(method.init(init_rng, batch_spec))
        if "params" not in variables:
            raise ConfigError("Method.init must return a dict with a 'params' entry")
        params = variables.pop("params")
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            rng=state_rng,
            params=params,
            opt_state=tx.init(params),
            extra=variables,
        )

    return make_state


def _train_step(method_step: Callable, mesh: Mesh) -> Callable:
    def train_step(state: TrainState, batch):
        # The mesh is visible while tracing (`jax.sharding.get_abstract_mesh()`), so a method can
        # put a Pallas kernel, which XLA cannot partition, under `jax.shard_map`.
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            rng = jax.random.fold_in(state.rng, state.step)
            new_state, metrics = method_step(state, batch, rng=rng)
            return new_state.replace(step=state.step + 1), metrics

    return train_step


def init(config, method: Method, *, devices=None) -> Session:
    """Build the mesh, the sharded initial state, the jitted step and the data iterator.

    `devices` restricts the mesh to a subset of `jax.devices()` (e.g. one device in a notebook).
    """
    if method.dataset is None:
        raise ConfigError("this method has no dataset; core.train needs Method.dataset")
    mesh = make_mesh(config.mesh, devices)
    sharding.check_batch_size(config.train.batch_size, mesh)
    tx = method.tx or optim.make(config.optim, config.train.steps)
    shard = (jax.process_index(), jax.process_count())
    data_iter = method.dataset("train", shard=shard, seed=config.seed)
    # A separate iterator gives the batch shapes, leaving `data_iter` untouched for checkpoints.
    batch_spec = data.global_spec(next(method.dataset("train", shard=shard, seed=config.seed)))
    leading = {x.shape[0] for x in jax.tree.leaves(batch_spec)}
    if leading != {config.train.batch_size}:
        raise ConfigError(
            f"the dataset yields global batches of {sorted(leading)} but "
            f"train.batch_size={config.train.batch_size}"
        )
    make_state = _make_state_fn(method, tx, batch_spec, config.seed)
    abstract = jax.eval_shape(make_state)
    state_shardings = sharding.tree_shardings(
        abstract, mesh, method.sharding_rules, config.get("fsdp_min_size", 2**14)
    )
    batch_sharding = sharding.batch_sharding(mesh)
    state = jax.jit(make_state, out_shardings=state_shardings)()
    step = jax.jit(
        _train_step(method.step or gradient_step(method.loss, tx), mesh),
        in_shardings=(state_shardings, batch_sharding),
        out_shardings=(state_shardings, sharding.replicated(mesh)),
        donate_argnums=(0,),
    )
    return Session(config, method, mesh, state, step, data_iter, state_shardings, batch_sharding)


def check_workdir(workdir: str) -> None:
    """Create `workdir` or fail with one line saying why it cannot be used."""
    try:
        os.makedirs(workdir, exist_ok=True)
        probe = os.path.join(workdir, f".write-test-{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise ConfigError(f"workdir {workdir!r} is not writable: {e.strerror or e}") from None


def run(
    config, method: Method, workdir: str, *, devices=None, allow_config_change: bool = False
) -> RunResult:
    """Train `method` for `config.train.steps`, resuming from `workdir` if it holds a checkpoint.

    SIGTERM (preemption) saves a checkpoint at the current step and returns early with
    `preempted=True`; the same call later continues from there.
    """
    check_workdir(workdir)
    is_main = jax.process_index() == 0
    config_json = config.to_dict()
    workdir_lib.check_and_record_config(
        workdir, config_json, allow_change=allow_config_change, write=is_main
    )
    session = init(config, method, devices=devices)
    train = config.train
    ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=train.keep_checkpoints)
    target = abstract_with_shardings(session.state, session.state_shardings)
    state = ckpt.restore_latest_good(target, session.data_iter) or session.state
    start = int(state.step)
    if start and is_main:
        workdir_lib.rewind_metrics(workdir, start)
        print(f"resumed from {ckpt.directory}/{start}", flush=True)
    logger = MetricsLogger(
        workdir,
        total_steps=train.steps,
        global_batch=train.batch_size,
        log_every=train.log_every,
        write=is_main,
    )
    watcher = PreemptionWatcher()
    step, preempted = start, False
    evaluate = session.method.evaluate
    try:
        for step in range(start + 1, train.steps + 1):
            state, metrics = session.step(state, session.next_batch())
            logger.push(step, metrics)
            if train.checkpoint_every and step % train.checkpoint_every == 0:
                ckpt.save(step, state, session.data_iter, config_json)
            if evaluate and train.eval_every > 0 and step % train.eval_every == 0:
                logger.flush()
                logger.log_eval(step, evaluate(state, seed=config.seed))
            if step < train.steps and watcher.should_stop(step):
                preempted = True
                break
        logger.flush()
        if step > start and ckpt.latest_step() != step and (preempted or train.checkpoint_every):
            ckpt.save(step, state, session.data_iter, config_json)
        if preempted and is_main:
            print(f"preempted: checkpoint saved at step {step}; rerun to continue", flush=True)
        elif (
            not preempted
            and evaluate
            and train.eval_every >= 0
            and not (train.eval_every > 0 and train.steps % train.eval_every == 0)
        ):
            logger.log_eval(train.steps, evaluate(state, seed=config.seed))
    finally:
        watcher.close()
        logger.close()
        ckpt.close()
    return RunResult(state=state, history=logger.history, preempted=preempted)
