"""One entry for the truncated polynomial probe: `op(x, w0, w1, U, lam, impl=...)`.

Y_BN float32 [B, N]: every truncation P_{:1} .. P_{:N} of the symmetric CP polynomial on the
activations x_BD (see `reference.py`), one fused pass on the kernel paths.

impl:
  "auto"       the Pallas kernel on TPU and GPU, the jnp reference on any other backend (on
               CPU the reference is one matmul and an epilogue already);
  "xla"        the jnp reference (`reference.truncations`), differentiated by plain autodiff;
  "pallas"     the kernel for the platform traced for: the Mosaic wrappers with a resident
               accumulator over D (`tpu.py`) on "tpu", the Triton in-program-loop wrappers
               (`gpu.py`) on "gpu"; a ValueError elsewhere;
  "interpret"  the Triton-shaped wrappers (`gpu.py`) run by the Pallas interpreter on any
               backend, for tests on CPU. Those are interpreted because `interpret=True` runs
               grid steps in order, which models their in-program loops faithfully; the TPU
               wrappers' grid reduction is checked separately under `pltpu.InterpretParams`,
               which simulates TPU grid semantics (tests/kernels/test_poly_probe.py).
Differentiable in all five arrays on every impl (x too: a monitor may need d score / d
activations); first order on the kernel paths, through a `custom_vjp` (see `kernel.py`).
Gradients have the primals' dtypes.

Sharding: XLA cannot partition a Pallas call. `sharded_op` is `op` inside `jax.shard_map`
over the batch (every row is independent; w0, w1, U and lam replicated); the kernel outputs
carry the inputs' varying axes and the replicated parameters' gradients are summed over the
shards, so `check_vma=True` (shard_map's default) works.
"""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from core.kernels import common
from core.kernels.poly_probe.kernel import KernelConfig, poly_probe_pallas
from core.kernels.poly_probe.reference import check_shapes, truncations
from core.mesh import traced_platform


def _platform() -> str:
    """The platform traced for (`core.mesh.traced_platform`); a function so tests can pretend
    to be a TPU/GPU."""
    return traced_platform()


def uses_kernel(impl: str = "auto") -> bool:
    """Whether `op(..., impl=impl)` runs a Pallas kernel on this backend (which XLA cannot
    partition: under a multi-device mesh, call `sharded_op`)."""
    return common.uses_kernel(impl, _platform())


def op(x_BD, w0, w1_D, U_KRD, lam_KR, *, impl="auto"):
    """Y_BN float32 [B, N = K + 1]: column j is the truncation P_{:j+1}(x)."""
    platform = _platform()
    impl = common.resolve_impl(impl, platform)
    w0 = jnp.asarray(w0)  # a Python float too: the custom_vjp casts its gradient to w0's dtype
    check_shapes(x_BD, w0, w1_D, U_KRD, lam_KR)
    if impl == "xla":
        return truncations(x_BD, w0, w1_D, U_KRD, lam_KR)
    if impl == "interpret":
        config = KernelConfig(backend="gpu", interpret=True)
    else:
        config = KernelConfig(backend=platform)
    return poly_probe_pallas(x_BD, w0, w1_D, U_KRD, lam_KR, config)


def sharded_op(
    x_BD,
    w0,
    w1_D,
    U_KRD,
    lam_KR,
    *,
    mesh: jax.sharding.Mesh,
    batch_axes=("data", "fsdp"),
    impl="auto",
    check_vma=None,
):
    """`op` under `jax.shard_map`: rows split over `batch_axes` (mesh axis names, a name, a
    tuple or None), the parameters replicated. Same returns as `op`, Y sharded like x.

    check_vma: `common.default_check_vma` (True except for impl="interpret")."""
    check_vma = common.default_check_vma(check_vma, impl)
    batch_axes = common.mesh_axes(mesh, batch_axes, what="batch", size_of=x_BD.shape[0])
    rows = P(batch_axes, None)
    return jax.shard_map(
        functools.partial(op, impl=impl),
        mesh=mesh,
        in_specs=(rows, P(), P(), P(), P()),
        out_specs=rows,
        check_vma=check_vma,
    )(x_BD, jnp.asarray(w0), w1_D, U_KRD, lam_KR)
