"""Step builders and combinators.

A step is `step(state, batch, *, rng) -> (state, metrics)`. The core owns `state.step` (it
increments it after the method's step) and derives `rng` from `fold_in(state.rng, state.step)`,
so steps never manage either.
"""

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import optax

from core.errors import ConfigError


def gradient_step(loss: Callable, tx: optax.GradientTransformation) -> Callable:
    """Plain gradient descent on `loss(params, batch, *, rng, extra) -> (value, metrics)`."""

    def step(state, batch, *, rng):
        grad_fn = jax.value_and_grad(loss, has_aux=True)
        (value, metrics), grads = grad_fn(state.params, batch, rng=rng, extra=state.extra)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {"loss": value, **metrics, "grad_norm": optax.tree.norm(grads)}
        return state.replace(params=params, opt_state=opt_state), metrics

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


def with_ema(step: Callable, decay: float, key: str = "ema") -> Callable:
    """Wrap a step to keep an exponential moving average of params in `state.extra[key]`
    (initialise it with a copy of the params in the method's `init`)."""

    def ema_step(state, batch, *, rng):
        state, metrics = step(state, batch, rng=rng)
        ema = jax.tree.map(lambda e, p: decay * e + (1 - decay) * p, state.extra[key], state.params)
        return state.replace(extra={**state.extra, key: ema}), metrics

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


def stacked(*txs: optax.GradientTransformation) -> optax.GradientTransformation:
    """The optimiser of a `phased` method: its state is one state per phase (a tuple).

    Only `init` is meaningful; each phase's step updates with its own transformation.
    """

    def init(params):
        return tuple(tx.init(params) for tx in txs)

    def update(updates, state, params=None):
        raise TypeError("stacked(...) holds per-phase states; use each phase's own tx.update")

    return optax.GradientTransformation(init, update)


def phased(phases: Sequence[tuple[int | None, Callable]]) -> Callable:
    """One step that runs `phases[k] = (num_steps, step_k)` in order, switching on `state.step`.

    E.g. a supervised warm start, then RL: `phased([(200, sft_step), (None, grpo_step)])`; the
    last phase may be open-ended (None). Phase k's step sees `state.opt_state[k]` as its
    optimiser state (build the method's tx with `stacked(tx_0, tx_1, ...)`), so each phase has
    its own optimiser and a schedule that starts at its first step. Both steps are compiled
    into one executable; `lax.switch` runs one. Metrics are the union of the phases' keys, NaN
    where the running phase has none (the metrics logger leaves those out), plus "phase".
    """
    if not phases or any(n is None for n, _ in phases[:-1]):
        raise ConfigError("phased: give >= 1 phase; only the last may have num_steps=None")
    for n, _ in phases:
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
            raise ConfigError(f"phased: num_steps must be an int >= 0 or None, got {n!r}")
    ends = [n for n, _ in phases if n is not None]
    boundaries = jnp.cumsum(jnp.asarray(ends, jnp.int32)) if ends else jnp.zeros((0,), jnp.int32)

    def step(state, batch, *, rng):
        def branch(k, inner):
            def run(state):
                sub = state.replace(opt_state=state.opt_state[k])
                new, metrics = inner(sub, batch, rng=rng)
                opt_state = tuple(
                    new.opt_state if i == k else s for i, s in enumerate(state.opt_state)
                )
                return new.replace(opt_state=opt_state), metrics

            return run

        runs = [branch(k, inner) for k, (_, inner) in enumerate(phases)]
        shapes = [jax.eval_shape(run, state)[1] for run in runs]
        keys = sorted(set().union(*shapes))

        def padded(k):
            def run(state):
                new, metrics = runs[k](state)
                filled = {key: metrics.get(key, jnp.float32(jnp.nan)) for key in keys}
                filled = {key: jnp.asarray(v, jnp.float32) for key, v in filled.items()}
                return new, {**filled, "phase": jnp.float32(k)}

            return run

        # Phase index: how many phase ends the step has passed (the last phase absorbs the rest).
        index = jnp.minimum(jnp.sum(state.step >= boundaries), len(phases) - 1)
        return jax.lax.switch(index, [padded(k) for k in range(len(phases))], state)

    return step
