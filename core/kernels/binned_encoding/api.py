"""One entry for the fused NAB encoder + first layer: `op(coords, bins, w1, b1, impl=...)`.

z_NF = encode(coords_N2, bins) @ w1_MF + b1_F (see `reference.py` for the features and
`Bins`), without materialising the N x M features on the kernel paths.

impl:
  "auto"       the Pallas kernel on TPU and GPU, "tiled" on any other backend;
  "xla"        the jnp reference (`reference.encode_dense`), differentiated by plain autodiff;
  "tiled"      the kernels' tile code (`kernel_body.py`) run by `lax.scan` over pixel tiles
               with the same custom_vjp (`cpu.py`): plain XLA, for CPU, where it trains NAB
               ~2x faster than autodiff of the reference (`methods/nab/bench.py`);
  "pallas"     the kernel for the platform traced for: the Mosaic wrappers with grid-resident
               accumulators (`tpu.py`) on "tpu", the Triton in-program-loop wrappers (`gpu.py`)
               on "gpu"; a ValueError elsewhere;
  "interpret"  the Triton-shaped wrappers (`gpu.py`) run by the Pallas interpreter on any
               backend, for tests on CPU. Those are interpreted because `interpret=True` runs
               grid steps in order, which models their in-program loops faithfully; the TPU
               wrappers' grid reductions are checked separately under `pltpu.InterpretParams`,
               which simulates TPU grid semantics (tests/kernels/test_binned_encoding.py).
Differentiable in bins, w1 and b1 on every impl (first order on the kernel paths, through a
`custom_vjp`: see `kernel.py`). The kernel paths give coords a zero gradient (pixel
coordinates are data); impl="xla" differentiates them too.

`bins` is a `Bins` or a mapping with its seven keys; the gradient has the same structure.

Sharding: XLA cannot partition a Pallas call (nor split "tiled"'s scan without gathering the
pixels). `sharded_op` is `op` inside `jax.shard_map` over
the pixels (every pixel is independent in the forward; bins, W1 and b1 replicated); the kernel
outputs carry the inputs' varying axes and the replicated inputs' gradients are summed over
the shards, so `check_vma=True` (shard_map's default) works.
"""

import functools

import jax
from jax.sharding import PartitionSpec as P

from core.kernels import common
from core.kernels.binned_encoding.kernel import KernelConfig, encode_dense_pallas
from core.kernels.binned_encoding.reference import as_bins, check_shapes, encode_dense
from core.mesh import traced_platform


def _platform() -> str:
    """The platform traced for (`core.mesh.traced_platform`); a function so tests can pretend
    to be a TPU/GPU."""
    return traced_platform()


HOST_IMPL = "tiled"  # what "auto" runs off TPU and GPU


def uses_kernel(impl: str = "auto") -> bool:
    """Whether `op(..., impl=impl)` runs kernel code on this backend: a Pallas kernel (which
    XLA cannot partition) or its tiles under "tiled"; under a multi-device mesh, call
    `sharded_op`."""
    return common.resolve_impl(impl, _platform(), host=HOST_IMPL) != "xla"


def op(coords_N2, bins, w1_MF, b1_F, *, impl="auto"):
    """z_NF float32 [N, F]: the NAB features of coords_N2 [N, 2] times w1_MF [M, F], plus b1_F."""
    platform = _platform()
    impl = common.resolve_impl(impl, platform, host=HOST_IMPL)
    bins = as_bins(bins)
    check_shapes(coords_N2, bins, w1_MF, b1_F)
    if impl == "xla":
        return encode_dense(coords_N2, bins, w1_MF, b1_F)
    if impl == "tiled":
        config = KernelConfig(backend="cpu")
    elif impl == "interpret":
        config = KernelConfig(backend="gpu", interpret=True)
    else:
        config = KernelConfig(backend=platform)
    return encode_dense_pallas(coords_N2, bins, w1_MF, b1_F, config)


def sharded_op(
    coords_N2,
    bins,
    w1_MF,
    b1_F,
    *,
    mesh: jax.sharding.Mesh,
    pixel_axes=("data", "fsdp"),
    impl="auto",
    check_vma=None,
):
    """`op` under `jax.shard_map`: pixels split over `pixel_axes` (mesh axis names, a name, a
    tuple or None), bins, w1 and b1 replicated. Same returns as `op`, z sharded like coords.

    check_vma: `common.default_check_vma` (True except for impl="interpret")."""
    check_vma = common.default_check_vma(check_vma, impl)
    pixel_axes = common.mesh_axes(mesh, pixel_axes, what="pixels", size_of=coords_N2.shape[0])
    rows = P(pixel_axes, None)
    return jax.shard_map(
        functools.partial(op, impl=impl),
        mesh=mesh,
        in_specs=(rows, P(), P(), P()),
        out_specs=rows,
        check_vma=check_vma,
    )(coords_N2, as_bins(bins), w1_MF, b1_F)
