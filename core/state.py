"""TrainState: pure data, a pytree that jit, orbax and `jax.tree.map` all understand."""

from typing import Any

import jax
from flax import struct


@struct.dataclass
class TrainState:
    """Everything a step reads and writes.

    `rng` is a raw uint32[2] key (`jax.random.PRNGKey`) so checkpoints stay plain arrays; the core
    folds in `step` for per-step randomness, which makes a resumed run draw the same numbers.
    `extra` holds method state that is not trained by the optimiser (EMA weights, a frozen
    reference model, running statistics).
    """

    step: jax.Array
    rng: jax.Array
    params: Any
    opt_state: Any
    extra: Any = struct.field(default_factory=dict)
