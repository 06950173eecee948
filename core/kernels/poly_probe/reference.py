"""Truncated polynomial probe (paper "Beyond Linear Probes", TPC): the pure-jnp specification.

A symmetric CP polynomial of order N on activations x. Order 1 is a linear probe; order k >= 2
is a rank-R symmetric tensor, W^[k] = sum_r lam[k-2, r] U[k-2, r]^(x k), so that

    <W^[k], x^(x k)> = sum_r lam[k-2, r] (x . U[k-2, r])^k

and the truncation at order n is

    P_{:1}(x) = w0 + x . w1
    P_{:n}(x) = P_{:1}(x) + sum_{k=2..n} sum_r lam[k-2, r] (x . U[k-2, r])^k.

`truncations` returns all of them, Y [B, N] with column j = P_{:j+1}: a cumulative sum over
orders, so one pass gives the monitor every cheaper truncation to stop at.

Shapes: x_BD [B, D]; w0 []; w1_D [D]; U_KRD [K, R, D] with K = N - 1 (K = 0 is the linear
probe); lam_KR [K, R]; Y_BN [B, N]. Inputs may be bfloat16; everything is computed in float32
(bfloat16 products are exact in float32), the projections at HIGHEST precision, so this is the
same float32 spec on every backend (TPU's default would be bfloat16 passes, Triton's TF32).
Float64 inputs (under `jax.enable_x64`) are computed in float64, for finite-difference tests.
Powers by repeated multiplication, not `pow` (a float exponent goes through exp and log, NaN
for negative z); the kernels repeat the same products in the same order, so they round alike.
"""

import jax
import jax.numpy as jnp

_F32 = jnp.float32
_HIGHEST = jax.lax.Precision.HIGHEST
# From this rank on, each order is projected by its own matmul; below it, one matmul against all
# of U. The same sums either way (up to float32 rounding); what differs is XLA:CPU's speed
# (bench.py, B = 4096, N = 5, D in {384, 2048}): at R >= 64 each order's [B, R]
# block is still in cache when its powers are taken (one [B, (N - 1) R] product written to
# memory first is x1.04-1.73 slower), at R = 16 one matmul reads x once instead of N - 1 times
# (per order is x1.65-1.88 slower). The Pallas kernels always do the one fused matmul.
PER_ORDER_MIN_RANK = 64


def check_shapes(x_BD, w0, w1_D, U_KRD, lam_KR) -> None:
    """Raises a one-line ValueError naming the shapes unless they fit the module docstring's."""
    if len(x_BD.shape) != 2:
        raise ValueError(f"x {tuple(x_BD.shape)} must be [B, D]")
    D = x_BD.shape[1]
    if jnp.shape(w0) != ():
        raise ValueError(f"w0 {tuple(jnp.shape(w0))} must be a scalar")
    if tuple(w1_D.shape) != (D,):
        raise ValueError(f"w1 {tuple(w1_D.shape)} must be [D] = ({D},) for x {tuple(x_BD.shape)}")
    if len(U_KRD.shape) != 3 or U_KRD.shape[2] != D:
        raise ValueError(f"U {tuple(U_KRD.shape)} must be [K, R, D] with D = {D}")
    if tuple(lam_KR.shape) != tuple(U_KRD.shape[:2]):
        raise ValueError(f"lam {tuple(lam_KR.shape)} must be [K, R] = {tuple(U_KRD.shape[:2])}")


def power(z, k: int):
    """z^k by k - 1 multiplications, ((z z) z)...: the order every implementation here uses."""
    p = z
    for _ in range(k - 1):
        p = p * z
    return p


def truncations(x_BD, w0, w1_D, U_KRD, lam_KR) -> jax.Array:
    """Y_BN float32 (float64 for float64 inputs): column j is the truncation P_{:j+1}(x)."""
    check_shapes(x_BD, w0, w1_D, U_KRD, lam_KR)
    dtype = jnp.promote_types(_F32, jnp.result_type(x_BD, w1_D, U_KRD, lam_KR))
    x_BD = x_BD.astype(dtype)
    z_B = jnp.dot(x_BD, w1_D.astype(dtype), precision=_HIGHEST)
    U_KRD, lam_KR = U_KRD.astype(dtype), lam_KR.astype(dtype)
    K, R, D = U_KRD.shape
    if R >= PER_ORDER_MIN_RANK:
        z_BR_per_order = [jnp.dot(x_BD, U_KRD[k].T, precision=_HIGHEST) for k in range(K)]
    else:
        Z_BC = jnp.dot(x_BD, U_KRD.reshape(K * R, D).T, precision=_HIGHEST)
        z_BR_per_order = [Z_BC[:, k * R : (k + 1) * R] for k in range(K)]
    orders = [z_B + jnp.asarray(w0, dtype)]
    for k in range(2, K + 2):
        orders.append(jnp.sum(lam_KR[k - 2] * power(z_BR_per_order[k - 2], k), axis=-1))
    return jnp.cumsum(jnp.stack(orders, axis=1), axis=1)
