"""The Method protocol: a method is a bundle of pure functions, like `optax.GradientTransformation`.

The core jits and shards these functions; it never branches on which method it runs.

- ``init(rng, batch_spec) -> {"params": ..., **extra}``: `batch_spec` is a pytree of
  `jax.ShapeDtypeStruct` describing one global batch. Must be `jax.eval_shape`-safe.
- ``loss(params, batch, *, rng, extra) -> (scalar, metrics)``: metrics is a flat dict of scalars.
  A `"num_tokens"` metric, if present, is summed by the logger to report tokens/s.
- ``step(state, batch, *, rng) -> (state, metrics)``: optional; `None` means
  `core.steps.gradient_step(loss, tx)`. Methods that are not plain gradient descent bring their own.
- ``tx``: optional optax transformation; `None` means `core.optim.make(config.optim)`.
- ``dataset(split, *, shard, seed) -> iterator of numpy dicts``: the per-process batches.
  `shard = (process_index, process_count)`. Iterators with `get_state`/`set_state` (grain) are
  checkpointed with the run, so a resumed run sees the same data order.
- ``evaluate(state, *, seed) -> metrics``: optional host-level evaluation, called every
  `config.train.eval_every` steps and at the end.
- ``sharding_rules``: extra `(regex, PartitionSpec)` pairs for tensor parallelism, matched with
  `re.search` against "/"-joined leaf paths of the whole train state.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import optax


class Method(NamedTuple):
    init: Callable[..., dict[str, Any]]
    loss: Callable[..., tuple[Any, dict[str, Any]]]
    step: Callable[..., tuple[Any, dict[str, Any]]] | None = None
    tx: optax.GradientTransformation | None = None
    dataset: Callable[..., Any] | None = None
    evaluate: Callable[..., dict[str, Any]] | None = None
    sharding_rules: tuple = ()
