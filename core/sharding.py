"""Shardings from rules.

A state leaf's spec comes from the first `(regex, PartitionSpec)` rule whose regex matches its
"/"-joined path (`re.search`, so suffix rules like `r"attn/qkv/kernel$"` also match the same
parameter inside the optimiser state). Then, if the mesh has an "fsdp" axis of size > 1, the
largest dimension that is still unsharded and divisible by it is sharded over "fsdp" (leaves
smaller than `fsdp_min_size` elements stay replicated: sharding them costs more than it saves).
Everything else is replicated. Because the rules act on paths and shapes only, parameters,
Adam moments and EMA copies of a weight all get the same layout without optax-specific code.
"""

import re
from collections.abc import Sequence

import jax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from core.errors import ConfigError
from core.mesh import data_axes, data_parallel_size


def path_str(path) -> str:
    """ "/"-joined names of a `tree_flatten_with_path` key path: "params/blocks/0/attn/kernel"."""
    parts = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts)


def _fsdp(spec: tuple, shape: tuple[int, ...], fsdp_size: int) -> tuple:
    free = [i for i, s in enumerate(spec) if s is None and shape[i] % fsdp_size == 0]
    if not free:
        return spec
    dim = max(free, key=lambda i: shape[i])
    return spec[:dim] + ("fsdp",) + spec[dim + 1 :]


def spec_for(
    path: str, shape: tuple[int, ...], mesh: Mesh, rules: Sequence, fsdp_min_size: int
) -> P:
    spec: tuple = (None,) * len(shape)
    for pattern, rule_spec in rules:
        if re.search(pattern, path):
            rule_spec = tuple(rule_spec)
            if len(rule_spec) > len(shape):
                raise ConfigError(
                    f"sharding rule {pattern!r} -> {rule_spec} has more dims than {path} {shape}"
                )
            rule_spec += (None,) * (len(shape) - len(rule_spec))
            # Drop axes the mesh lacks or that do not divide the dimension, so one rule set
            # serves every mesh from a laptop to a pod.
            spec = tuple(
                a if a in mesh.axis_names and shape[i] % mesh.shape[a] == 0 else None
                for i, a in enumerate(rule_spec)
            )
            break
    fsdp_size = mesh.shape.get("fsdp", 1)
    size = 1
    for s in shape:
        size *= s
    if fsdp_size > 1 and size >= fsdp_min_size:
        spec = _fsdp(spec, shape, fsdp_size)
    return P(*spec)


def tree_shardings(tree, mesh: Mesh, rules: Sequence = (), fsdp_min_size: int = 2**14):
    """A NamedSharding for every leaf of `tree` (arrays or ShapeDtypeStructs)."""

    def leaf(path, x):
        spec = spec_for(path_str(path), tuple(x.shape), mesh, rules, fsdp_min_size)
        return NamedSharding(mesh, spec)

    return jax.tree_util.tree_map_with_path(leaf, tree)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) dimension over the data-parallel axes, the rest replicated."""
    return NamedSharding(mesh, P(data_axes(mesh)))


def check_batch_size(global_batch: int, mesh: Mesh) -> None:
    dp = data_parallel_size(mesh)
    if global_batch % dp:
        raise ConfigError(
            f"train.batch_size={global_batch} is not divisible by the data-parallel size {dp} "
            f"(mesh {dict(mesh.shape)})"
        )
    processes = jax.process_count()
    if global_batch % processes:
        raise ConfigError(
            f"train.batch_size={global_batch} is not divisible by the process count {processes}"
        )


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())
