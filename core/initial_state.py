"""The initial train state: built under `jit` with its shardings, with host arrays (pretrained
weights) placed rather than compiled in, or with another run's parameters (`train.init_from`).
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from core import storage
from core.checkpoint import Checkpointer, abstract_with_shardings
from core.errors import ConfigError
from core.method import Method
from core.sharding import path_str
from core.state import TrainState
from core.steps import init_opt_state


def make_state_fn(method: Method, tx, batch_spec) -> Callable[[jax.Array], TrainState]:
    """`make_state(rng)`: the initial state from the key of `config.seed`. The key is an
    argument, not a constant, so runs that differ only in seed share one init program (the
    persistent compilation cache then compiles it once)."""

    def make_state(rng):
        init_rng, state_rng = jax.random.split(rng)
        variables = dict(method.init(init_rng, batch_spec))
        if "params" not in variables:
            raise ConfigError("Method.init must return a dict with a 'params' entry")
        params = variables.pop("params")
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            rng=state_rng,
            params=params,
            opt_state=init_opt_state(tx, params),
            extra=variables,
        )

    return make_state


def place(value, sharding):
    """A host value (numpy, or the same array on every process) as a global array with
    `sharding`; each process supplies only its addressable shards."""
    if isinstance(value, jax.Array) and value.sharding == sharding:
        return value
    host = np.asarray(value)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def host_leaves(make_state: Callable, rng) -> list:
    """For each leaf of the state `make_state(rng)` builds (flattened): the concrete array
    `init` returned for it (pretrained weights, numpy), or None where it is traced (random
    init)."""
    concrete: list = []

    def traced(rng):
        state = make_state(rng)
        concrete[:] = [
            None if isinstance(x, jax.core.Tracer) else x for x in jax.tree.leaves(state)
        ]
        return state

    jax.eval_shape(traced, rng)
    return concrete


def with_host_leaves(make_state: Callable, concrete: list) -> Callable:
    """`make_state` with its concrete leaves taken from an argument (the list of them), so a
    jitted initialisation receives them as inputs instead of compiling them in."""

    def make(rng, supplied_leaves):
        leaves, treedef = jax.tree.flatten(make_state(rng))
        supplied = iter(supplied_leaves)
        leaves = [x if c is None else next(supplied) for x, c in zip(leaves, concrete, strict=True)]
        return treedef.unflatten(leaves)

    return make


def seed_key(seed: int) -> np.ndarray:
    """The key of `config.seed` as host data: the same on every process, and an input of the
    jitted init rather than a constant, so runs differing only in seed share one program."""
    return np.asarray(jax.random.PRNGKey(seed))


def initial_state(make_state: Callable, rng, state_shardings) -> TrainState:
    """The initial state, built under `jit` with its shardings. Leaves `init` returns as
    concrete arrays (pretrained weights) would become constants of that program, copied into
    the executable and every device: they are placed from the host and passed in instead."""
    concrete = host_leaves(make_state, rng)
    if all(x is None for x in concrete):
        return jax.jit(make_state, out_shardings=state_shardings)(rng)
    shardings = jax.tree.leaves(state_shardings)
    placed = [place(x, s) for x, s in zip(concrete, shardings, strict=True) if x is not None]
    make = with_host_leaves(make_state, concrete)
    return jax.jit(make, out_shardings=state_shardings)(rng, placed)


def check_init_from(source: str, abstract_params) -> None:
    """For `train.init_from=pretrained:<name or path>`: a one-line ConfigError unless the
    checkpoint's tree (metadata only: nothing dequantized) has the method's parameter paths and
    shapes. Called by the plan, before anything is written; other sources are checked when
    restored."""
    if not (source or "").startswith("pretrained:"):
        return
    from core import pretrained  # its modules import this one's `place`

    what = f"train.init_from={source}"
    try:
        have = pretrained.abstract_params(source[len(pretrained.PREFIX) :])
    except pretrained.PretrainedError as e:
        raise pretrained.PretrainedError(f"{what}: {e}") from None
    pretrained.llama_params.check_fits(have, abstract_params, what)


def restore_params(state: TrainState, state_shardings, source: str) -> TrainState:
    """`state` with its params replaced by those of another run's newest good checkpoint
    (`source`: that run's workdir or its checkpoints/ folder), placed in this run's layout;
    or, for "pretrained:<name or path>", by a pretrained model's weights (`core.pretrained`),
    cast to the state's param dtypes."""
    if source.startswith("pretrained:"):
        return _restore_pretrained(state, state_shardings, source)
    directory = storage.resolve(source, what="train.init_from")
    if (directory / "checkpoints").exists():
        directory = directory / "checkpoints"
    abstract = abstract_with_shardings(state.params, state_shardings.params)
    with Checkpointer(directory, create=False) as ckpt:
        params = ckpt.restore_params(abstract)
    return state.replace(params=params)


def _restore_pretrained(state: TrainState, state_shardings, source: str) -> TrainState:
    from core import pretrained

    what = f"train.init_from={source}"
    try:
        model = pretrained.load(source[len(pretrained.PREFIX) :], tokenizer=False)
    except pretrained.PretrainedError as e:
        raise pretrained.PretrainedError(f"{what}: {e}") from None
    pretrained.llama_params.check_fits(model.params, state.params, what)
    # Matched by "/"-joined path (check_fits), cast leaf by leaf to the state's dtypes.
    have = {path_str(p): x for p, x in jax.tree_util.tree_flatten_with_path(model.params)[0]}
    paths_leaves, treedef = jax.tree_util.tree_flatten_with_path(state.params)
    host = [np.asarray(have[path_str(p)], like.dtype) for p, like in paths_leaves]
    params = treedef.unflatten(host)
    return state.replace(params=jax.tree.map(place, params, state_shardings.params))
