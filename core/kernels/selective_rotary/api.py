"""One entry for selective rotary: `op(q, k, phi, temp, offset=None, mask_BT=None, impl=...)`.

impl:
  "auto"       the Pallas kernel on TPU and GPU, the jnp reference on any other backend;
  "xla"        the jnp reference (`reference.py`), differentiated by plain autodiff;
  "pallas"     the kernel for the platform traced for: the Mosaic grid-carry wrapper (`tpu.py`)
               on "tpu", the Triton in-program-loop wrapper (`gpu.py`) on "gpu"; a ValueError
               elsewhere;
  "interpret"  the Triton-shaped wrapper (`gpu.py`) run by the Pallas interpreter on any
               backend, for tests on CPU. That wrapper is interpreted because `interpret=True`
               runs grid steps in order, which models its in-program loop faithfully; the TPU
               wrapper's grid carry is checked separately under `pltpu.InterpretParams`, which
               simulates TPU grid semantics (see tests/kernels/test_selective_rotary.py).
Returns (q', k', final_state_BHR); differentiable in q, k, phi, temp and offset on every impl
(the kernel paths through a `custom_vjp`, see `kernel.py`; first order only).

mask_BT (1 = real token, 0 = padding) zeroes phi, so padding does not advance the angle and
final_state ignores it; padded positions are still rotated by the angle carried so far.

Sharding: a Pallas kernel cannot be auto-partitioned (Mosaic raises "Mosaic kernels cannot be
automatically partitioned. Please wrap the call in a shard_map."). `sharded_op` is `op` inside
`jax.shard_map` over batch and head mesh axes (never T: the cumulative sum runs along it), so
the kernel sees local shards; every (batch row, head) is independent, so no collective is
needed in the forward. The kernel's outputs carry the inputs' varying mesh axes, so
`check_vma=True` (shard_map's default) works, and temp's gradient is summed over the shards.
"""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from core.kernels import common
from core.kernels.selective_rotary.kernel import KernelConfig, selective_rotary_pallas
from core.kernels.selective_rotary.reference import selective_rotary_reference
from core.mesh import traced_platform


def _platform() -> str:
    """The platform traced for (`core.mesh.traced_platform`); a function so tests can pretend
    to be a TPU/GPU."""
    return traced_platform()


def uses_kernel(impl: str = "auto") -> bool:
    """Whether `op(..., impl=impl)` runs a Pallas kernel on this backend (which XLA cannot
    partition: under a multi-device mesh, call `sharded_op`)."""
    return common.uses_kernel(impl, _platform())


def op(q_BTHK, k_BTHK, phi_BTHR, temp_R, offset_BHR=None, mask_BT=None, *, impl="auto"):
    platform = _platform()
    impl = common.resolve_impl(impl, platform)
    if mask_BT is not None:  # padding does not advance the angle
        phi_BTHR = phi_BTHR * mask_BT[:, :, None, None].astype(phi_BTHR.dtype)
    if offset_BHR is None:
        offset_BHR = jnp.zeros(
            (q_BTHK.shape[0], q_BTHK.shape[2], q_BTHK.shape[3] // 2), jnp.float32
        )
    if impl == "xla":
        return selective_rotary_reference(q_BTHK, k_BTHK, phi_BTHR, temp_R, offset_BHR)
    if impl == "interpret":
        config = KernelConfig(backend="gpu", interpret=True)
    else:
        config = KernelConfig(backend=platform)
    return selective_rotary_pallas(q_BTHK, k_BTHK, phi_BTHR, temp_R, offset_BHR, config)


def sharded_op(
    q_BTHK,
    k_BTHK,
    phi_BTHR,
    temp_R,
    offset_BHR=None,
    mask_BT=None,
    *,
    mesh: jax.sharding.Mesh,
    batch_axes=("data", "fsdp"),
    head_axes="model",
    impl="auto",
    check_vma=None,
):
    """`op` under `jax.shard_map`: batch split over `batch_axes`, heads over `head_axes` (mesh
    axis names, a name, a tuple or None), T and the pairs whole. Call it inside a `jit` whose
    inputs are sharded that way (or let shard_map move them). Same returns as `op`.

    check_vma (shard_map's varying-axes check): `common.default_check_vma` (True except for
    impl="interpret")."""
    check_vma = common.default_check_vma(check_vma, impl)
    B, H = q_BTHK.shape[0], q_BTHK.shape[2]
    batch_axes = common.mesh_axes(mesh, batch_axes, what="batch", size_of=B)
    head_axes = common.mesh_axes(mesh, head_axes, what="heads", size_of=H)
    if offset_BHR is None:
        offset_BHR = jnp.zeros((B, H, q_BTHK.shape[3] // 2), jnp.float32)
    if mask_BT is None:
        mask_BT = jnp.ones(q_BTHK.shape[:2], jnp.float32)
    x_spec = P(batch_axes, None, head_axes, None)
    state_spec = P(batch_axes, head_axes, None)
    local_op = functools.partial(_local_op, impl=impl)
    return jax.shard_map(
        local_op,
        mesh=mesh,
        in_specs=(x_spec, x_spec, x_spec, P(), state_spec, P(batch_axes, None)),
        out_specs=(x_spec, x_spec, state_spec),
        check_vma=check_vma,
    )(q_BTHK, k_BTHK, phi_BTHR, temp_R, offset_BHR, mask_BT)


def _local_op(q, k, phi, temp, offset, mask, *, impl):
    return op(q, k, phi, temp, offset, mask, impl=impl)
