"""DEQL solve time against catalogue size n, and against a plain NumPy/SciPy implementation.

    python -m launch.bench --methods=deql       # n = 500, 1000, 2000, 4000; writes a plot too

One process measures, for each n, the median of `repeats` calls (after a warm-up, which also
compiles) of the DEQL(L2) closed form (a = 1, b = 0.5, p = 0.5, lam = 100) from a fixed Gram
matrix K = X^T X of synthetic sparse 0/1 data (2n users, ~1 % density):
  1. `methods.deql.solvers.deql_traced` jitted (float64, one Cholesky, the column updates as
     diagonal scalings and row-wise dot products);
  2. `numpy_deql` below: the same vectorised algorithm written directly in NumPy float64 with
     `scipy.linalg.cho_factor` / `cho_solve` (what one would write without JAX);
Figures: NumPy / JAX time per n. The JSON also has the log-log slope of time against n (cubic:
~3, the Cholesky and the triangular solves dominate) and the largest difference of the two W.
`plot` draws the curve (`launch.bench` writes it beside the table).
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg
import scipy.sparse as sp

from core.benchmark import Ratio, Result, median_seconds
from methods.deql import solvers

HP = dict(a=1.0, b=0.5, p=0.5, lam=100.0)
SIZES = (500, 1000, 2000, 4000)


def synthetic_gram(n: int, seed: int = 0, density: float = 0.01) -> np.ndarray:
    """K = X^T X [n, n] float64 of a random sparse 0/1 X with 2n users (scipy sparse)."""
    X = sp.random(2 * n, n, density=density, format="csr", random_state=seed, dtype=np.float64)
    X.data[:] = 1.0
    return (X.T @ X).toarray()


def numpy_deql(K, a: float, b: float, p: float, lam: float) -> np.ndarray:
    """The vectorised Miller / Sherman-Morrison DEQL solve (no zero diagonal) in NumPy/SciPy."""
    K = np.asarray(K, np.float64)
    n = K.shape[0]
    c = p * a**2 + (1 - p) * b**2
    delta = b**2 - a**2
    alpha0, d0 = c * (1 - p) ** 2, c * (1 - p) * p
    alpha1, d1 = (1 - p) ** 2 * p * delta, (1 - p) * p**2 * delta
    alpha_v, dv = c * (1 - p), (1 - p) * p * delta
    k = np.diag(K)
    d0_vec = d0 * k + lam
    H0 = alpha0 * K
    H0[np.diag_indices(n)] += d0_vec
    Hinv = scipy.linalg.cho_solve(scipy.linalg.cho_factor(H0, lower=True), np.eye(n))
    HinvK = (np.eye(n) - Hinv * d0_vec[None, :]) / alpha0
    S1 = alpha_v * HinvK + Hinv * (dv * k)[None, :]
    S2 = alpha1 * HinvK + Hinv * (d1 * k)[None, :]
    denom = 1 + np.diag(S2)
    S = S1 - S2 * (np.diag(S1) / denom)[None, :]
    T = Hinv - S2 * (np.diag(Hinv) / denom)[None, :]
    row_dot = lambda M: alpha1 * (np.einsum("ij,ji->i", K, M) - k * np.diag(M))
    return S - T * (row_dot(S) / (1 + row_dot(T)))[None, :]


def _measure_one(n: int, repeats: int) -> dict:
    K = synthetic_gram(n)
    with jax.enable_x64(True):
        K_jax = jnp.asarray(K)
        jax_fn = lambda: solvers.deql_traced(K_jax, **HP, zero_diag=False).block_until_ready()
        start = time.perf_counter()
        W_jax = np.asarray(jax_fn())  # the first call compiles
        first = time.perf_counter() - start
        jax_s = median_seconds(jax_fn, repeats)
    numpy_fn = lambda: numpy_deql(K, **HP)
    numpy_s = median_seconds(numpy_fn, repeats)
    W_np = numpy_fn()
    return {
        "n": n,
        "jax_seconds": jax_s,
        "jax_first_call_seconds": first,
        "numpy_seconds": numpy_s,
        "numpy_over_jax": numpy_s / jax_s,
        "max_abs_diff": float(np.abs(W_jax - W_np).max()),
        "max_abs_w": float(np.abs(W_np).max()),
    }


def slope(rows: list[dict], key: str, last: int | None = None) -> float:
    """Least-squares slope of log(time) against log(n) (over the `last` sizes, or all)."""
    rows = rows[-last:] if last else rows
    n = np.log([r["n"] for r in rows])
    return float(np.polyfit(n, np.log([r[key] for r in rows]), 1)[0])


def summary(rows: list[dict]) -> dict:
    out = {}
    for key in ("jax_seconds", "numpy_seconds"):
        out[f"{key}_slope"] = slope(rows, key)
        out[f"{key}_slope_top2"] = slope(rows, key, last=2) if len(rows) >= 2 else None
    return out


def plot(result: Result, path: str) -> None:
    """The measured times against n on log-log axes, with an n^3 line for scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result.details["rows"]
    n = np.array([r["n"] for r in rows], np.float64)
    fig, ax = plt.subplots(figsize=(5, 3.6))
    ax.loglog(n, [r["jax_seconds"] for r in rows], "o-", label="JAX (jit, float64)")
    ax.loglog(n, [r["numpy_seconds"] for r in rows], "s-", label="NumPy/SciPy (float64)")
    ref = rows[-1]["jax_seconds"] * (n / n[-1]) ** 3
    ax.loglog(n, ref, "k--", alpha=0.5, label="n^3 (through the largest JAX point)")
    ax.set_xlabel("catalogue size n (items)")
    ax.set_ylabel("DEQL solve time (s, median)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def measure(*, smoke: bool = False) -> Result:
    sizes, repeats = ((40, 80), 1) if smoke else (SIZES, 3)
    rows = [_measure_one(n, repeats) for n in sizes]
    ratios = [
        Ratio(
            f"DEQL(L2) solve, float64, n={r['n']}",
            "NumPy/SciPy",
            r["numpy_seconds"],
            "JAX (jit)",
            r["jax_seconds"],
            "s",
        )
        for r in rows
    ]
    return Result(ratios, {"hyperparameters": HP, "rows": rows, "fits": summary(rows)})
