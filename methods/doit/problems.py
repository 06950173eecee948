"""The tasks DOIT is run on, as core Methods with a loss: the paper's 2-D test functions
(Rosenbrock, Three-Hump Camel; dummy rows, the loss is the function itself, the start point
drawn from the run's key in a box around the minimum) and the digits MLP (64-256-256-10 on
core.digits' fixed train split)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

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
        known = ", ".join([*FUNCTIONS, "digits"])
        raise ConfigError(f"doit.task={name!r} is unknown; expected one of: {known}")
    return FUNCTIONS[name]


def toy(name: str) -> Method:
    """A 2-D test function of the parameters: no data (the core calls the step with no batch)."""
    fn, low, high = function(name)

    def init(rng, batch_spec):
        del batch_spec
        return {"params": {"xy": jax.random.uniform(rng, (2,), minval=jnp.array(low),
                                                     maxval=jnp.array(high))}}  # fmt: skip

    def loss(params, batch, *, rng, extra):
        del batch, rng, extra
        return fn(params["xy"]), {}

    return Method(init, loss=loss)


MLP_WIDTHS = (64, 256, 256, 10)


def mlp_init(rng):
    """He-normal kernels, zero biases: dense_0..dense_2 of MLP_WIDTHS."""
    params = {}
    for i, (n_in, n_out) in enumerate(zip(MLP_WIDTHS[:-1], MLP_WIDTHS[1:], strict=True)):
        rng, key = jax.random.split(rng)
        kernel = jax.random.normal(key, (n_in, n_out)) * jnp.sqrt(2.0 / n_in)
        params[f"dense_{i}"] = {"kernel": kernel, "bias": jnp.zeros((n_out,))}
    return params


def mlp_logits(params, x_BD):
    h = x_BD
    for i in range(len(MLP_WIDTHS) - 1):
        layer = params[f"dense_{i}"]
        h = h @ layer["kernel"] + layer["bias"]
        if i < len(MLP_WIDTHS) - 2:
            h = jax.nn.relu(h)
    return h


@jax.jit
def mlp_accuracy(params, x_ND, labels_N):
    return jnp.mean(jnp.argmax(mlp_logits(params, x_ND), -1) == labels_N)


def digits_arrays(split: str, classes=None) -> dict[str, np.ndarray]:
    """core.digits' fixed split as flat pixels in [-1, 1] [N, 64] and int32 labels (only the
    examples of `classes` when given)."""
    from core import digits

    part = getattr(digits.load_splits(), split)
    keep = np.ones(len(part.labels), bool) if classes is None else np.isin(part.labels, classes)
    return {"x": part.images.reshape(len(part.labels), -1)[keep], "label": part.labels[keep]}


def digits_mlp(batch_size: int, classes=None) -> Method:
    """The 64-256-256-10 MLP on core.digits' train split (cross-entropy, epochs of shuffled
    batches from the run's seed; only the examples of `classes` when given)."""
    from core import data

    train_arrays = digits_arrays("train", classes)

    def init(rng, batch_spec):
        del batch_spec
        return {"params": mlp_init(rng)}

    def loss(params, batch, *, rng, extra):
        del rng, extra
        logits = mlp_logits(params, batch["x"])
        value = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
        return value, {}

    def dataset(split, *, shard, seed):
        return data.in_memory(train_arrays, global_batch=batch_size, seed=seed, shard=shard)

    return Method(init, loss=loss, dataset=dataset)


def mlp_features(params, x_BD):
    """The MLP's penultimate activations (the input of its last layer)."""
    h = x_BD
    for i in range(len(MLP_WIDTHS) - 2):
        h = jax.nn.relu(h @ params[f"dense_{i}"]["kernel"] + params[f"dense_{i}"]["bias"])
    return h


def linear_head(batch_size: int, arrays: dict[str, np.ndarray], num_classes: int) -> Method:
    """A linear softmax classifier {"head": {kernel, bias}} on fixed features (`arrays`: "x"
    [N, D] and "label" in [0, num_classes)): a pretrained network's head trained on frozen
    features. LeCun-normal kernel (no nonlinearity follows), zero bias."""
    from core import data

    dim = arrays["x"].shape[1]

    def init(rng, batch_spec):
        del batch_spec
        kernel = jax.random.normal(rng, (dim, num_classes)) * jnp.sqrt(1.0 / dim)
        return {"params": {"head": {"kernel": kernel, "bias": jnp.zeros((num_classes,))}}}

    def loss(params, batch, *, rng, extra):
        del rng, extra
        logits = batch["x"] @ params["head"]["kernel"] + params["head"]["bias"]
        value = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
        return value, {}

    def dataset(split, *, shard, seed):
        return data.in_memory(arrays, global_batch=batch_size, seed=seed, shard=shard)

    return Method(init, loss=loss, dataset=dataset)
