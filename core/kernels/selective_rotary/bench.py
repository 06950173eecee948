"""How much does selective rotary cost over plain RoPE, op against op?

    python -m launch.bench --kernels=selective_rotary    # B=8, T=512, H=8, K=64, float32

One process times, at the same sizes and dtype, each jitted, as the median of `repeats` calls
after a warm-up (every call blocks on its result):
  1. forward: `core.nn.positions.rope` on q and k vs `op(..., impl="xla")` (selective rotary:
     cumsum of phi, angle, rotation of q and k, final_state);
  2. forward + backward: the vjp to (q, k) for RoPE vs to (q, k, phi) for selective rotary
     (phi's gradient, a reverse cumsum, is part of the method's cost).
It also reports the forward's effective bandwidth over the minimum traffic (read q, k, phi;
write q', k'), for context only: on CPU this is cache- and core-bound, not a statement about
HBM. The whole models' train steps with either position encoding: `methods/selective_rope`.

On a GPU or TPU the compiled kernel (`impl="pallas"`) is timed too, against the same RoPE;
elsewhere its time and fraction of memory bandwidth are noted as not measured.
"""

import jax
import jax.numpy as jnp
import numpy as np

from core.benchmark import FLOAT32_KERNEL_TOL, KernelCase, Ratio, Result, median_seconds
from core.kernels.selective_rotary import op
from core.nn.positions import rope

NOT_MEASURED = (
    "Pallas kernel on GPU/TPU: time and memory-bandwidth fraction NOT measured "
    "(no accelerator in this run; the jnp reference, impl='xla', is what is timed)"
)


def _inputs(B, T, H, K, dtype):
    rng = np.random.default_rng(0)
    R = K // 2
    x = lambda *shape: jnp.asarray(rng.standard_normal(shape, np.float32), dtype)
    return {
        "q": x(B, T, H, K),
        "k": x(B, T, H, K),
        "phi": jnp.asarray(rng.uniform(size=(B, T, H, R)), jnp.float32),
        "temp": 10000.0 ** (-2.0 * jnp.arange(R, dtype=jnp.float32) / K),
        "pos": jnp.broadcast_to(jnp.arange(1, T + 1), (B, T)),
        "gq": x(B, T, H, K),
        "gk": x(B, T, H, K),
    }


def _min_bytes(B, T, H, K, dtype) -> int:
    qk_bytes = 2 * B * T * H * K * jnp.dtype(dtype).itemsize
    return 2 * qk_bytes + B * T * H * (K // 2) * 4  # q, k in and out; phi (float32) in


def device_case(*, smoke: bool = False) -> KernelCase:
    """The kernel against its reference at the benchmark's size, forward and the gradients to
    q, k and phi (`launch.device_check`)."""
    B, T, H, K = (1, 16, 2, 8) if smoke else (8, 512, 8, 64)
    x = _inputs(B, T, H, K, jnp.float32)
    return KernelCase(
        f"selective_rotary B={B} T={T} H={H} K={K} float32",
        lambda q, k, phi, temp, impl: op(q, k, phi, temp, impl=impl),
        (x["q"], x["k"], x["phi"], x["temp"]),
        (0, 1, 2),
        _min_bytes(B, T, H, K, "float32"),
        FLOAT32_KERNEL_TOL,
    )


def _functions(impl: str):
    """name -> (jitted fn, argument names). Both methods see q, k and their cotangents."""

    def rope_fwd(q, k, pos):
        return rope(q, pos), rope(k, pos)

    def srope_fwd(q, k, phi, temp):
        return op(q, k, phi, temp, impl=impl)

    def rope_fwd_bwd(q, k, pos, gq, gk):
        _, vjp = jax.vjp(lambda q, k: rope_fwd(q, k, pos), q, k)
        return vjp((gq, gk))

    def srope_fwd_bwd(q, k, phi, temp, gq, gk):
        _, vjp = jax.vjp(lambda q, k, phi: srope_fwd(q, k, phi, temp)[:2], q, k, phi)
        return vjp((gq, gk))

    return {
        "rope_fwd": (jax.jit(rope_fwd), ("q", "k", "pos")),
        "selective_fwd": (jax.jit(srope_fwd), ("q", "k", "phi", "temp")),
        "rope_fwd_bwd": (jax.jit(rope_fwd_bwd), ("q", "k", "pos", "gq", "gk")),
        "selective_fwd_bwd": (
            jax.jit(srope_fwd_bwd),
            ("q", "k", "phi", "temp", "gq", "gk"),
        ),
    }


def measure(*, smoke: bool = False) -> Result:
    (B, T, H, K), repeats = ((1, 16, 2, 8), 2) if smoke else ((8, 512, 8, 64), 20)
    dtype = "float32"
    data = _inputs(B, T, H, K, jnp.dtype(dtype))
    # On a GPU or TPU the compiled kernel is timed too; elsewhere only the reference can run.
    impls = ("xla", "pallas") if jax.default_backend() in ("gpu", "tpu") else ("xla",)
    seconds = {}
    for impl in impls:
        for name, (fn, arg_names) in _functions(impl).items():
            if impl != "xla" and name.startswith("rope"):
                continue  # RoPE has no kernel: timed once
            args = [data[a] for a in arg_names]
            key = name if impl == "xla" else name.replace("selective", f"selective_{impl}")
            seconds[key] = median_seconds(
                lambda fn=fn, args=args: jax.block_until_ready(fn(*args)), repeats
            )
    min_bytes = _min_bytes(B, T, H, K, dtype)
    size = f"B={B} T={T} H={H} K={K} {dtype}"
    ratios = [
        Ratio(
            f"rotation of q and k, {pass_}, {size}",
            f"selective ({impl})",
            seconds[f"selective_{key}" if impl == "xla" else f"selective_{impl}_{key}"],
            "RoPE",
            seconds[f"rope_{key}"],
            "s",
        )
        for impl in impls
        for key, pass_ in (("fwd", "forward"), ("fwd_bwd", "forward + backward"))
    ]
    details = {
        "sizes": {"B": B, "T": T, "H": H, "K": K, "dtype": dtype},
        "repeats": repeats,
        "impls": impls,
        "seconds": seconds,
        "selective_fwd_min_bytes": min_bytes,
        "selective_fwd_effective_GBps": min_bytes / seconds["selective_fwd"] / 1e9,
    }
    return Result(ratios, details, [NOT_MEASURED] if impls == ("xla",) else [])
