"""One entry for selective rotary: `op(q, k, phi, temp, offset=None, mask_BT=None, impl=...)`.

impl:
  "auto"       the Pallas kernel on TPU and GPU, the jnp reference on any other backend;
  "xla"        the jnp reference (`reference.py`), differentiated by plain autodiff;
  "pallas"     the kernel for `jax.default_backend()`: the Mosaic grid-carry wrapper (`tpu.py`)
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
automatically partitioned. Please wrap the call in a shard_map."). Under a sharded `jit`, the
caller wraps `op(..., impl="pallas")` in `jax.shard_map` over batch and/or head axes (never
T: the cumulative sum runs along it), so the kernel sees local shards. With
`check_vma=True` the kernel's out_shape needs the inputs' manual axes (ENGINEERING.md section
4); that is not built yet, so use `check_vma=False` or impl="xla" under shard_map for now.
"""

import jax
import jax.numpy as jnp

from core.kernels.selective_rotary.kernel import KernelConfig, selective_rotary_pallas
from core.kernels.selective_rotary.reference import selective_rotary_reference

IMPLS = ("auto", "xla", "pallas", "interpret")
KERNEL_BACKENDS = ("tpu", "gpu")


def _platform() -> str:
    """The default backend's platform name; a function so tests can pretend to be a TPU/GPU."""
    return jax.default_backend()


def op(q_BTHK, k_BTHK, phi_BTHR, temp_R, offset_BHR=None, mask_BT=None, *, impl="auto"):
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r} is unknown; expected one of: {', '.join(IMPLS)}")
    platform = _platform()
    if impl == "auto":
        impl = "pallas" if platform in KERNEL_BACKENDS else "xla"
    if impl == "pallas" and platform not in KERNEL_BACKENDS:
        raise ValueError(
            f'impl="pallas" needs a TPU or GPU backend, not {platform!r}; '
            'use impl="interpret" (the kernel, interpreted) or impl="xla" (the reference)'
        )
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
