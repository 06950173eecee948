"""THE training loop: `run(config, method, workdir)`, and `init(config, method)` for notebooks.

Both share one setup (`init`): the mesh, shardings from rules, the sharded initial state, the
jitted step with donation, and the data iterator turned into global arrays. A notebook can step
by hand:

    session = core.train.init(config, method)
    state = session.state
    for _ in range(10):
        state, metrics = session.step(state, session.next_batch())
"""

import dataclasses
import os
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from core import data, optim, sharding
from core.checkpoint import Checkpointer, abstract_with_shardings
from core.errors import ConfigError
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
    step: Callable[[TrainState, Any], tuple[TrainState, dict]]
    data_iter: Iterator
    state_shardings: Any
    batch_sharding: Any

    def next_batch(self):
        return data.to_global(next(self.data_iter), self.batch_sharding)


@dataclasses.dataclass
class RunResult:
    state: TrainState
    history: list[dict[str, float]]  # one row per step (+ eval rows), as written to JSONL


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


def _train_step(method_step: Callable) -> Callable:
    def train_step(state: TrainState, batch):
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
        _train_step(method.step or gradient_step(method.loss, tx)),
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


def run(config, method: Method, workdir: str, *, devices=None) -> RunResult:
    """Train `method` for `config.train.steps`, resuming from `workdir` if it holds a checkpoint."""
    check_workdir(workdir)
    session = init(config, method, devices=devices)
    train = config.train
    is_main = jax.process_index() == 0
    ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=train.keep_checkpoints)
    state = session.state
    if ckpt.latest_step() is not None:
        target = abstract_with_shardings(state, session.state_shardings)
        state = ckpt.restore(target, session.data_iter)
        if is_main:
            print(f"resumed from {ckpt.directory} at step {int(state.step)}", flush=True)
    start = int(state.step)
    logger = MetricsLogger(
        workdir,
        total_steps=train.steps,
        global_batch=train.batch_size,
        log_every=train.log_every,
        write=is_main,
    )
    config_json = config.to_dict()
    try:
        for step in range(start + 1, train.steps + 1):
            state, metrics = session.step(state, session.next_batch())
            logger.push(step, metrics)
            if train.checkpoint_every and (step % train.checkpoint_every == 0):
                ckpt.save(step, state, session.data_iter, config_json)
            if session.method.evaluate and train.eval_every > 0 and step % train.eval_every == 0:
                logger.flush()
                logger.log_eval(step, session.method.evaluate(state, seed=config.seed))
        logger.flush()
        if train.checkpoint_every and ckpt.latest_step() != train.steps and start < train.steps:
            ckpt.save(train.steps, state, session.data_iter, config_json)
        periodic_eval_done = train.eval_every > 0 and train.steps % train.eval_every == 0
        if session.method.evaluate and train.eval_every >= 0 and not periodic_eval_done:
            logger.log_eval(train.steps, session.method.evaluate(state, seed=config.seed))
    finally:
        logger.close()
        ckpt.close()
    return RunResult(state=state, history=logger.history)
