"""The generic config fields every method has, checked before anything is traced or written.

`config(c)` checks what `configs/common.py: base_config` defines and the core reads (train.*,
seed, dtype, matmul_precision, fsdp_min_size, optim.*) and raises a one-line
`core.errors.ConfigError` naming the method, the field and the value:

    lm: train.batch_size=0 must be a positive integer

Checks that already live elsewhere are called, not copied: optimiser and schedule names
(`core.optim.make`), dtype and matmul precision names (`core.precision`). Checks that need the
mesh (batch size against the data-parallel size) or a method (its own fields, its evaluation
batches) stay where those exist; `naming(c)` puts the method's name in front of theirs.
A method's own fields are its `make`'s to check.
"""

import contextlib
import math
from collections.abc import Iterator

from core import optim, precision
from core.errors import ConfigError, method_name


def config(c) -> None:
    """Raise a one-line ConfigError for the first bad generic field of `c` (see the module)."""
    with naming(c):
        _train(c)
        _integer(c, "seed", c.seed, 0, "a non-negative integer")
        _integer(c, "fsdp_min_size", c.get("fsdp_min_size", 0), 0, "a non-negative integer")
        precision.compute_dtype(c.get("dtype", "auto"), platform="cpu")  # the name only
        precision.matmul_precision(c)
        if c.get("optim") is not None:
            _optim(c)


@contextlib.contextmanager
def naming(c) -> Iterator[None]:
    """A ConfigError raised inside gets the method's name in front (unless it has it already):
    for checks written without the config at hand (the mesh, the batch size, the optimiser)."""
    name = method_name(c)
    try:
        yield
    except ConfigError as e:
        if str(e).startswith(f"{name}: "):
            raise
        raise ConfigError(f"{name}: {e}").with_traceback(e.__traceback__) from None


def _train(c) -> None:
    t = c.train
    # 0 steps is legal: the run evaluates the initial state (a baseline, or train.init_from's
    # params) and stops, as an evaluate-only method's run does.
    _integer(c, "train.steps", t.steps, 0, "a non-negative integer (0: evaluate only)")
    _integer(c, "train.batch_size", t.batch_size, 1, "a positive integer")
    _integer(c, "train.log_every", t.log_every, 1, "a positive integer")
    _integer(c, "train.eval_every", t.eval_every, None, "an integer (>0 every N, 0 end, <0 never)")
    _integer(c, "train.checkpoint_every", t.checkpoint_every, 0, "an integer >= 0 (0: never)")
    _integer(c, "train.keep_checkpoints", t.keep_checkpoints, 1, "a positive integer")


def _optim(c) -> None:
    o = c.optim
    _integer(c, "optim.warmup_steps", o.warmup_steps, 0, "a non-negative integer")
    for field in ("lr", "eps", "weight_decay", "grad_clip", "final_lr_fraction"):
        _number(c, f"optim.{field}", o[field], 0.0, math.inf, "a finite number >= 0")
    if o.get("weight_decay_end") is not None:
        _number(c, "optim.weight_decay_end", o.weight_decay_end, 0.0, math.inf, "None or >= 0")
    for field in ("b1", "b2", "momentum"):
        _number(c, f"optim.{field}", o[field], 0.0, 1.0, "a number in [0, 1)")
    optim.make(o, c.train.steps)  # the optimiser and schedule names: refused there


def _integer(c, field: str, value, low: int | None, what: str) -> None:
    # bool is an int in Python, but `steps=True` is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, int) or (low is not None and value < low):
        raise ConfigError(f"{method_name(c)}: {field}={value!r} must be {what}")


def _number(c, field: str, value, low: float, high: float, what: str) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    # [low, high) for a bounded range (b1 = 1 never forgets), [low, inf) otherwise (finite).
    if not ok or not low <= value < high:
        raise ConfigError(f"{method_name(c)}: {field}={value!r} must be {what}")
