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
stage k, evaluates only order k's term on the active rows (`_term`: U's k-th block), where
the released code recomputes the truncation up to k. `cascade_from_logits` takes every
truncation from one `model.logits` call (the fused kernel) and makes the same decisions.

How `cascade` runs. The loop and the exit decisions are on the host (numpy): which rows stay
active is data, and so is how many. The arithmetic is jitted: x and the parameters go to the
device once per call; stage 1 is one jitted linear term on all B rows; stage k >= 2 is one
jitted call (`_gathered_term`) that gathers the active rows from x by index, projects them on U's
k-th block and takes the powers. Its row count is a bucket, not the active count (`bucket`):
the count rounded up to one of BUCKETS_PER_OCTAVE = 4 evenly spaced sizes per power of two
(..., 1280, 1536, 1792, 2048, 2560, ...), at least MIN_BUCKET and at most B, the index vector
padded with row 0 (computed, then dropped); a bucket of B rows skips the gather and takes all
of x. Why buckets: jit specialises on shapes, so the exact counts, which differ per stage, per
tau and per batch, would compile afresh at nearly every call (un-jitted, every op dispatches
eagerly instead), and wall time would measure the compiler and the dispatcher rather than the
cascade. With buckets each (order, bucket) compiles once for a given x shape (about
4 log2(B / MIN_BUCKET) + 1 shapes per order) and later calls reuse it. Why 4 per octave, not
powers of two: padding costs at most 25 % more rows instead of 100 %, for at most 4x the
compilations. On the planted benchmark (`methods/tpc/bench.py`) at tau = 0.95, stages of 4050,
3044, 2401 and 2323 active rows of 4096 all round up to 4096 as powers of two, to 4096, 3072,
2560, 2560 here. Under MIN_BUCKET rows a stage costs its dispatch anyway. The carried logits
and the scatter back stay in numpy: they are B floats.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from core.kernels import poly_probe
from methods.tpc import model

_HIGHEST = jax.lax.Precision.HIGHEST
MIN_BUCKET = 64
BUCKETS_PER_OCTAVE = 4


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


def bucket(n: int, B: int) -> int:
    """The rows a stage with n active rows (of B) computes: n rounded up to the next of
    BUCKETS_PER_OCTAVE evenly spaced sizes in the octave (2^(j-1), 2^j] holding n (1 per octave:
    powers of two), at least MIN_BUCKET, at most B."""
    if n <= MIN_BUCKET:
        return min(MIN_BUCKET, B)
    step = (1 << (n - 1).bit_length()) // (2 * BUCKETS_PER_OCTAVE)
    return min(-(-n // step) * step, B)


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


def _device_params(params: dict) -> dict:
    """The four arrays float32 on the device, once per call (a no-op for float32 jax arrays):
    numpy parameters are not copied again at every stage."""
    return {name: jnp.asarray(params[name], jnp.float32) for name in ("w0", "w1", "U", "lam")}


def _term(x_BD, params: dict, k: int):
    """[B]: order k's term alone, from U's k-th block only (k = 1: the linear term w0 + x . w1);
    powers as `poly_probe.power`, float32 at HIGHEST precision like the reference.
    (`poly_probe.op` evaluates orders 1..n together, so one order alone is not its job.)"""
    if k == 1:
        return jnp.dot(x_BD, params["w1"], precision=_HIGHEST) + params["w0"]
    z_BR = jnp.dot(x_BD, params["U"][k - 2].T, precision=_HIGHEST)
    return poly_probe.power(z_BR, k) @ params["lam"][k - 2]


_jit_term = jax.jit(_term, static_argnums=2)


@functools.partial(jax.jit, static_argnums=3)
def _gathered_term(x_BD, rows_C, params: dict, k: int):
    """[C]: order k's term on rows x[rows_C] (gathered inside the jitted call)."""
    return _term(x_BD[rows_C], params, k)


def cascade(params: dict, x_BD, y_B, tau: float) -> CascadeResult:
    low, high = logit_thresholds(tau)
    x_BD = jnp.asarray(x_BD, jnp.float32)
    B, D = x_BD.shape
    K, R = np.shape(params["lam"])
    N = K + 1
    params = _device_params(params)
    logit_B = np.array(_jit_term(x_BD, params, 1))
    exit_B = np.full(B, N)
    active = np.arange(B)
    for k in range(2, N + 1):
        done = (logit_B[active] < low) | (logit_B[active] > high)
        exit_B[active[done]] = k - 1
        active = active[~done]
        if not len(active):
            break
        C = bucket(len(active), B)
        if C == B:  # as many rows as x has: take them all, without a gathered copy of x
            logit_B[active] += np.asarray(_jit_term(x_BD, params, k))[active]
            continue
        rows_C = np.zeros(C, np.int32)  # padding: row 0, computed and dropped
        rows_C[: len(active)] = active
        logit_B[active] += np.asarray(_gathered_term(x_BD, rows_C, params, k))[: len(active)]
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
