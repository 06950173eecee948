"""Step builders and combinators.

A step is `step(state, batch, *, rng) -> (state, metrics)`. The core owns `state.step` (it
increments it after the method's step) and derives `rng` from `fold_in(state.rng, state.step)`,
so steps never manage either.
"""

import functools
from collections.abc import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from core import optim
from core.errors import ConfigError


def gradient_step(
    loss: Callable,
    tx: optax.GradientTransformation,
    *,
    update_args: Callable | None = None,
    opt_metrics: Callable | None = None,
) -> Callable:
    """Plain gradient descent on `loss(params, batch, *, rng, extra) -> (value, metrics)`.

    update_args: `(value, metrics) -> dict` of keyword arguments for `tx.update` (optax's extra
      args, e.g. `{"value": 1 - metrics["accuracy"]}` for `optax.contrib.reduce_on_plateau`).
    opt_metrics: `(opt_state) -> dict` of metrics read from the updated optimiser state (e.g.
      that plateau's scale), logged beside the loss's.
    A `core.optim.scoped` tx: only its trained leaves are differentiated (and enter
    "grad_norm"); frozen leaves come back as the very arrays they were."""

    def step(state, batch, *, rng):
        value, metrics, grads, norm = _value_and_grads(loss, tx, state, batch, rng)
        kwargs = {} if update_args is None else update_args(value, metrics)
        updates, opt_state = tx.update(grads, state.opt_state, state.params, **kwargs)
        params = apply_updates(tx, state.params, updates)
        metrics = {"loss": value, **metrics, "grad_norm": norm}
        if opt_metrics is not None:
            metrics = {**metrics, **opt_metrics(opt_state)}
        return state.replace(params=params, opt_state=opt_state), metrics

    return step


def _trained(tx, params) -> list[bool] | None:
    """Which leaves of `params` a `core.optim.scoped` tx updates (None: every leaf)."""
    return tx.trained(params) if isinstance(tx, optim.Scoped) else None


def _value_and_grads(loss, tx, state, batch, rng):
    """The loss, its metrics, its gradient (zeros at leaves the tx leaves frozen, which it
    never reads, so XLA drops them) and the norm of the trained leaves' gradients."""
    trained = _trained(tx, state.params)
    if trained is None:
        grad_fn = jax.value_and_grad(loss, has_aux=True)
        (value, metrics), grads = grad_fn(state.params, batch, rng=rng, extra=state.extra)
        return value, metrics, grads, optax.tree.norm(grads)
    leaves, treedef = jax.tree.flatten(state.params)

    def loss_of_trained(trained_leaves):
        it = iter(trained_leaves)
        merged = [next(it) if t else x for x, t in zip(leaves, trained, strict=True)]
        return loss(jax.tree.unflatten(treedef, merged), batch, rng=rng, extra=state.extra)

    own = [x for x, t in zip(leaves, trained, strict=True) if t]
    (value, metrics), own_grads = jax.value_and_grad(loss_of_trained, has_aux=True)(own)
    it = iter(own_grads)
    grads = [next(it) if t else jnp.zeros_like(x) for x, t in zip(leaves, trained, strict=True)]
    return value, metrics, jax.tree.unflatten(treedef, grads), optax.tree.norm(own_grads)


def apply_updates(tx, params, updates):
    """`optax.apply_updates`, leaving a scoped tx's frozen leaves untouched (no arithmetic)."""
    trained = _trained(tx, params)
    if trained is None:
        return optax.apply_updates(params, updates)
    leaves, treedef = jax.tree.flatten(params)
    update_leaves = treedef.flatten_up_to(updates)
    new = [
        optax.apply_updates(p, u) if t else p
        for p, u, t in zip(leaves, update_leaves, trained, strict=True)
    ]
    return jax.tree.unflatten(treedef, new)


def alternating_step(phases: Sequence[tuple[str, Sequence[str], Callable]], tx) -> Callable:
    """One step of several optimisers in turn, e.g. a GAN's: `phases` is [(name, labels, loss)],
    each phase a gradient step of `loss(params, batch, *, rng, extra) -> (value, metrics)` on the
    leaves of `labels` of a `core.optim.scoped` tx (`tx.phase(*labels)`), every other leaf and
    optimiser state left as it was. A phase sees the params the previous one wrote (a GAN's
    generator loss reads the discriminator just updated); every phase gets the step's rng.
    Metrics: "<name>/loss", "<name>/grad_norm" and "<name>/<metric>".

        tx = optim.scoped([(r"^g/", "g"), (r"^d/", "d")], {"g": adam_g, "d": adam_d})
        step = alternating_step([("d", ["d"], d_loss), ("g", ["g"], g_loss)], tx)
    """
    if not isinstance(tx, optim.Scoped):
        raise ConfigError("alternating_step: tx must be a core.optim.scoped transformation")
    names = [name for name, _, _ in phases]
    if not phases or len(set(names)) != len(names):
        raise ConfigError(f"alternating_step: phase names {names} empty or repeated")
    steps = [(name, gradient_step(loss, tx.phase(*labels))) for name, labels, loss in phases]

    def step(state, batch, *, rng):
        metrics = {}
        for name, phase_step in steps:
            state, phase_metrics = phase_step(state, batch, rng=rng)
            metrics |= {f"{name}/{k}": v for k, v in phase_metrics.items()}
        return state, metrics

    return step


def microbatched(loss: Callable, num_microbatches: int) -> Callable:
    """A loss whose gradient is accumulated over `num_microbatches` slices of the batch with
    `lax.scan`, so peak activation memory is that of one slice. Metrics are averaged; the loss
    must be a mean over examples for the result to equal the full-batch loss (equal-size
    microbatches make the mean of means the full mean)."""
    if num_microbatches < 1:
        raise ConfigError(f"num_microbatches={num_microbatches} must be >= 1")
    if num_microbatches == 1:
        return loss

    def split(x):
        if x.shape[0] % num_microbatches:
            raise ConfigError(
                f"batch of {x.shape[0]} is not divisible into {num_microbatches} microbatches"
            )
        return x.reshape(num_microbatches, x.shape[0] // num_microbatches, *x.shape[1:])

    def accumulated(params, batch, *, rng, extra):
        micro = jax.tree.map(split, batch)
        rngs = jax.random.split(rng, num_microbatches)

        def body(_, xs):
            mb, r = xs
            return None, loss(params, mb, rng=r, extra=extra)

        _, (values, metrics) = jax.lax.scan(body, None, (micro, rngs))
        # Token counts add up over microbatches; everything else is a per-example mean.
        metrics = {k: v.sum() if k == "num_tokens" else v.mean() for k, v in metrics.items()}
        return jnp.mean(values), metrics

    return accumulated


def with_ema(
    step: Callable, decay: float | Callable, key: str = "ema", *, warmup: bool = False
) -> Callable:
    """Wrap a step to keep an exponential moving average of params in `state.extra[key]`
    (initialise it with a copy of the params in the method's `init`), updated after the
    optimiser step: ema = d * ema + (1 - d) * new params.

    decay: a constant, or a schedule `decay(step)` of the step count before this step (e.g. a
      DINO teacher's cosine momentum from 0.99 to 1; `core.steps` never differentiates it).
    warmup: the decay after n earlier updates is min(decay, (1 + n) / (10 + n)) (TensorFlow's
    `num_updates` rule), so a run of a few thousand steps is not dominated by its initial
    params (0.999^1000 = 0.37 of them would remain after 1000 steps without it)."""

    def ema_step(state, batch, *, rng):
        d = decay(state.step) if callable(decay) else decay
        if warmup:
            n = state.step.astype(jnp.float32)
            d = jnp.minimum(d, (1 + n) / (10 + n))
        new, metrics = step(state, batch, rng=rng)
        ema = jax.tree.map(lambda e, p: d * e + (1 - d) * p, new.extra[key], new.params)
        return new.replace(extra={**new.extra, key: ema}), metrics

    return ema_step


def with_schedules(step: Callable, schedules: dict[str, Callable]) -> Callable:
    """Wrap a step so that its loss sees `extra[name] = schedule(state.step)` (an annealed
    temperature or steepness, a function of the step count, not state to checkpoint) for each
    entry; the values are logged as metrics and the returned state's extra is the original's."""

    def scheduled_step(state, batch, *, rng):
        values = {name: schedule(state.step) for name, schedule in schedules.items()}
        inner = state.replace(extra={**state.extra, **values})
        new_state, metrics = step(inner, batch, rng=rng)
        return new_state.replace(extra=state.extra), {**metrics, **values}

    return scheduled_step


def init_opt_state(tx, params):
    """The optimiser state of `Method.tx`: none (`optax.EmptyState()`), one transformation's,
    or a dict of named transformations' states."""
    if tx is None:
        return optax.EmptyState()
    if isinstance(tx, Mapping):
        return {name: t.init(params) for name, t in tx.items()}
    return tx.init(params)


def by_step(lengths: Sequence[int]) -> Callable:
    """`choose` for `switch`: branch k runs for `lengths[k]` steps after branch k - 1; the last
    branch runs on from there (e.g. `by_step([200])`: 200 warm-start steps, then RL)."""
    for n in lengths:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(f"by_step: lengths must be ints >= 0, got {list(lengths)}")
    ends = np.cumsum(lengths, dtype=np.int64)

    def choose(state):
        return jnp.sum(state.step >= jnp.asarray(ends, jnp.int32)).astype(jnp.int32)

    return choose


def at_branch_start(lengths: Sequence[int]) -> Callable:
    """`reset` for `switch` with `by_step(lengths)`: true at the first step of every branch, so
    each one starts from a fresh optimiser state (and a schedule restarted from its step 0)."""
    starts = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])

    def reset(state):
        return jnp.any(state.step == jnp.asarray(starts, jnp.int32))

    return reset


def from_extra(key: str = "branch") -> Callable:
    """`choose` for `switch` on a host decision: the branch index a `Method.hook` wrote into
    `state.extra[key]` (an int32 scalar the method's `init` creates)."""
    return lambda state: state.extra[key]


def switch(
    branches: Sequence[Callable],
    choose: Callable,
    *,
    opt_keys: Sequence[str | None] | None = None,
    reset: Callable | None = None,
    tx=None,
) -> Callable:
    """One step that runs `branches[choose(state)]`: the decision is traced (`by_step`: a
    schedule over the step count) or the host's (`from_extra`: written by a `Method.hook`).

    Optimiser states: branch k sees `state.opt_state[opt_keys[k]]` (a method's dict `tx`: one
    state per optimiser, branches may share one) or, without `opt_keys`, the whole opt_state.
    With `reset` (a traced bool of the state, e.g. `at_branch_start`), the chosen branch's
    optimiser state is re-initialised from `tx` (the method's tx, a dict when `opt_keys` is
    given) before it runs.

    Every branch is compiled into one executable and `lax.switch` runs one. Metrics are the
    union of the branches' keys, NaN where the running branch has none (the metrics logger
    leaves those out), plus "branch".
    """
    if not branches:
        raise ConfigError("switch: give at least one branch")
    if opt_keys is not None and len(opt_keys) != len(branches):
        raise ConfigError(f"switch: {len(opt_keys)} opt_keys for {len(branches)} branches")
    if reset is not None and tx is None:
        raise ConfigError("switch: reset needs tx, the transformation(s) to re-initialise")
    key_of = lambda k: None if opt_keys is None else opt_keys[k]

    def own(opt_state, k):
        key = key_of(k)
        return opt_state if key is None else opt_state[key]

    def put(opt_state, k, value):
        key = key_of(k)
        return value if key is None else {**opt_state, key: value}

    def step(state, batch, *, rng):
        def run(k, state):
            opt_state = own(state.opt_state, k)
            if reset is not None:
                branch_tx = tx if key_of(k) is None else tx[key_of(k)]
                # cond, not where: the fresh state is built only on the steps that need it.
                opt_state = jax.lax.cond(
                    reset(state), lambda: branch_tx.init(state.params), lambda: opt_state
                )
            new, metrics = branches[k](state.replace(opt_state=opt_state), batch, rng=rng)
            return new.replace(opt_state=put(state.opt_state, k, new.opt_state)), metrics

        shapes = [jax.eval_shape(functools.partial(run, k), state)[1] for k in range(len(branches))]
        keys = sorted(set().union(*shapes))

        def padded(k):
            def branch(state):
                new, metrics = run(k, state)
                filled = {key: metrics.get(key, jnp.float32(jnp.nan)) for key in keys}
                filled = {key: jnp.asarray(v, jnp.float32) for key, v in filled.items()}
                return new, {**filled, "branch": jnp.float32(k)}

            return branch

        # lax.switch clamps an index outside [0, len(branches)) to the nearest branch.
        return jax.lax.switch(choose(state), [padded(k) for k in range(len(branches))], state)

    return step
