"""What every kernel package shares: impl dispatch, shard_map plumbing, vma bookkeeping.

Each `core/kernels/<op>/api.py` keeps its own `_platform()` (tests monkeypatch it to pretend to
be a TPU or GPU) and passes it here.
"""

import jax
from jax.sharding import ManualAxisType

IMPLS = ("auto", "xla", "pallas", "interpret")
KERNEL_BACKENDS = ("tpu", "gpu")


def resolve_impl(impl: str, platform: str, *, host: str = "xla") -> str:
    """ "xla", "pallas", "interpret" or `host` for `impl` on `platform`: "auto" is the kernel on
    TPU and GPU and `host` elsewhere (the jnp reference unless an op has a faster CPU path of
    its own, named `host`); "pallas" off TPU/GPU is an error naming the options."""
    known = IMPLS if host in IMPLS else (*IMPLS, host)
    if impl not in known:
        raise ValueError(f"impl={impl!r} is unknown; expected one of: {', '.join(known)}")
    if impl == "auto":
        return "pallas" if platform in KERNEL_BACKENDS else host
    if impl == "pallas" and platform not in KERNEL_BACKENDS:
        raise ValueError(
            f'impl="pallas" needs a TPU or GPU backend, not {platform!r}; '
            'use impl="interpret" (the kernel, interpreted) or impl="xla" (the reference)'
        )
    return impl


def uses_kernel(impl: str, platform: str) -> bool:
    """Whether `impl` runs a Pallas kernel on `platform` (which XLA cannot partition)."""
    return impl in ("pallas", "interpret") or (impl == "auto" and platform in KERNEL_BACKENDS)


def kernel_mesh(runs_kernel: bool):
    """The multi-device mesh being traced for (`core.train` puts it in context) when a Pallas
    kernel is about to run, else None: the caller then wraps the kernel in its op's
    `sharded_op`, since XLA cannot partition a Pallas call."""
    mesh = jax.sharding.get_abstract_mesh()
    if not runs_kernel or mesh.empty or mesh.size == 1:
        return None
    return mesh


def default_check_vma(check_vma: bool | None, impl: str) -> bool:
    """shard_map's check_vma for a kernel call: True unless asked otherwise, except for
    impl="interpret": jax 0.10.2's Pallas HLO interpreter slices varying blocks with invariant
    grid indices (and mixes them in loop carries), which fails that check."""
    return impl != "interpret" if check_vma is None else check_vma


def mesh_axes(mesh, axes, *, what: str, size_of: int) -> tuple[str, ...]:
    """`axes` (None, a name or names) as a tuple of `mesh`'s axis names, checking that a
    dimension of `size_of` divides over them; errors name the op's `what` and the mesh."""
    axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    unknown = [a for a in axes if a not in mesh.axis_names]
    if unknown:
        raise ValueError(f"sharded_op: mesh has axes {mesh.axis_names}, not {unknown}")
    size = 1
    for a in axes:
        size *= mesh.shape[a]
    if size_of % size:
        raise ValueError(
            f"sharded_op: {what}={size_of} does not divide over mesh axes {axes} of size {size}"
        )
    return axes


def vma(*arrays) -> ManualAxisType:
    """Inside `jax.shard_map(check_vma=True)` a `pallas_call`'s outputs must say over which mesh
    axes they vary: the union over all kernel inputs. Outside shard_map that union is empty,
    which is also what Pallas expects there."""
    varying = frozenset().union(*(jax.typeof(a).manual_axis_type.varying for a in arrays))
    return ManualAxisType(varying=varying)


def varying_like(tree, *arrays):
    """Every leaf of `tree` (e.g. zero accumulators) marked as varying over each mesh axis any
    of `arrays` varies over, so a `lax.scan` carry keeps one type under
    `shard_map(check_vma=True)`. Outside shard_map nothing varies: `tree` is returned as is."""
    axes = vma(*arrays).varying

    def cast(x):
        missing = tuple(sorted(axes - jax.typeof(x).manual_axis_type.varying))
        return jax.lax.pcast(x, missing, to="varying") if missing else x

    return jax.tree.map(cast, tree)


def like_primal(grad, primal):
    """`grad` with `primal`'s dtype and, under shard_map, its varying mesh axes: a primal that is
    the same on every shard of an axis gets the sum of the shards' gradients, the total
    derivative, as `shard_map`'s own transpose would give it. For `custom_vjp` backwards."""
    grad = grad.astype(primal.dtype)
    grad_axes = jax.typeof(grad).manual_axis_type.varying
    primal_axes = jax.typeof(primal).manual_axis_type.varying
    if grad_axes - primal_axes:
        grad = jax.lax.psum(grad, tuple(sorted(grad_axes - primal_axes)))
    if primal_axes - grad_axes:
        grad = jax.lax.pcast(grad, tuple(sorted(primal_axes - grad_axes)), to="varying")
    return grad
