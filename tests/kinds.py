"""Two kinds of method the generic tests take as they are, defined here and not in methods/:

- `threshold_rule`: evaluate-only (no loss, no step): a fixed linear rule, score = x . w against
  a threshold, scored for accuracy on a `core.data.one_pass` evaluation set. A run evaluates it
  once; what AOT compiles for it is its eval step.
- `self_sampled_regression`: data-free (a step, no dataset): each step draws its own samples
  from the step's rng, spread over the chips, and takes one optimiser step on the squared error
  of a linear model against a fixed target map. The core calls its step with `batch=None`.

`ENTRIES` holds them as `core.declarations.Entry`s (a config function, declarations, a `make`),
which the generic tests add to the entries of configs/*.py.
"""

import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

from configs.common import base_config, choose, parse_arg
from core import benchmark, data, optim, train
from core.declarations import Declarations, Entry
from core.method import Method
from core.precision import compute_dtype

FEATURES = 4
TARGET_W = np.array([1.0, -2.0, 0.5, 0.0], np.float32)  # the rule's weights; the map to learn
FLOAT32_ONLY = ("float32",)

# ------------------------------------------------------------------ evaluate-only


def rule_config(arg: str | None = None):
    opts = parse_arg(arg, {"mesh": "auto", "size": "full"})
    # eval batch, examples: the full eval batch spreads over 256 chips
    batch, examples = choose("size", opts["size"], {"smoke": (32, 100), "full": (256, 1000)})
    c = base_config(opts["mesh"])
    c.method = "threshold_rule"
    c.dtype = "float32"
    c.eval_batch_size, c.examples = batch, examples
    return c


def scored_set(n: int) -> dict[str, np.ndarray]:
    """Features and labels of a noisy version of the rule (fixed: seed 0)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    label = (x @ TARGET_W + 0.5 * rng.normal(size=n) > 0).astype(np.float32)
    return {"x": x, "label": label}


def make_rule(config) -> Method:
    compute_dtype(config.dtype, FLOAT32_ONLY, "a fixed rule scored in float32")
    arrays = scored_set(config.examples)

    def init(rng, batch_spec):  # host values: placed, not compiled in
        return {"params": {"w": TARGET_W, "threshold": np.float32(0.0)}}

    def eval_step(state, batch, *, rng):
        score = batch["x"] @ state.params["w"]
        hit = (score > state.params["threshold"]) == (batch["label"] > 0)
        return {"accuracy": (jnp.sum(batch["mask"] * hit), jnp.sum(batch["mask"]))}

    def dataset(split, *, shard, seed):
        return data.one_pass(arrays, global_batch=config.eval_batch_size, shard=shard)

    return Method(init, eval_step=eval_step, dataset=dataset)


# ------------------------------------------------------------------ data-free


def regression_config(arg: str | None = None):
    opts = parse_arg(arg, {"mesh": "auto", "size": "full"})
    steps, samples = choose("size", opts["size"], {"smoke": (2, 8), "full": (200, 256)})
    c = base_config(opts["mesh"])
    c.method = "self_sampled_regression"
    c.dtype = "float32"
    c.train.steps = steps
    c.train.log_every = 1
    c.samples_per_step = samples  # its own batch: train.batch_size is not read without a dataset
    c.optim.lr = 0.05
    return c


def make_regression(config) -> Method:
    compute_dtype(config.dtype, FLOAT32_ONLY, "a float32 toy")
    tx = optim.make(config.optim, config.train.steps)

    def init(rng, batch_spec):
        return {"params": {"w": jnp.zeros(FEATURES, jnp.float32)}}

    def step(state, batch, *, rng):
        if batch is not None:
            raise AssertionError("a method without a dataset must get batch=None")
        x_NF = jax.random.normal(rng, (config.samples_per_step, FEATURES))
        # The samples are split over every chip, as a dataset's batch would be.
        x_NF = jax.lax.with_sharding_constraint(x_NF, P(("data", "fsdp")))
        y_N = x_NF @ jnp.asarray(TARGET_W)

        def loss(params):
            return jnp.mean(jnp.square(x_NF @ params["w"] - y_N))

        value, grads = jax.value_and_grad(loss)(state.params)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        return state.replace(params=params, opt_state=opt_state), {"loss": value}

    return Method(init, step=step, tx=tx)


# ------------------------------------------------------------------ benchmarks


def _rule_bench(*, smoke: bool = False) -> benchmark.Result:
    """The rule's evaluation as the core runs it (jitted eval step over the one-pass set, one
    device) against the same accuracy in NumPy, side by side."""
    config = rule_config("size=smoke" if smoke else "")
    session = train.init(config, make_rule(config), devices=jax.devices()[:1])
    arrays, repeats = scored_set(config.examples), 2 if smoke else 10
    core_s = benchmark.median_seconds(session.evaluate, repeats)
    numpy_s = benchmark.median_seconds(
        lambda: np.mean((arrays["x"] @ TARGET_W > 0) == (arrays["label"] > 0)), repeats
    )
    figure = f"threshold rule accuracy over {config.examples} examples"
    ratio = benchmark.Ratio(figure, "core.train evaluate", core_s, "NumPy", numpy_s, "s")
    return benchmark.Result([ratio], details={"accuracy": session.evaluate()["accuracy"]})


def _regression_bench(*, smoke: bool = False) -> benchmark.Result:
    """The core's data-free step (its own samples drawn inside it) against the bare jitted
    gradient of the same loss, side by side on one device."""
    config = regression_config("size=smoke" if smoke else "")
    session = train.init(config, make_regression(config), devices=jax.devices()[:1])
    x_NF = jax.random.normal(jax.random.PRNGKey(0), (config.samples_per_step, FEATURES))
    grad = jax.jit(jax.grad(lambda w: jnp.mean(jnp.square(x_NF @ w - x_NF @ TARGET_W))))
    w = jnp.zeros(FEATURES)

    def step():
        session.state, metrics = session.step(session.state, None)
        jax.block_until_ready(metrics)

    repeats = 2 if smoke else 20
    step_s = benchmark.median_seconds(step, repeats)
    grad_s = benchmark.median_seconds(lambda: grad(w).block_until_ready(), repeats)
    figure = f"self-sampled regression, {config.samples_per_step} samples per step"
    ratio = benchmark.Ratio(figure, "core step", step_s, "bare gradient", grad_s, "s")
    return benchmark.Result([ratio], details={"steps_taken": int(session.state.step)})


# What launch.bench reads of a benchmark module: `measure(*, smoke)`.
BENCHES = {
    "threshold_rule": types.SimpleNamespace(measure=_rule_bench),
    "self_sampled_regression": types.SimpleNamespace(measure=_regression_bench),
}

# Nothing to declare beyond the defaults: the smoke variant is size=smoke, the largest the
# default config (size=full), and each has a matmul on a batch spread over the chips.
ENTRIES = [
    Entry("threshold_rule", rule_config, Declarations(), make_rule),
    Entry("self_sampled_regression", regression_config, Declarations(), make_regression),
]
