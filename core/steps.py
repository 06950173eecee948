"""Step builders and combinators.

A step is `step(state, batch, *, rng) -> (state, metrics)`. The core owns `state.step` (it
increments it after the method's step) and derives `rng` from `fold_in(state.rng, state.step)`,
so steps never manage either.
"""

from collections.abc import Callable

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
