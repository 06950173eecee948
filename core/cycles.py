"""Training in cycles of `tau` steps, a host policy choosing which optimiser runs each cycle.

Mapping onto core.train: one core.train step is one cycle. Its batch holds the cycle's `tau`
micro-batches on axis 1 (every leaf `[B, tau, ...]`: the leading axis stays the global batch,
so the data-parallel sharding, `train.batch_size` and the checkpointed data position need no
special case; `cycle_batches` builds it from any dataset). The step is `core.steps.switch`
over one `lax.scan` of `tau` gradient steps per optimiser, on the optimiser index the host
wrote into `state.extra["optimizer"]` (`Method.hook`: the policy). Why a traced switch and not
a host-side choice between separately jitted scans: core.train jits one step (donation,
shardings, checkpoint, resume, metrics), and `lax.switch` runs only the chosen branch, so the
price is compiling every optimiser's scan once, in one program (no recompilation afterwards:
tests/core/test_cycles.py), and keeping every optimiser's state (a dict of named states, the
sum of their sizes, not the largest, as memory).

Inside a cycle each micro-step sees what plain training would: `state.step` is the global
step `cycle * tau + m` and its rng `fold_in(state.rng, cycle * tau + m)`, so a pool of one
optimiser reproduces plain `core.train` on the same batches bitwise. Without `inherit`, the
chosen optimiser's state is re-initialised when it differs from the previous cycle's (DOIT's
rule: a switch starts the optimiser afresh); with `inherit`, each optimiser resumes the state
it had when it last ran. The cycle's `tau` losses (each taken before its update) are left in
`state.extra["cycle_losses"]`, one device array per cycle that the hook reads once; the
logged metrics are their cycle means, the last loss and the optimiser index.

`with_cycles(method, tau=, pool=, hook=)` turns any Method with a `loss` (and a dataset, or
none: a loss of the parameters alone) into a cycle-trained one; `pool` may come straight from
a config section (name -> optimiser spec, `make_pool`).
"""

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from core import steps
from core.errors import ConfigError
from core.method import Method

OPTIMIZER = "optimizer"  # extra: the index of the optimiser that runs the next cycle
PREVIOUS = "previous_optimizer"  # extra: the index that ran the last cycle (-1: none yet)
LOSSES = "cycle_losses"  # extra: float32[tau], the last cycle's losses

_MAKERS = {
    "sgd": lambda lr, s: optax.sgd(lr, momentum=s.get("momentum") or None),
    "adagrad": lambda lr, s: optax.adagrad(lr),
    "rmsprop": lambda lr, s: optax.rmsprop(lr, decay=s.get("decay", 0.9)),
    "adam": lambda lr, s: optax.adam(lr, b1=s.get("b1", 0.9), b2=s.get("b2", 0.999)),
}


def make_pool(spec: Mapping[str, Any]) -> dict[str, optax.GradientTransformation]:
    """Optimisers from `{name: {"kind": sgd|adagrad|rmsprop|adam, "lr": ..., ...}}` (an entry
    may also be an optax transformation, e.g. a method's own)."""
    if not spec:
        raise ConfigError("cycles.pool is empty: give at least one optimiser")
    pool = {}
    for name, entry in spec.items():
        if isinstance(entry, optax.GradientTransformation):
            pool[name] = entry
            continue
        kind = entry.get("kind")
        if kind not in _MAKERS:
            raise ConfigError(
                f"cycles.pool.{name}.kind={kind!r} is unknown; "
                f"expected one of: {', '.join(_MAKERS)}"
            )
        if not entry.get("lr", 0) > 0:
            raise ConfigError(f"cycles.pool.{name}.lr must be > 0, got {entry.get('lr')!r}")
        pool[name] = _MAKERS[kind](float(entry["lr"]), entry)
    return pool


def initial_extra(tau: int, first: int | jax.Array = 0) -> dict[str, jax.Array]:
    """The extra entries a cycle-trained method's `init` adds (`first`: the first cycle's
    optimiser, a host int or a traced draw)."""
    return {
        OPTIMIZER: jnp.asarray(first, jnp.int32),
        PREVIOUS: jnp.int32(-1),
        LOSSES: jnp.zeros((tau,), jnp.float32),
    }


def scanned(step: Callable, tau: int) -> Callable:
    """`step` run over the `tau` micro-batches of a cycle batch (leaves `[B, tau, ...]`; None
    for a method without data) as one `lax.scan`; metrics stacked to `[tau]`."""

    def cycle(state, batch, *, rng):
        del rng  # each micro-step gets the rng plain training would give it
        micro_TB = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), batch)
        first = state.step * tau

        def body(s, xs):
            m, micro = xs
            global_step = first + m
            s = s.replace(step=global_step)
            return step(s, micro, rng=jax.random.fold_in(s.rng, global_step))

        end, metrics = jax.lax.scan(body, state, (jnp.arange(tau, dtype=jnp.int32), micro_TB))
        return end.replace(step=state.step), metrics

    return cycle


def cycle_step(
    loss: Callable,
    pool: Mapping[str, optax.GradientTransformation],
    tau: int,
    *,
    inherit: bool = False,
) -> Callable:
    """The core.train step of one cycle: `tau` gradient steps of `loss` with the optimiser
    `pool[names[extra["optimizer"]]]` (the method's `tx` must be `pool`, a dict)."""
    if isinstance(tau, bool) or not isinstance(tau, int) or tau < 1:
        raise ConfigError(f"cycles.tau={tau!r} must be an int >= 1")
    names = tuple(pool)
    branches = [scanned(steps.gradient_step(loss, pool[n]), tau) for n in names]
    switched = steps.switch(
        branches,
        steps.from_extra(OPTIMIZER),
        opt_keys=names,
        reset=None if inherit else (lambda s: s.extra[OPTIMIZER] != s.extra[PREVIOUS]),
        tx=dict(pool),
    )

    def step(state, batch, *, rng):
        new, metrics = switched(state, batch, rng=rng)
        losses = metrics.pop("loss")
        extra = {**new.extra, PREVIOUS: state.extra[OPTIMIZER], LOSSES: losses}
        summary = {k: jnp.mean(v) for k, v in metrics.items() if k != "branch"}
        summary |= {"loss": jnp.mean(losses), "last_loss": losses[-1], OPTIMIZER: metrics["branch"]}
        return new.replace(extra=extra), summary

    return step


class CycleBatches:
    """`tau` consecutive batches of `iterator` as one cycle batch, stacked on axis 1. The
    position (`get_state`/`set_state`, when the inner iterator has them) is the inner one's:
    checkpoints fall between cycles, so it is always a whole number of cycles."""

    def __init__(self, iterator: Iterator, tau: int):
        self.iterator, self.tau = iterator, tau
        if hasattr(iterator, "get_state") and hasattr(iterator, "set_state"):
            self.get_state, self.set_state = iterator.get_state, iterator.set_state

    def __iter__(self):
        return self

    def __next__(self):
        micro = [next(self.iterator) for _ in range(self.tau)]
        return jax.tree.map(lambda *xs: np.stack(xs, axis=1), *micro)


def cycle_batches(dataset: Callable, tau: int) -> Callable:
    """`Method.dataset` whose "train" batches are cycle batches; other splits unchanged."""

    def cycled(split, *, shard, seed):
        inner = dataset(split, shard=shard, seed=seed)
        return CycleBatches(inner, tau) if split == "train" else inner

    return cycled


def with_cycles(
    method: Method,
    *,
    tau: int,
    pool: Mapping[str, Any],
    hook: Callable | None,
    inherit: bool = False,
    first: int | Callable = 0,
) -> Method:
    """`method` (which has a `loss`) trained in cycles of `tau` steps with the optimisers of
    `pool` (`make_pool`: specs from a config section, or transformations). `hook(state, *,
    step)` is the policy, called after every cycle, writing `extra["optimizer"]` (and its own
    state, in extra). `first` is the first cycle's optimiser, or `first(rng) -> traced int`."""
    if method.loss is None:
        raise ConfigError("with_cycles needs a method with a loss")
    if method.step is not None:
        raise ConfigError("with_cycles replaces the step: give a method with a loss, not a step")
    pool = make_pool(pool)

    def init(rng, batch_spec):
        micro_spec = jax.tree.map(
            lambda s: jax.ShapeDtypeStruct(s.shape[:1] + s.shape[2:], s.dtype), batch_spec
        )
        # The method's init gets the run's key unchanged: its params equal plain training's.
        choice = first(jax.random.fold_in(rng, 1)) if callable(first) else first
        return {**method.init(rng, micro_spec), **initial_extra(tau, choice)}

    return method._replace(
        init=init,
        step=cycle_step(method.loss, pool, tau, inherit=inherit),
        tx=pool,
        dataset=None if method.dataset is None else cycle_batches(method.dataset, tau),
        hook=hook,
    )
