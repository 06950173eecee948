"""What the fused binned encoder + first layer saves against its jnp reference, in time and memory.

    python -m launch.bench --kernels=binned_encoding    # NAB's sizes: 256^2 pixels, M=456, F=256

One process measures z = encode(coords, bins) @ W1 + b1, forward and forward + backward (to the
bins, W1 and b1), each jitted, the median of `repeats` calls after a warm-up, by
  - the jnp reference (`impl="xla"`, which materialises the N x M features),
  - the kernel's tile code scanned over pixel tiles (`impl="tiled"`, what "auto" runs on CPU),
  - the fused Pallas kernel run by the Pallas interpreter (`impl="interpret"`: its time is the
    interpreter's, not a kernel's, so it is reported in the JSON but not as a figure),
with XLA's compiled memory analysis of each (temporary bytes: the reference's include the N x M
feature matrix and its tanh terms, the kernel's only tiles). Figures: reference / tiled, in
time and in temporary memory. Inputs are random bins laid out as NAB initialises them (centres
in the unit disc, sides 0.05-0.5 of it, edges 1-3 pixels wide); the time does not depend on
the values. NAB's training rates with either encoder: `methods/nab/bench.py`.

On a GPU or TPU the compiled kernel (`impl="pallas"`) is timed too, and reference / kernel
are figures beside reference / tiled; elsewhere its time is noted as not measured.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from core.benchmark import FLOAT32_KERNEL_TOL, KernelCase, Ratio, Result, median_seconds
from core.kernels.binned_encoding import api
from core.kernels.binned_encoding.reference import Bins

IMPLS = {"xla": "reference (jnp)", "tiled": "tiled (lax.scan)", "interpret": "fused, interpreted"}
NOT_MEASURED = "Pallas kernel on GPU/TPU: NOT measured (no accelerator in this run)"


def _inputs(size: int, M: int, F: int, seed: int = 0):
    """Pixel centres of a size x size image in [-1, 1)^2 (one pixel = 1 / (size // 2)), M bins
    and a PyTorch-initialised first layer [M, F], as NAB starts."""
    rng = np.random.default_rng(seed)
    f32 = lambda a: jnp.asarray(a, jnp.float32)
    u = (np.arange(size) - size // 2) / (size // 2)
    y, x = np.meshgrid(u, u, indexing="ij")
    coords = f32(np.stack([x.ravel(), y.ravel()], axis=1))
    pixel = 1.0 / (size // 2)
    bins = Bins(
        u=f32(rng.uniform(-0.85, 0.85, M)),
        v=f32(rng.uniform(-0.85, 0.85, M)),
        h=f32(rng.uniform(0.1, 1.0, M)),
        w=f32(rng.uniform(0.1, 1.0, M)),
        theta=f32(rng.uniform(0, np.pi / 2, M)),
        k=f32(np.resize([1.5, 3.0], M) / pixel),
        lam=f32(np.ones(M)),
    )
    bound = 1.0 / np.sqrt(M)
    w1 = f32(rng.uniform(-bound, bound, (M, F)))
    b1 = f32(rng.uniform(-bound, bound, F))
    return coords, bins, w1, b1


def device_case(*, smoke: bool = False) -> KernelCase:
    """The fused kernel against its reference at NAB's size, forward and the gradients to the
    bins, W1 and b1 (`launch.device_check`)."""
    size, M, F = (16, 20, 8) if smoke else (256, 456, 256)
    N = size * size
    # coordinates and the seven bin parameters in, W1 and b1 in, z [N, F] out (float32)
    min_bytes = 4 * (2 * N + 7 * M + M * F + F + N * F)
    return KernelCase(
        f"binned_encoding {size}^2 pixels M={M} F={F} float32",
        lambda coords, bins, w1, b1, impl: api.op(coords, bins, w1, b1, impl=impl),
        _inputs(size, M, F),
        (1, 2, 3),
        min_bytes,
        FLOAT32_KERNEL_TOL,
    )


def measure(*, smoke: bool = False) -> Result:
    (size, M, F), repeats = ((16, 20, 8), 1) if smoke else ((256, 456, 256), 3)
    coords, bins, w1, b1 = _inputs(size, M, F)
    on_accelerator = jax.default_backend() in ("gpu", "tpu")
    impls = {**IMPLS, "pallas": "fused Pallas kernel"} if on_accelerator else IMPLS
    out = {"pixels": size * size, "bins": M, "width": F, "features_bytes": size * size * M * 4}
    for impl in impls:
        fwd = jax.jit(functools.partial(api.op, impl=impl))
        loss = lambda b, w, c, i=impl: jnp.sum(api.op(coords, b, w, c, impl=i) ** 2)
        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        for name, fn, args in (
            ("fwd", fwd, (coords, bins, w1, b1)),
            ("fwd_bwd", grad, (bins, w1, b1)),
        ):
            compiled = fn.lower(*args).compile()
            memory = compiled.memory_analysis()
            out[f"{impl}_{name}_temp_bytes"] = int(memory.temp_size_in_bytes) if memory else None
            out[f"{impl}_{name}_seconds"] = median_seconds(
                lambda f=compiled, a=args: jax.block_until_ready(f(*a)), repeats
            )
    sizes = f"{size}^2 pixels, M={M}, F={F}"
    ratios = []
    for name, pass_ in (("fwd", "forward"), ("fwd_bwd", "forward + backward")):
        for impl in ("tiled", "pallas") if on_accelerator else ("tiled",):
            ratios.append(
                Ratio(
                    f"first layer {pass_} time, {sizes}",
                    impls["xla"],
                    out[f"xla_{name}_seconds"],
                    impls[impl],
                    out[f"{impl}_{name}_seconds"],
                    "s",
                )
            )
            if out[f"xla_{name}_temp_bytes"] and out[f"{impl}_{name}_temp_bytes"]:
                ratios.append(
                    Ratio(
                        f"first layer {pass_}, XLA temporary memory, {sizes}",
                        impls["xla"],
                        out[f"xla_{name}_temp_bytes"],
                        impls[impl],
                        out[f"{impl}_{name}_temp_bytes"],
                        "bytes",
                    )
                )
    notes = [] if on_accelerator else [NOT_MEASURED]
    return Result(ratios, {**out, "repeats": repeats, "impls": impls}, notes)
