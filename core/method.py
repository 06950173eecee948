"""The Method protocol: a method is a bundle of pure functions, like `optax.GradientTransformation`.

The core jits and shards these functions; it never branches on which method it runs. Every
field but `init` is optional, so one protocol covers gradient descent, closed-form fits,
alternating (GAN-like) updates, host-steered schedules and methods that train nothing.

- ``init(rng, batch_spec) -> {"params": ..., **extra}``: `batch_spec` is a pytree of
  `jax.ShapeDtypeStruct` describing one global batch. Traced leaves (random init) are built
  under `jit`, sharded from the start; leaves that are already concrete arrays (numpy, or
  pretrained weights loaded from a file) are placed by the core with their shardings, never
  baked into the program. `init` is traced more than once: cache file loads inside it.
- ``loss(params, batch, *, rng, extra) -> (scalar, metrics)``: metrics is a flat dict of scalars.
  A `"num_tokens"` metric, if present, is summed by the logger to report tokens/s. With no
  `step`, the core trains with `core.steps.gradient_step(loss, tx)`.
- ``step(state, batch, *, rng) -> (state, metrics)``: a method that is not plain gradient
  descent brings its own (closed-form fits, RL, branches chosen by `core.steps.switch`).
- ``tx``: the optimiser. With the core's gradient step, `None` means
  `core.optim.make(config.optim)`. With a method's own `step`, `None` means no optimiser state
  (`state.opt_state` is an empty `optax.EmptyState()`), a transformation gives
  `state.opt_state = tx.init(params)`, and a dict of named transformations gives a dict of
  named states (e.g. generator and discriminator, or a warm start and RL).
- ``dataset(split, *, shard, seed) -> iterator of numpy dicts``: the per-process batches.
  `shard = (process_index, process_count)`. "train" is endless; "eval" (read by `eval_step`)
  is finite. Iterators with `get_state`/`set_state` (grain) are checkpointed with the run.
  A method that makes its own data inside the step (a game, an environment, samples of a
  known distribution) has no dataset: its step is called with ``batch=None`` and
  `train.batch_size` is not read.
- ``eval_step(state, batch, *, rng) -> {name: (sum, weight)}``: evaluation run by the core:
  jitted over `dataset("eval")` with the batch sharded like training's, its outputs
  replicated; the host adds sums and weights over batches and reports `sum / weight`. Works
  on any mesh and any number of processes.
- ``evaluate(state, *, seed) -> metrics``: host-level evaluation for what cannot be jitted
  (e.g. an AUROC over all scores). Both evaluations run every `config.train.eval_every`
  steps and at the end; their metrics are merged and logged as ``eval/<metric>``.
- ``evaluators``: further named evaluation streams (`Evaluator`): each reads its own split
  with its own `eval_step` and/or host `evaluate`, at its own interval, and is logged as
  ``eval/<name>/<metric>`` (lengths 1x..8x, in- and out-of-domain sets, graph splits).
- ``hook(state, *, step) -> state | None``: host code between steps (after step `step`, before
  its checkpoint), e.g. a surrogate choosing the next optimiser or a curriculum. Returning a
  state replaces the current one (the core places it with the state's shardings); its
  decisions must be functions of the state, which is checkpointed, so a resumed run repeats
  them exactly.
- ``needs_init_from``: the parameters come from another run (``train.init_from``), e.g. a
  verifier of a trained detector or a post-training transform: a run without it is refused
  before anything is written, rather than evaluating a random initialisation.
- ``sharding_rules``: extra `(regex, PartitionSpec)` pairs for tensor parallelism, matched with
  `re.search` against "/"-joined leaf paths of the whole train state.

A method with neither `loss` nor `step` trains nothing: `core.train.run` then runs an
evaluation of its initial state (a detector verifier, a decoding rule, a benchmark scorer).
"""

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import optax

Optimiser = optax.GradientTransformation | Mapping[str, optax.GradientTransformation]


class Evaluator(NamedTuple):
    """A named evaluation stream, logged as ``eval/<name>/<metric>``.

    `eval_step(state, batch, *, rng) -> {metric: (sum, weight)}` is jitted by the core over one
    pass of `dataset(split)` (as `Method.eval_step` over "eval"); `evaluate(state, *, seed)`
    runs on the host; give either or both. `every`: steps between runs (> 0: every `every`
    steps and at the end; 0: at the end; < 0: never); None follows `train.eval_every`.
    """

    name: str
    eval_step: Callable[..., dict[str, Any]] | None = None
    evaluate: Callable[..., dict[str, Any]] | None = None
    split: str = "eval"
    every: int | None = None


class Method(NamedTuple):
    init: Callable[..., dict[str, Any]]
    loss: Callable[..., tuple[Any, dict[str, Any]]] | None = None
    step: Callable[..., tuple[Any, dict[str, Any]]] | None = None
    tx: Optimiser | None = None
    dataset: Callable[..., Any] | None = None
    evaluate: Callable[..., dict[str, Any]] | None = None
    sharding_rules: tuple = ()
    eval_step: Callable[..., dict[str, Any]] | None = None
    hook: Callable[..., Any] | None = None
    evaluators: tuple[Evaluator, ...] = ()
    needs_init_from: bool = False

    @property
    def trains(self) -> bool:
        return self.loss is not None or self.step is not None

    @property
    def evaluates(self) -> bool:
        return any(s.eval_step or s.evaluate for s in (self, *self.evaluators))
