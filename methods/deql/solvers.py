"""Closed-form linear-autoencoder recommenders: EASE, EDLAE and DEQL, with the Gram matrix.

    K = sharded_gram(X_UI, mesh)                     # [I, I] = X^T X, users split over devices
    W = deql(K, a=1.0, b=0.5, p=0.5, lam=100.0, zero_diag=True)
    B = edlae(K, p=0.5, lam=300.0)                   # b = 0, Steck 2020
    B = ease(K, lam=300.0)
    f = expected_loss(W, R, a, b, p)                 # E_Delta ||A . (R - (Delta . R) W)||^2

DEQL (paper 8): dropout mask Delta_uj ~ Bernoulli(1 - p) keeps an entry (no 1/(1-p)
rescaling); the loss weight is a on dropped and b on kept entries. The expected loss splits by
column: column i minimises w^T H^(i) w - 2 w^T v^(i) (+ lam |w|^2), where H^(i) = G^(i) . K
differs from one column-independent H0 only in row and column i. `deql` therefore factors H0
once and applies two rank-one (Sherman-Morrison) updates per column, all columns at once as
diagonal scalings and row-wise dot products: O(n^3), one n x n inverse. `deql_direct` builds
every H^(i) and solves it (O(n^4)): the test oracle, for tiny n only.

The lam scales differ: DEQL's H0 carries the factor p a^2 (1 - p)^2 at b = 0, so DEQL(b = 0,
zero diagonal, lam) = EDLAE(lam / (p a^2 (1 - p)^2)) / (1 - p).

Precision: the solvers run in float64 (inside `jax.enable_x64`, local to the call; the global
flag is left alone) because the inverse and the rank-one updates subtract nearly equal numbers;
they return float64 arrays. The one factorisation is float32 Cholesky refined to float64
(`_spd_inverse`: float64 Cholesky does not compile for multi-chip TPUs). `gram` keeps X's
dtype: for 0/1 data float32 counts are exact below 2^24 interactions per item pair.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from core.errors import ConfigError

# ---------------------------------------------------------------------------------------------
# Gram matrix


def gram(X_UI) -> jax.Array:
    """K = X^T X [I, I] on one device."""
    X_UI = jnp.asarray(X_UI)
    return X_UI.T @ X_UI


def psum_gram(X_UI, mesh, axes: tuple[str, ...]) -> jax.Array:
    """K = X^T X [I, I] with the users split over `axes` of `mesh` (concrete, or the abstract
    mesh a traced step sees): each device forms its rows' Gram matrix and a psum adds them, so
    no device holds more than its share of X. The user count must divide over the axes."""
    block = lambda x_BI: jax.lax.psum(x_BI.T @ x_BI, axes)
    return jax.shard_map(block, mesh=mesh, in_specs=P(axes, None), out_specs=P())(X_UI)


def sharded_gram(X_UI, mesh: Mesh) -> jax.Array:
    """`psum_gram` over every axis of a concrete `mesh`, from host data: users are padded with
    zero rows up to a multiple of the device count (a zero row adds nothing to K)."""
    X_UI = np.asarray(X_UI)
    X_UI = np.pad(X_UI, ((0, -X_UI.shape[0] % mesh.size), (0, 0)))
    axes = tuple(mesh.axis_names)
    return jax.jit(functools.partial(psum_gram, mesh=mesh, axes=axes))(X_UI)


# ---------------------------------------------------------------------------------------------
# Float64 boundary


def _float64(fn):
    """Runs `fn` under a local `jax.enable_x64`, with its array arguments as float64."""

    @functools.wraps(fn)
    def wrapper(K, *args, **kwargs):
        with jax.enable_x64(True):
            return fn(jnp.asarray(np.asarray(K, np.float64)), *args, **kwargs)

    return wrapper


def _check(K, p: float, lam: float) -> None:
    if K.ndim != 2 or K.shape[0] != K.shape[1]:
        raise ConfigError(f"K has shape {K.shape}; expected a square Gram matrix [I, I]")
    if not 0 <= p < 1:
        raise ConfigError(f"p={p}: the dropout probability must be in [0, 1)")
    if lam < 0:
        raise ConfigError(f"lam={lam}: the L2 weight must be >= 0")


def _diag_constrained(P_II):
    """B = -P / diag(P) by column, zero diagonal: the EASE-form solution of (K + Lambda) b = K
    with b_ii = 0, given P = (K + Lambda)^-1."""
    B_II = -P_II / jnp.diag(P_II)[None, :]
    return B_II.at[jnp.diag_indices(B_II.shape[0])].set(0.0)


# Refinement steps of `_spd_inverse`: each shrinks the relative error by about
# cond(H) * 2^-24 (measured on random SPD matrices: three steps reach float64's level up to
# cond 1e4, 2e-12 at 1e5, 3e-9 at 1e6). On ML-100k (every sixth point of the experiment's
# grid, split 0) W moves from the float64 Cholesky's by 2e-10 after one step, 9e-14 after two
# or three; three (a margin for worse-conditioned data) leave the validation-chosen W of all
# 10 splits within 3.3e-13 and their test Recall@20/50, NDCG@100 unchanged.
REFINEMENTS = 3


def _spd_inverse(H_II, refinements: int = REFINEMENTS, factor64: bool = False):
    """H^-1 of a symmetric positive definite H, to H's precision (float64 inside the solvers).

    The Cholesky factor is float32: a float64 Cholesky does not compile into a multi-chip TPU
    program (jax 0.10.2 / libtpu 0.0.42: "A tuple parameter that is being flattened shouldn't
    have frontend attributes"; one chip, or float32, compiles). The inverse is then refined in
    H's dtype, X <- X + L^-T L^-1 (I - H X), with triangular solves and matmuls, which compile
    in float64 on every platform. `factor64` (one device only, e.g. `methods.deql.fit_host`)
    factors in H's dtype and skips the refinement: the same inverse at about a quarter of the
    work (four solves against the identity and three matmuls fewer)."""
    if factor64:
        return jax.scipy.linalg.cho_solve(
            (jnp.linalg.cholesky(H_II), True), jnp.eye(H_II.shape[0], dtype=H_II.dtype)
        )
    L_II = jnp.linalg.cholesky(H_II.astype(jnp.float32)).astype(H_II.dtype)
    eye_II = jnp.eye(H_II.shape[0], dtype=H_II.dtype)
    X_II = jax.scipy.linalg.cho_solve((L_II, True), eye_II)
    for _ in range(refinements):
        X_II = X_II + jax.scipy.linalg.cho_solve((L_II, True), eye_II - H_II @ X_II)
    return X_II


# ---------------------------------------------------------------------------------------------
# EASE and EDLAE (b = 0)


@_float64
def edlae(K, p: float, lam: float) -> jax.Array:
    """Steck's EDLAE, full emphasis (b = 0): B = -P / diag(P), diag(B) = 0, with
    P = (K + p/(1-p) diag(K) + lam I)^-1. p = 0 is EASE."""
    _check(K, p, lam)
    return edlae_traced(K, p, lam)


@functools.partial(jax.jit, static_argnames="factor64")
def edlae_traced(K_II, p, lam, factor64=False):
    """`edlae` without the checks and the float64 boundary, for use inside a trace: call it
    under `jax.enable_x64(True)` with a float64 K (`methods.deql.fit` does). `factor64`: see
    `_spd_inverse`."""
    reg_I = p / (1 - p) * jnp.diag(K_II) + lam
    return _diag_constrained(_spd_inverse(K_II + jnp.diag(reg_I), factor64=factor64))


def ease(K, lam: float) -> jax.Array:
    """EASE (Steck 2019): B = -P / diag(P), diag(B) = 0, P = (K + lam I)^-1."""
    return edlae(K, 0.0, lam)


# ---------------------------------------------------------------------------------------------
# DEQL


def _coefficients(a, b, p):
    """The scalars of the closed form: H0 = alpha0 K + diag(d0 * diag K) (+ lam I), E1 (the
    row/column-i correction) = alpha1 K + diag(d1 * diag K), V = alpha_v K + diag(dv * diag K).
    c = E[A^2] = p a^2 + (1-p) b^2."""
    c = p * a**2 + (1 - p) * b**2
    delta = b**2 - a**2
    return dict(
        alpha0=c * (1 - p) ** 2,
        d0=c * (1 - p) * p,  # diagonal c (1-p) minus the alpha0 share
        alpha1=(1 - p) ** 2 * p * delta,
        d1=(1 - p) * p**2 * delta,  # diagonal (1-p) p delta minus the alpha1 share
        alpha_v=c * (1 - p),
        dv=(1 - p) * p * delta,  # v_i = (1-p) b^2 K_ii instead of c (1-p) K_ii
    )


@_float64
def deql(K, a: float, b: float, p: float, lam: float, zero_diag: bool = False) -> jax.Array:
    """W [I, I] minimising the DEQL expected loss (+ lam |W|^2; W_ii = 0 if `zero_diag`) by the
    vectorised Miller / Sherman-Morrison algorithm. b = 0 with lam = 0 is singular: use edlae."""
    _check(K, p, lam)
    if b == 0 and lam == 0:
        raise ConfigError("b=0 with lam=0 makes every H^(i) singular; use edlae for b = 0")
    return deql_traced(K, a, b, p, lam, zero_diag)


@functools.partial(jax.jit, static_argnames=("zero_diag", "factor64"))
def deql_traced(K_II, a, b, p, lam, zero_diag, factor64=False):
    """`deql` without the checks and the float64 boundary, for use inside a trace (as
    `edlae_traced`)."""
    co = _coefficients(a, b, p)
    k_I = jnp.diag(K_II)
    d0_I = co["d0"] * k_I + lam
    H0_II = co["alpha0"] * K_II + jnp.diag(d0_I)
    Hinv_II = _spd_inverse(H0_II, factor64=factor64)  # the one n x n factorisation
    # H0^-1 K = (I - H0^-1 D0) / alpha0, so H0^-1 V and H0^-1 E1 need only diagonal scalings.
    HinvK_II = (jnp.eye(K_II.shape[0], dtype=K_II.dtype) - Hinv_II * d0_I[None, :]) / co["alpha0"]
    S1_II = co["alpha_v"] * HinvK_II + Hinv_II * (co["dv"] * k_I)[None, :]  # column i: H0^-1 v^(i)
    S2_II = co["alpha1"] * HinvK_II + Hinv_II * (co["d1"] * k_I)[None, :]  # column i: H0^-1 E1 e_i
    # Column update H0 + E1 e_i e_i^T, applied to v^(i) (-> S) and to e_i (-> T), every i at once.
    denom_I = 1 + jnp.diag(S2_II)
    S_II = S1_II - S2_II * (jnp.diag(S1_II) / denom_I)[None, :]
    T_II = Hinv_II - S2_II * (jnp.diag(Hinv_II) / denom_I)[None, :]

    # Row update + e_i r_i^T with r_i = row i of E1 without its diagonal = alpha1 (K_i - K_ii e_i).
    def row_dot(M_II):  # [I]: r_i . M[:, i] for every i
        return co["alpha1"] * (jnp.einsum("ij,ji->i", K_II, M_II) - k_I * jnp.diag(M_II))

    rt_I = row_dot(T_II)
    W_II = S_II - T_II * (row_dot(S_II) / (1 + rt_I))[None, :]
    if zero_diag:  # Lagrange projection onto W_ii = 0 along c_i = H^(i)^-1 e_i = t_i / (1 + r.t)
        C_II = T_II / (1 + rt_I)[None, :]
        W_II = W_II - C_II * (jnp.diag(W_II) / jnp.diag(C_II))[None, :]
    return W_II


def deql_direct(K, a: float, b: float, p: float, lam: float, zero_diag: bool = False):
    """The oracle for `deql`: builds H^(i) = G^(i) . K + lam I and v^(i) = g^(i) . K_i for each
    column and solves (with zero_diag, the reduced system without item i). numpy float64,
    O(n^4): tiny n only."""
    K = np.asarray(K, np.float64)
    n = K.shape[0]
    c = p * a**2 + (1 - p) * b**2
    W = np.zeros((n, n))
    for i in range(n):
        G = np.full((n, n), c * (1 - p) ** 2)
        np.fill_diagonal(G, c * (1 - p))
        G[i, :] = G[:, i] = (1 - p) ** 2 * b**2
        G[i, i] = (1 - p) * b**2
        g = np.full(n, c * (1 - p))
        g[i] = (1 - p) * b**2
        H, v = G * K + lam * np.eye(n), g * K[:, i]
        keep = np.arange(n) != i if zero_diag else np.ones(n, bool)
        W[keep, i] = np.linalg.solve(H[np.ix_(keep, keep)], v[keep])
    return W


def expected_loss(W_II, R_UI, a: float, b: float, p: float):
    """E_Delta ||A . (R - (Delta . R) W)||_F^2 in closed form (no L2 term); differentiable in W.
    Sum over columns of w_i^T H^(i) w_i - 2 w_i^T v^(i) + c sum_u R_ui^2, with H^(i) = H0 + the
    row/column-i correction E1 (see `_coefficients`)."""
    co = _coefficients(a, b, p)
    K_II = R_UI.T @ R_UI
    k_I = jnp.diag(K_II)
    w_I = jnp.diag(W_II)
    quad = jnp.sum(W_II * (co["alpha0"] * K_II @ W_II + (co["d0"] * k_I)[:, None] * W_II))
    # Row and column i of E1 against w_i: 2 w_ii (E1 w_i)_i, minus the (i, i) entry counted twice.
    E1w_I = co["alpha1"] * jnp.einsum("ij,ji->i", K_II, W_II) + co["d1"] * k_I * w_I
    e1_diag_I = (co["alpha1"] + co["d1"]) * k_I
    cross = jnp.sum(2 * w_I * E1w_I - e1_diag_I * w_I**2)
    linear = jnp.sum(W_II * (co["alpha_v"] * K_II)) + jnp.sum(co["dv"] * k_I * w_I)
    const = (p * a**2 + (1 - p) * b**2) * jnp.sum(k_I)
    return quad + cross - 2 * linear + const
