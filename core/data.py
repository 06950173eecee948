"""Input pipelines: grain datasets on each process -> per-process numpy -> global jax.Arrays.

`synthetic` builds a resumable grain pipeline from a per-example generator. Example `i` of the
stream is drawn from `np.random.default_rng([seed, i])`, and global batch `b` holds examples
`b*B .. (b+1)*B-1` with process `p` producing its contiguous slice. So the global batch at every
step is identical whatever the process count, and the iterator state (a batch index) resumes it
exactly.
"""

import functools
import os
from collections.abc import Callable, Iterator
from typing import Any

import grain
import jax
import numpy as np
from jax.sharding import NamedSharding

from core.errors import ConfigError

_ENDLESS = 2**62  # "infinite" stream length; grain's range dataset is lazy


def read_options() -> grain.ReadOptions:
    """How far and with how many threads a pipeline runs ahead of training.

    grain's defaults (16 threads, 500 batches ahead) suit a loader of files, not a generator
    that competes with the step for the same cores: its threads fill the 500-batch buffer while
    the step waits. Measured on 2 cores (soft_thinking's quick model, 50 steps): 10.9 s with the
    defaults, 2.4 s with one thread per core and two batches per thread ahead; a task whose
    examples cost nothing runs the same steps in 1.0 s. `$ICLR26_DATA_THREADS` overrides the
    thread count (a heavy pipeline on a many-core host)."""
    threads = int(os.environ.get("ICLR26_DATA_THREADS", 0)) or min(16, os.cpu_count() or 1)
    return grain.ReadOptions(num_threads=threads, prefetch_buffer_size=2 * threads)


def _num_examples(arrays: dict, who: str) -> int:
    sizes = {k: np.shape(v)[0] if np.ndim(v) else None for k, v in arrays.items()}
    if len(set(sizes.values())) != 1 or None in sizes.values():
        raise ConfigError(f"{who}: arrays need one shared leading dimension, got {sizes}")
    return next(iter(sizes.values()))


def _local_batch(global_batch: int, process_count: int, name: str) -> int:
    """This process's share of a global batch, which must split evenly over processes."""
    if global_batch % process_count:
        raise ConfigError(
            f"{name}={global_batch} is not divisible by the process count {process_count}"
        )
    return global_batch // process_count


def stack(examples: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.stack([e[k] for e in examples]) for k in examples[0]}


def synthetic(
    example_fn: Callable[[np.random.Generator], dict[str, np.ndarray]] | None = None,
    *,
    global_batch: int,
    seed: int,
    shard: tuple[int, int] = (0, 1),
    num_batches: int | None = None,
    examples_fn: Callable[[list[np.random.Generator]], dict[str, np.ndarray]] | None = None,
    indexed: bool = False,
) -> grain.DatasetIterator:
    """A checkpointable iterator of this process's share of each global batch.

    Give `example_fn(rng) -> example`, or `examples_fn(rngs) -> stacked examples`: the same
    stream (example i still draws from its own generator) built with one vectorised call per
    batch, for a task whose per-example NumPy overhead would otherwise rival the step.
    indexed=True calls them with the global batch index too, `example_fn(rng, b)`: a
    curriculum keyed by the step (batch b feeds step b), which resumes exactly because b is
    the iterator's checkpointed state."""
    if (example_fn is None) == (examples_fn is None):
        raise ConfigError("synthetic: give exactly one of example_fn and examples_fn")
    index, count = shard
    local = _local_batch(global_batch, count, "train.batch_size")

    def make_batch(b: int) -> dict[str, np.ndarray]:
        first = b * global_batch + index * local
        rngs = [np.random.default_rng([seed, first + j]) for j in range(local)]
        extra = (b,) if indexed else ()
        if examples_fn:
            return examples_fn(rngs, *extra)
        return stack([example_fn(r, *extra) for r in rngs])

    dataset = grain.MapDataset.range(num_batches or _ENDLESS).map(make_batch)
    return iter(dataset.to_iter_dataset(read_options()))


def in_memory(
    arrays: dict[str, np.ndarray],
    *,
    global_batch: int,
    seed: int,
    shard: tuple[int, int] = (0, 1),
    shuffle: bool = True,
    num_batches: int | None = None,
) -> grain.DatasetIterator:
    """A checkpointable iterator over a fixed dataset held in memory, epoch after epoch.

    `arrays` share their leading (example) dimension. The stream is the concatenation of epochs,
    each a permutation of the examples drawn from `np.random.default_rng([seed, epoch])` (the
    natural order with `shuffle=False`); global batch b is stream items b*B .. (b+1)*B-1 and
    process p produces its contiguous slice, so, as with `synthetic`, the global batches do
    not depend on the process count and the state (a batch index) resumes them exactly. With
    `global_batch` = the dataset size and no shuffle, every step sees the whole dataset
    (full-batch training)."""
    n = _num_examples(arrays, "in_memory")
    index, count = shard
    local = _local_batch(global_batch, count, "train.batch_size")
    arrays = {k: np.asarray(v) for k, v in arrays.items()}

    @functools.lru_cache(maxsize=2)  # a batch spans at most a few epochs
    def order(epoch: int) -> np.ndarray:
        return np.random.default_rng([seed, epoch]).permutation(n)

    def item(i: int) -> int:  # stream position -> example index
        epoch, pos = divmod(i, n)
        return int(order(epoch)[pos]) if shuffle else pos

    def make_batch(b: int) -> dict[str, np.ndarray]:
        first = b * global_batch + index * local
        rows = np.array([item(first + j) for j in range(local)])
        return {k: v[rows] for k, v in arrays.items()}

    dataset = grain.MapDataset.range(num_batches or _ENDLESS).map(make_batch)
    return iter(dataset.to_iter_dataset(read_options()))


def one_pass(
    arrays: dict[str, np.ndarray], *, global_batch: int, shard: tuple[int, int] = (0, 1)
) -> Iterator[dict[str, np.ndarray]]:
    """Every example once, in order, for evaluation: ceil(n / global_batch) global batches of
    this process's share, the last padded with zero rows; `"mask"` (bool) is False on padding,
    so an `eval_step` weighs real rows only. Nothing is dropped."""
    n = _num_examples(arrays, "one_pass")
    if "mask" in arrays:
        raise ConfigError("one_pass adds the 'mask' entry itself; rename the array called mask")
    index, count = shard
    local = _local_batch(global_batch, count, "the eval batch")
    for start in range(0, n, global_batch):
        rows = np.arange(start + index * local, start + (index + 1) * local)
        real = rows < n
        batch = {}
        for k, v in arrays.items():
            v = np.asarray(v)
            part = np.zeros((local, *v.shape[1:]), v.dtype)
            part[real] = v[rows[real]]
            batch[k] = part
        yield {**batch, "mask": real}


def global_spec(local_batch: dict[str, Any], process_count: int | None = None):
    """ShapeDtypeStructs of the global batch given one process-local batch."""
    count = jax.process_count() if process_count is None else process_count
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct((x.shape[0] * count, *x.shape[1:]), x.dtype), local_batch
    )


def to_global(local_batch: dict[str, Any], sharding: NamedSharding):
    """Assemble the global batch from every process's local numpy batch (no host gather)."""
    return jax.tree.map(
        lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), local_batch
    )


def global_batches(iterator: Iterator, sharding: NamedSharding) -> Iterator:
    for local in iterator:
        yield to_global(local, sharding)
