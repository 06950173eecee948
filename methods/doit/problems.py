"""The tasks DOIT is run on, as core Methods with a loss: the paper's 2-D test functions
(Rosenbrock, Three-Hump Camel; a dummy one-row batch, the loss is the function itself, the
start point drawn from the run's key in a box around the minimum)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from core.errors import ConfigError
from core.method import Method


def rosenbrock(xy):
    x, y = xy[..., 0], xy[..., 1]
    return (1 - x) ** 2 + 100 * (y - x**2) ** 2


def three_hump_camel(xy):
    x, y = xy[..., 0], xy[..., 1]
    return 2 * x**2 - 1.05 * x**4 + x**6 / 6 + x * y + y**2


# function, start box (low corner, high corner); both minima are 0.
FUNCTIONS = {
    "rosenbrock": (rosenbrock, (-2.0, -1.0), (2.0, 3.0)),
    "camel": (three_hump_camel, (-2.0, -2.0), (2.0, 2.0)),
}


def function(name: str):
    if name not in FUNCTIONS:
        raise ConfigError(f"doit.task={name!r} is unknown; expected one of: {', '.join(FUNCTIONS)}")
    return FUNCTIONS[name]


def toy(name: str, batch_size: int) -> Method:
    """`batch_size` dummy rows: the loss ignores them (they only satisfy the batch split)."""
    fn, low, high = function(name)

    def init(rng, batch_spec):
        del batch_spec
        return {"params": {"xy": jax.random.uniform(rng, (2,), minval=jnp.array(low),
                                                     maxval=jnp.array(high))}}  # fmt: skip

    def loss(params, batch, *, rng, extra):
        del batch, rng, extra
        return fn(params["xy"]), {}

    def dataset(split, *, shard, seed):
        # Constant rows: nothing to shuffle, checkpoint or generate (grain's synthetic stream
        # cost more than the 25 steps of a cycle here).
        del seed
        rows = batch_size // shard[1]
        return itertools.repeat({"x": np.zeros((rows,), np.float32)})

    return Method(init, loss=loss, dataset=dataset)
