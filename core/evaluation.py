"""Evaluation streams: the method's own (`Method.eval_step` / `evaluate` on "eval", logged as
``eval/<metric>``) and its named `Evaluator`s (``eval/<name>/<metric>``), each jitted on the
mesh over one pass of its split, its sums and weights added on the device and read once.

`streams(config, method, ...)` checks every stream and builds its jitted step before training
starts: a stream naming a split the dataset does not have, or a first batch that does not split
over the mesh, is a one-line error before step 1, not hours in.
"""

import dataclasses
import re
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from core import data, precision, sharding
from core import metrics as metrics_lib
from core.errors import ConfigError, method_name
from core.mesh import data_parallel_size
from core.method import Evaluator, Method

_NAME = re.compile(r"[A-Za-z0-9_.-]+")


@dataclasses.dataclass(frozen=True)
class Stream:
    """One evaluation stream, ready to run: its `Evaluator` (name "" for the method's own) and
    its jitted eval step (None: host `evaluate` only)."""

    evaluator: Evaluator
    eval_step: Callable | None

    @property
    def name(self) -> str:
        return self.evaluator.name

    def every(self, default: int) -> int:
        return default if self.evaluator.every is None else self.evaluator.every

    def periodic_at(self, step: int, default: int) -> bool:
        """Whether this stream runs after `step` on its interval (every > 0)."""
        every = self.every(default)
        return every > 0 and step % every == 0

    def at_end(self, total: int, default: int) -> bool:
        """Whether this stream runs once more at the end of a `total`-step run: every >= 0
        (< 0: never), unless its interval already ran it at step `total`."""
        return self.every(default) >= 0 and not self.periodic_at(total, default)


def declared(method: Method) -> tuple[Evaluator, ...]:
    """The method's streams: its own `eval_step` / `evaluate` (name "") if it has either, then
    its named `evaluators`, checked: names unique and plain, each with something to run."""
    own = ()
    if method.eval_step is not None or method.evaluate is not None:
        own = (Evaluator("", method.eval_step, method.evaluate),)
    seen = set()
    for ev in method.evaluators:
        if not isinstance(ev, Evaluator):
            raise ConfigError(f"Method.evaluators holds {type(ev).__name__}, not core.Evaluator")
        if not _NAME.fullmatch(ev.name or ""):
            raise ConfigError(f"evaluator name {ev.name!r} must be letters, digits, _ . or -")
        if ev.name in seen:
            raise ConfigError(f"two evaluators are named {ev.name!r}")
        if ev.eval_step is None and ev.evaluate is None:
            raise ConfigError(f"evaluator {ev.name!r} has neither eval_step nor evaluate")
        seen.add(ev.name)
    return own + tuple(method.evaluators)


def first_batch(config, method: Method, split: str, what: str):
    """One global batch's spec of `dataset(split)`, or a one-line error naming `what` reads it
    (a split the dataset does not have, an empty split)."""
    who = method_name(config)
    if method.dataset is None:
        raise ConfigError(f"{who}: {what} reads dataset({split!r}), but the method has none")
    shard = (jax.process_index(), jax.process_count())
    try:
        batch = next(iter(method.dataset(split, shard=shard, seed=config.seed)))
    except ConfigError as e:
        raise ConfigError(f"{who}: {what}: {e}") from None
    except StopIteration:
        raise ConfigError(f"{who}: {what}: dataset({split!r}) is empty") from None
    except Exception as e:
        raise ConfigError(
            f"{who}: {what} reads dataset({split!r}), which failed: {type(e).__name__}: {e}"
        ) from e
    return data.global_spec(batch)


def check_rows(batch, dp: int, what: str, split: str) -> None:
    rows = {x.shape[0] for x in jax.tree.leaves(batch)}
    if any(n % dp for n in rows):
        raise ConfigError(
            f"{what}: batches of {sorted(rows)} rows from dataset({split!r}) do not split "
            f"over the data-parallel size {dp}; pad them (core.data.one_pass does)"
        )


def _jitted(method_eval_step: Callable, config, mesh: Mesh, state_shardings, batch_sharding):
    def eval_step(state, batch, rng):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            out = method_eval_step(state, batch, rng=rng)
        for name, value in out.items():
            if not (isinstance(value, tuple) and len(value) == 2):
                raise ConfigError(f"eval_step's {name!r} must be a (sum, weight) pair")
        return {name: (jnp.sum(s), jnp.sum(w)) for name, (s, w) in out.items()}

    return jax.jit(
        precision.traced_with(config, eval_step),
        in_shardings=(state_shardings, batch_sharding, None),
        out_shardings=sharding.replicated(mesh),
    )


def streams(config, method: Method, mesh: Mesh, state_shardings, batch_sharding):
    """Every stream of `method`, checked (its split read once), with its eval step jitted."""
    out = []
    dp = data_parallel_size(mesh)
    for ev in declared(method):
        step = None
        if ev.eval_step is not None:
            what = f"evaluator {ev.name!r}" if ev.name else "Method.eval_step"
            batch_spec = first_batch(config, method, ev.split, what)
            check_rows(batch_spec, dp, f"{method_name(config)}: {what}", ev.split)
            step = _jitted(ev.eval_step, config, mesh, state_shardings, batch_sharding)
        out.append(Stream(ev, step))
    return tuple(out)


def run_stream(stream: Stream, config, method: Method, state, batch_sharding, mesh) -> dict:
    """One stream's metrics of `state`: its eval step summed over one pass of its split
    (`sum / weight`, NaN for weight 0: "undefined"), merged with its host `evaluate`."""
    out: dict[str, float] = {}
    ev = stream.evaluator
    if stream.eval_step is not None:
        dp = data_parallel_size(mesh)
        shard = (jax.process_index(), jax.process_count())
        totals, base = None, jax.random.PRNGKey(config.seed)
        for index, local in enumerate(method.dataset(ev.split, shard=shard, seed=config.seed)):
            batch = data.to_global(local, batch_sharding)
            check_rows(batch, dp, f"evaluator {ev.name!r}", ev.split)
            sums = stream.eval_step(state, batch, jax.random.fold_in(base, index))
            totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
        if totals is None:
            raise ConfigError(f"evaluator {ev.name!r}: dataset({ev.split!r}) yielded no batch")
        for name, (total, weight) in jax.device_get(totals).items():
            out[name] = float(total) / float(weight) if float(weight) else float("nan")
    if ev.evaluate is not None:
        with precision.scope(config):
            out |= metrics_lib.to_host(ev.evaluate(state, seed=config.seed))
    return out


def evaluate(
    streams_: Iterable[Stream], config, method: Method, state, batch_sharding, mesh
) -> dict[str, Any]:
    """The metrics of every stream in `streams_`, keyed ``<metric>`` for the method's own and
    ``<name>/<metric>`` for a named one (the logger adds ``eval/``)."""
    out: dict[str, Any] = {}
    for stream in streams_:
        metrics = run_stream(stream, config, method, state, batch_sharding, mesh)
        prefix = f"{stream.name}/" if stream.name else ""
        out |= {f"{prefix}{k}": v for k, v in metrics.items()}
    return out
