"""Ahead-of-time compilation of every method's training step and every Pallas kernel for TPU
and GPU targets, on this CPU-only machine (`core.aot`, `launch.aot`).

Marked `aot` (left out of the default suite; `.ci/run` installs the `aot` extra and runs
`pytest -m "aot and not slow"` after it: every method's smoke config for one TPU and one GPU
target, and the kernels). The rest is on demand (`pytest -m aot tests/aot`): the smoke configs
over two slices, and every largest config on 256 TPU v5e chips and 64 H100s (the scaling
table's programs: about ten minutes on 2 cores). Skipped when libtpu or the CUDA plugin is
missing. Compiling, unlike
lowering, runs XLA's per-chip memory check, Mosaic's VMEM and layout checks and Triton's
shared-memory check against the target, so a config or kernel that fails here fails on the
accelerator too.
"""

import functools
import importlib.util

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from core import aot
from core.kernels.binned_encoding import api as binned
from core.kernels.binned_encoding.reference import Bins
from core.kernels.poly_probe import api as poly
from core.kernels.poly_probe.kernel import KernelConfig as PolyConfig
from core.kernels.poly_probe.kernel import poly_probe_pallas
from core.kernels.selective_rotary import api as rotary
from launch import aot as launch_aot
from tests.entries import BY_NAME, NAMES

_MISSING = [
    name
    for name, module in (("libtpu", "libtpu"), ("jax-cuda12-plugin", "jax_plugins.xla_cuda12"))
    if importlib.util.find_spec(module.split(".")[0]) is None
    or (module.count(".") and importlib.util.find_spec(module) is None)
]
pytestmark = [
    pytest.mark.aot,
    pytest.mark.skipif(
        bool(_MISSING), reason=f"needs the aot extra (pip install -e '.[aot]'): no {_MISSING}"
    ),
]

# CI's: one TPU and one GPU target (4 v5e chips; 8 H100s on one host); on demand (slow): two
# slices of 4 (a DCN axis), then the large targets: 256 TPU v5e chips; 64 H100s, 8 per host.
SMALL_TARGETS = (
    "v5e:2x2",
    "h100:1x1x8",
    pytest.param("2xv5e:2x2", marks=pytest.mark.slow),
)
LARGE_TARGETS = ("v5e:16x16", "h100:2x4x8")
MARKERS = {"tpu": "tpu_custom_call", "gpu": "__gpu$xla.gpu.triton"}


@pytest.mark.parametrize("target", SMALL_TARGETS)
@pytest.mark.parametrize("method", NAMES)
def test_smoke_config_compiles_for_small_targets(method, target):
    """Every entry's small AOT config (`Declarations.aot_smoke`, by default its smoke variant),
    its program as core.train jits it (the training step; an evaluate-only method's eval step):
    fits the chip and sums its gradients (or DEQL's Gram matrix, or the eval sums) across chips,
    over the slices too; a sequential learner (replicated state, rounds played in order,
    `Declarations.sequential`) brings every round to every chip."""
    entry = BY_NAME[method]
    known = entry.declarations.aot_known_failures.get(target)
    if known:  # declared beside the method's config, with its reason; strict: it must fail
        with pytest.raises(Exception, match="(?i)tile sizes|compil"):
            launch_aot.compile_for(entry, *entry.aot_smoke, target)
        pytest.xfail(known)
    row = launch_aot.compile_for(entry, *entry.aot_smoke, target)
    assert row.chips == {"v5e:2x2": 4, "h100:1x1x8": 8, "2xv5e:2x2": 8}[target]
    assert 0 < row.analysis.memory_fraction < 1
    collectives = row.analysis.collectives
    if entry.declarations.sequential or target.startswith("h100"):
        # A sequential learner: XLA picks the collective (a gather, or masked rows). XLA:GPU's
        # partitioner may instead all-gather a smoke-size batch (one example per GPU) and
        # compute replicated, with no gradient to reduce (dupa): the chips still communicate.
        assert sum(collectives.values()) > 0
    else:
        assert collectives["all-reduce"] > 0
    if not target.startswith("h100"):  # XLA:GPU gives no cost analysis
        assert row.analysis.flops > 0


@pytest.mark.slow  # on demand (the scaling table's programs); CI compiles the smoke configs
@pytest.mark.parametrize("target", LARGE_TARGETS)
@pytest.mark.parametrize("method", NAMES)
def test_largest_config_fits_a_large_slice_and_a_gpu_cluster(method, target):
    """Each entry's largest config (`Declarations.largest`, the scaling table's) on 256 TPU v5e
    chips (16 GiB HBM each) and 64 H100s (80 GB each): compiles, and the per-chip memory XLA
    plans fits."""
    entry = BY_NAME[method]
    row = launch_aot.compile_for(entry, *entry.largest, target)
    a = row.analysis
    assert row.chips == {"v5e:16x16": 256, "h100:2x4x8": 64}[target]
    assert 0 < a.memory_fraction < 1
    assert sum(a.collectives.values()) > 0
    assert (a.flops is None) == target.startswith("h100")  # XLA:GPU gives no cost analysis


# Slow: on 2 CPU cores XLA spent about 9 minutes (and 6 GB) on this program before reaching its
# verdict, so `.ci/run` leaves it out (-m "aot and not slow"); run it with -m aot.
@pytest.mark.slow
def test_a_step_too_large_for_the_chip_fails_to_compile():
    """The memory check is real: the base LM at 64k sequences per step (~4 GiB of activations
    per layer per chip) does not fit 4 chips of 16 GiB, and XLA says so at compile time."""
    with pytest.raises(Exception, match="(?i)hbm|memory"):
        launch_aot.compile_for(BY_NAME["lm"], "size=base", {"train.batch_size": 65536}, "v5e:2x2")


# --------------------------------------------------------------------------- kernels


def _one_chip(target: str) -> Mesh:
    return Mesh(aot.target_devices(target)[:1], ("x",))


PLATFORMS = {"tpu": "v5e:2x2", "gpu": "h100:1x1x8"}


def _compile(fn, specs, mesh: Mesh):
    """`fn` compiled for `mesh`'s chip, traced with it in context (as core.train traces a step,
    so the kernels' `_platform()` is the target's)."""
    placed = [
        jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=NamedSharding(mesh, P())) for s in specs
    ]
    with jax.set_mesh(mesh):
        return jax.jit(fn).trace(*placed).lower().compile()


def _rotary_specs():  # the selective_rope config's model at 4x its batch: B 512, T 64, 4 heads
    B, T, H, K = 512, 64, 4, 16
    s = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    return [s(B, T, H, K), s(B, T, H, K), s(B, T, H, K // 2), s(K // 2), s(B, H, K // 2)]


def _rotary_loss(q, k, phi, temp, off):
    qo, ko, fin = rotary.op(q, k, phi, temp, off, impl="pallas")
    return jnp.sum(jnp.sin(qo)) + jnp.sum(ko * ko) + jnp.sum(fin)


def _binned_specs():  # NAB paper size: a 256^2 image's pixels, 456 bins, hidden 256
    s = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    N, M, F = 65536, 456, 256
    return [s(N, 2), *(s(M),) * 7, s(M, F), s(F)]


def _binned_loss(coords, *rest):
    bins, w1, b1 = Bins(*rest[:7]), rest[7], rest[8]
    return jnp.sum(jnp.sin(binned.op(coords, bins, w1, b1, impl="pallas")))


def _poly_specs():  # the paper's probe on a 4096-wide model: order 5, rank 256
    s = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    B, D, N, R = 1024, 4096, 5, 256
    return [s(B, D), s(), s(D), s(N - 1, R, D), s(N - 1, R)]


def _poly_loss(*args):
    return jnp.sum(jnp.sin(poly.op(*args, impl="pallas")))


KERNELS = {
    "selective_rotary": (_rotary_specs, _rotary_loss, 5),
    "binned_encoding": (_binned_specs, _binned_loss, 10),
    "poly_probe": (_poly_specs, _poly_loss, 5),
}


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_kernel_forward_and_backward_compile_through_pallas(kernel, platform):
    """Each kernel's forward and gradient at a realistic size, compiled by Mosaic (TPU v5e) or
    Triton (H100): the compiled program holds the kernel calls (not the jnp reference), so
    VMEM / shared-memory budgets and block layouts were checked for that chip."""
    specs_fn, loss, num_args = KERNELS[kernel]
    grad = jax.grad(loss, argnums=tuple(range(1, num_args)))
    compiled = _compile(grad, specs_fn(), _one_chip(PLATFORMS[platform]))
    assert compiled.as_text().count(MARKERS[platform]) >= 2  # the forward and the backward


# Tiles past the chip's budget: on an H100, 256 x 256 float32 tiles (256 KiB each) exceed the
# 227 KiB of shared memory a block may use. (A TPU case, tiles past v5e's 128 MiB of VMEM, is
# left out: Mosaic took over 8 minutes on such tiles on 2 shared cores before failing.)
OVERSIZED = {"gpu": (dict(block_b=256, block_c=256, block_d=256), "(?i)shared memory")}


@pytest.mark.parametrize("platform", sorted(OVERSIZED))
def test_kernel_blocks_beyond_the_chip_fail_to_compile(platform):
    """The budgets are checked: poly_probe with tiles too large for the chip (`OVERSIZED`)
    lowers, and fails when compiled for it, naming the memory it ran out of."""
    blocks, message = OVERSIZED[platform]
    fn = functools.partial(poly_probe_pallas, config=PolyConfig(backend=platform, **blocks))
    with pytest.raises(Exception, match=message):
        _compile(fn, _poly_specs(), _one_chip(PLATFORMS[platform]))
