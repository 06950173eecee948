"""A planted low-rank polynomial on Gaussian inputs: data with a known TPC-shaped answer.

    s = splits(D=8, rank=2, orders=(2, 3), n_train=2000, seed=0)   # same fields as data.Splits
    s.x_train  # float32 [n_train, D] ~ N(0, I);  s.y_train int32 [n_train] in {0, 1}

f(x) = sum_{k in orders} sum_r lam_kr (x . u_kr)^k with orthonormal u_k (per order), signs of
lam_k alternating +, -, + ... and |lam_k| = 1 / sqrt(E[(x . u)^(2k)]) so every rank-one term has
unit variance. Labels are [f(x) > median f] (balanced classes). With signs mixed, an even order
is symmetric in x -> -x, so a linear probe sits near chance on it: order >= 2 must be learned.
`info` holds the planted U [orders, rank, D], lam [orders, rank] and the median.
"""

import numpy as np

from methods.tpc.data import Splits


def _double_factorial(n: int) -> int:
    return int(np.prod(np.arange(n, 0, -2))) if n > 0 else 1


def polynomial(x_ND, U_ORD, lam_OR, orders) -> np.ndarray:
    """f [N] of the module docstring, in float64."""
    z_NOR = np.einsum("nd,ord->nor", np.asarray(x_ND, np.float64), U_ORD)
    return sum(z_NOR[:, i] ** k @ lam_OR[i] for i, k in enumerate(orders))


def splits(
    D: int = 8,
    *,
    rank: int = 2,
    orders=(2, 3),
    n_train: int = 2000,
    n_val: int = 500,
    n_test: int = 1000,
    seed: int = 0,
) -> Splits:
    if rank > D:
        raise ValueError(f"planted.splits: rank={rank} > D={D} (orthonormal directions)")
    rng = np.random.default_rng(seed)
    U_ORD = np.stack([np.linalg.qr(rng.normal(size=(D, rank)))[0].T for _ in orders])
    signs_R = np.where(np.arange(rank) % 2 == 0, 1.0, -1.0)
    lam_OR = np.stack([signs_R / np.sqrt(_double_factorial(2 * k - 1)) for k in orders])
    x_ND = rng.normal(size=(n_train + n_val + n_test, D))
    f_N = polynomial(x_ND, U_ORD, lam_OR, orders)
    median = float(np.median(f_N))
    y_N = (f_N > median).astype(np.int32)
    x_ND = x_ND.astype(np.float32)
    a, b = n_train, n_train + n_val
    info = {"U": U_ORD, "lam": lam_OR, "orders": tuple(orders), "median": median}
    return Splits(x_ND[:a], y_N[:a], x_ND[a:b], y_N[a:b], x_ND[b:], y_N[b:], info)
