"""What evaluating every truncation of a polynomial probe at once saves, op against its forms.

    python -m launch.bench --kernels=poly_probe  # B=4096, N=5, D: 384, 2048; R: 16, 64, 256

One process measures, each jitted, the median of `repeats` calls after a warm-up (every call
blocks on its result), the throughput (examples/s) of all N truncations Y [B, N], per (D, R):
  (a) `poly_probe.op` with impl "auto": the Pallas kernel on GPU/TPU; on CPU the jnp reference,
      which takes (b)'s form below rank `reference.PER_ORDER_MIN_RANK` and (c)'s from it on;
  (b) one matmul: every order's projection from one [B, D] x [D, (N - 1) R] product against all
      of U, then the float32 powers, lam and the cumulative sum: the Pallas kernel's
      formulation, here under XLA (2 dots with x . w1);
  (c) order by order: each order its own [B, D] x [D, R] projection against U[k], then its
      powers (N dots);
  (d) per truncation from scratch: for n = 1..N, P_{:n} recomputed with n matmuls, as the
      released code's cascade does at each stage: N (N + 1) / 2 matmuls, O(N^2) work. It is a
      `fori_loop` over n with a `lax.switch` on the truncation, because XLA's CSE merges the
      repeated matmuls of an unrolled loop (on CPU even through optimisation barriers);
Figures: each of (b), (c), (d)'s time over (a)'s, and the op's FLOP/s (2 B D (1 + (N - 1) R))
over a plain jnp matmul's [B, D] x [D, 1 + (N - 1) R] timed in the same run. The JSON also has
the number of dots in each compiled HLO (the structure each variant really has) and the largest
|difference| from (a). Random probe parameters (the time does not depend on them); the
cascade's saving on a trained probe: `methods/tpc/bench.py`.
Off GPU/TPU the kernel's own time is noted as not measured.
"""

import jax
import jax.numpy as jnp
import numpy as np

from core.benchmark import FLOAT32_KERNEL_TOL, KernelCase, Ratio, Result, median_seconds
from core.kernels import poly_probe

_HIGHEST = jax.lax.Precision.HIGHEST
VARIANTS = {
    "op": "(a) poly_probe.op",
    "one_matmul": "(b) one matmul for all orders",
    "order_by_order": "(c) a matmul per order",
    "per_truncation": "(d) per truncation",
    "matmul": "plain matmul [B,D]x[D,C]",
}
NOT_MEASURED = "Pallas kernel on GPU/TPU: NOT measured (impl 'auto' is what is timed)"


def _truncation(n: int, x_BD, w0, w1_D, U_KRD, lam_KR):
    """P_{:n} [B] from scratch: the linear term and orders 2..n, each from its own matmul."""
    y_B = jnp.dot(x_BD, w1_D, precision=_HIGHEST) + w0
    for k in range(2, n + 1):
        z_BR = jnp.dot(x_BD, U_KRD[k - 2].T, precision=_HIGHEST)
        y_B = y_B + jnp.sum(lam_KR[k - 2] * poly_probe.power(z_BR, k), axis=-1)
    return y_B


def _variants(N: int) -> dict:
    """name -> fn(x, w0, w1, U, lam) -> Y_BN (the matmul: its [B, C] product), unjitted."""

    def op(x, w0, w1, U, lam):
        return poly_probe.op(x, w0, w1, U, lam, impl="auto")

    def one_matmul(x, w0, w1, U, lam):
        Z_BKR = jnp.einsum("bd,krd->bkr", x, U, precision=_HIGHEST)
        terms = [jnp.dot(x, w1, precision=_HIGHEST) + w0]
        for k in range(2, N + 1):
            terms.append(jnp.sum(lam[k - 2] * poly_probe.power(Z_BKR[:, k - 2], k), axis=-1))
        return jnp.cumsum(jnp.stack(terms, axis=1), axis=1)

    def order_by_order(x, w0, w1, U, lam):
        terms = [jnp.dot(x, w1, precision=_HIGHEST) + w0]
        for k in range(2, N + 1):
            z_BR = jnp.dot(x, U[k - 2].T, precision=_HIGHEST)
            terms.append(jnp.sum(lam[k - 2] * poly_probe.power(z_BR, k), axis=-1))
        return jnp.cumsum(jnp.stack(terms, axis=1), axis=1)

    def per_truncation(x, w0, w1, U, lam):
        branches = [lambda ops, n=n: _truncation(n, *ops) for n in range(1, N + 1)]

        def body(i, Y_BN):
            return Y_BN.at[:, i].set(jax.lax.switch(i, branches, (x, w0, w1, U, lam)))

        return jax.lax.fori_loop(0, N, body, jnp.zeros((x.shape[0], N), jnp.float32))

    def matmul(x, W_CD):
        return jnp.einsum("bd,cd->bc", x, W_CD, precision=_HIGHEST)

    return {
        "op": op,
        "one_matmul": one_matmul,
        "order_by_order": order_by_order,
        "per_truncation": per_truncation,
        "matmul": matmul,
    }


def _probe_arrays(B: int, D: int, N: int, R: int, seed: int):
    """x [B, D] and a probe (w0, w1 [D], U [N-1, R, D], lam [N-1, R]) drawn as TPC's probes
    start: U ~ U(-1/sqrt(D), 1/sqrt(D)), lam ~ 0.1 N(0, 1), a linear probe's w1."""
    rng = np.random.default_rng(seed)
    x_BD = jnp.asarray(rng.standard_normal((B, D), np.float32))
    w1_D = jnp.asarray(rng.standard_normal(D).astype(np.float32) / np.sqrt(D))
    u_key, lam_key = jax.random.split(jax.random.PRNGKey(seed))
    bound = 1.0 / np.sqrt(D)
    U_KRD = jax.random.uniform(u_key, (N - 1, R, D), jnp.float32, -bound, bound)
    lam_KR = 0.1 * jax.random.normal(lam_key, (N - 1, R), jnp.float32)
    return x_BD, jnp.float32(0.1), w1_D, U_KRD, lam_KR


def _throughput_shape(B: int, D: int, N: int, R: int, repeats: int, seed: int = 0) -> dict:
    """Section 1 for one (D, R)."""
    args = _probe_arrays(B, D, N, R, seed)
    x_BD, _, w1_D, U_KRD, _ = args
    W_CD = jnp.concatenate([w1_D[None], U_KRD.reshape(-1, D)])
    C = W_CD.shape[0]
    flops = 2 * B * D * C
    seconds, dots, outputs = {}, {}, {}
    for name, fn in _variants(N).items():
        call_args = (x_BD, W_CD) if name == "matmul" else args
        compiled = jax.jit(fn).lower(*call_args).compile()
        dots[name] = compiled.as_text().count(" dot(")
        outputs[name] = np.asarray(compiled(*call_args))
        seconds[name] = median_seconds(
            lambda f=compiled, a=call_args: jax.block_until_ready(f(*a)), repeats
        )
    Y_BN = outputs["op"]
    scale = float(np.abs(Y_BN).max())
    return {
        "D": D,
        "R": R,
        "C": C,
        "flops": flops,
        "seconds": seconds,
        "examples_per_second": {name: B / t for name, t in seconds.items()},
        "hlo_dots": dots,
        "max_abs_diff_vs_op": {
            name: float(np.abs(outputs[name] - Y_BN).max())
            for name in ("one_matmul", "order_by_order", "per_truncation")
        },
        "max_abs_op": scale,
        **{
            f"ratio_{name}_over_op": seconds[name] / seconds["op"]
            for name in ("one_matmul", "order_by_order", "per_truncation")
        },
        "op_gflops_per_second": flops / seconds["op"] / 1e9,
        "matmul_gflops_per_second": flops / seconds["matmul"] / 1e9,
        "op_fraction_of_matmul": seconds["matmul"] / seconds["op"],
    }


def device_case(*, smoke: bool = False) -> KernelCase:
    """The kernel against its reference at TPC's largest benchmarked size, forward and the
    gradients to all five arrays (`launch.device_check`)."""
    B, D, N, R = (64, 16, 3, 4) if smoke else (4096, 2048, 5, 256)
    # x, w1, U, lam in; Y [B, N] out (float32)
    min_bytes = 4 * (B * D + D + (N - 1) * R * D + (N - 1) * R + B * N)
    return KernelCase(
        f"poly_probe B={B} D={D} N={N} R={R} float32",
        lambda x, w0, w1, U, lam, impl: poly_probe.op(x, w0, w1, U, lam, impl=impl),
        _probe_arrays(B, D, N, R, seed=0),
        (0, 1, 2, 3, 4),
        min_bytes,
        FLOAT32_KERNEL_TOL,
    )


def measure(*, smoke: bool = False) -> Result:
    if smoke:
        B, N, dims, ranks, repeats = 64, 3, (16,), (2, 4), 1
    else:
        B, N, dims, ranks, repeats = 4096, 5, (384, 2048), (16, 64, 256), 30
    shapes = [_throughput_shape(B, D, N, R, repeats) for D in dims for R in ranks]
    ratios = []
    for r in shapes:
        size = f"B={B} N={N} D={r['D']} R={r['R']}"
        s = r["seconds"]
        for name in ("one_matmul", "order_by_order", "per_truncation"):
            ratios.append(
                Ratio(
                    f"all truncations, {size}",
                    VARIANTS[name],
                    s[name],
                    VARIANTS["op"],
                    s["op"],
                    "s",
                )
            )
        ratios.append(
            Ratio(
                f"FLOP/s, 2BD(1+(N-1)R), {size}",
                VARIANTS["op"],
                r["flops"] / s["op"],
                f"plain matmul [B,D]x[D,{r['C']}]",
                r["flops"] / s["matmul"],
                "FLOP/s",
            )
        )
    notes = [] if jax.default_backend() in ("gpu", "tpu") else [NOT_MEASURED]
    return Result(ratios, {"B": B, "N": N, "repeats": repeats, "shapes": shapes}, notes)
