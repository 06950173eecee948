"""The early-exit cascade: stop at the first truncation that is confident enough.

    r = cascade(params, x_BD, y_B, tau)           # order by order on the rows still undecided
    r = cascade_from_logits(Y_BN, y_B, tau, counts_N)   # the same decisions from all truncations
    r.f1, r.mean_exit_order, r.exit_fraction (N,), r.mean_params, r.logit (B,), r.exit_order (B,)

A row exits at order k if sigmoid(P_{:k}) < 1 - tau (benign) or > tau (harmful); rows still
undecided at N keep the order-N logit. tau = 0.5 sends every row out at order 1 (unless its
logit is exactly 0), tau = 1 sends every row to N. The comparison is made on logits against
+-log(tau / (1 - tau)), which is the same test without sigmoid's saturation (tau = 1 gives inf).
Cost: the mean over rows of the truncation's cumulative parameters at the exit order
(`model.param_counts`), the paper's measure.

`cascade` is the efficient form of the paper's: it carries each row's partial logit and, at
stage k, evaluates only order k's term on the active rows (`order_term`: U's k-th block), where
the released code recomputes the truncation up to k. Host-side (evaluation; the active set
shrinks, so shapes change per stage). `cascade_from_logits` takes every truncation from one
`model.logits` call (the fused kernel) and makes the same decisions.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from core.kernels import poly_probe
from methods.tpc import model

_HIGHEST = jax.lax.Precision.HIGHEST


class CascadeResult(NamedTuple):
    f1: float
    mean_exit_order: float
    exit_fraction: np.ndarray  # [N]: the fraction of rows exiting at each order
    mean_params: float
    logit: np.ndarray  # [B] the logit each row exits with
    exit_order: np.ndarray  # [B] int, 1..N


def logit_thresholds(tau: float) -> tuple[float, float]:
    """(low, high): sigmoid(l) < 1 - tau iff l < low; sigmoid(l) > tau iff l > high."""
    if not 0.5 <= tau <= 1:
        raise ValueError(f"cascade: tau={tau} must be in [0.5, 1]")
    high = np.inf if tau == 1 else float(np.log(tau) - np.log1p(-tau))
    return -high, high


def _result(y_B, logit_B, exit_B, counts_N) -> CascadeResult:
    N = len(counts_N)
    return CascadeResult(
        f1=model.f1_score(y_B, logit_B),
        mean_exit_order=float(exit_B.mean()),
        exit_fraction=np.bincount(exit_B - 1, minlength=N) / len(exit_B),
        mean_params=float(np.asarray(counts_N)[exit_B - 1].mean()),
        logit=logit_B,
        exit_order=exit_B,
    )


def order_term(params: dict, x_BD, k: int) -> np.ndarray:
    """[B]: the order-k term alone (k = 1: the linear term w0 + x . w1), from U's k-th block
    only: R columns of projections, powers as `poly_probe.power` (the reference's order of
    products), float32 at HIGHEST precision like the reference. (`poly_probe.op` evaluates
    orders 1..n together, so one order alone is not its job.)"""
    x_BD = jnp.asarray(x_BD, jnp.float32)
    if k == 1:
        return np.array(jnp.dot(x_BD, params["w1"], precision=_HIGHEST) + params["w0"])
    z_BR = jnp.dot(x_BD, jnp.asarray(params["U"][k - 2]).T, precision=_HIGHEST)
    return np.array(poly_probe.power(z_BR, k) @ jnp.asarray(params["lam"][k - 2]))


def cascade(params: dict, x_BD, y_B, tau: float) -> CascadeResult:
    low, high = logit_thresholds(tau)
    x_BD = np.asarray(x_BD, np.float32)
    B, D = x_BD.shape
    K, R = np.shape(params["lam"])
    N = K + 1
    logit_B = order_term(params, x_BD, 1)
    exit_B = np.full(B, N)
    active = np.arange(B)
    for k in range(1, N + 1):
        if k > 1:
            logit_B[active] += order_term(params, x_BD[active], k)
        if k == N:
            break
        done = (logit_B[active] < low) | (logit_B[active] > high)
        exit_B[active[done]] = k
        active = active[~done]
        if not len(active):
            break
    return _result(y_B, logit_B, exit_B, model.param_counts(D, N, R))


def cascade_from_logits(Y_BN, y_B, tau: float, counts_N) -> CascadeResult:
    """The cascade's decisions given every truncation (e.g. `model.logits`), vectorised."""
    low, high = logit_thresholds(tau)
    logits_BN = np.asarray(Y_BN)
    confident_BN = (logits_BN < low) | (logits_BN > high)
    confident_BN[:, -1] = True
    exit_B = np.argmax(confident_BN, axis=1) + 1
    logit_B = logits_BN[np.arange(len(logits_BN)), exit_B - 1]
    return _result(y_B, logit_B, exit_B, counts_N)
