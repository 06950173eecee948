"""Exact discrete optimal transport between point clouds: minibatch couplings and the W1 metric.

    j_N = exact_coupling(x0_ND, x1_MD)          # x0[i] is paired with x1[j_N[i]]
    i_B, j_B = sample_plan(exact_plan(x0_ND, x1_MD), np.random.default_rng(0), B)  # torchcfm
    idx_KN = chain([x0_ND, xa_ND, xb_ND, x1_ND])  # clouds[k][idx_KN[k]] row i = trajectory i
    score = w1(samples_ND, reference_MD)        # exact Wasserstein-1, Euclidean ground cost

Flow-matching methods with OT couplings (OT-CFM, ALI-CFM) pair the points of two minibatches by
the exact OT plan between them, uniform weights on both sides, squared Euclidean cost. The plan
is solved by POT's network simplex (`ot.emd`) on the host in float64: these functions take
numpy or JAX arrays, return numpy arrays, and are called outside `jit` (the data pipeline pairs
the batch before the jitted step; inside a step `jax.pure_callback` would be the way in).

`exact_coupling` is the deterministic pairing of the ALI-CFM code (`x1[plan.argmax(1)]`): with
N = M the network simplex returns a vertex of the Birkhoff polytope, a permutation, so the
argmax is exact; with N != M each row keeps the partner that receives most of its mass.
`sample_plan` is torchcfm's stochastic version (B index pairs drawn with replacement from the
normalised plan). `chain` is ALI-CFM's "full" coupling across several time points. `w1` is the
evaluation metric (the EMD of the paper's tables): `ot.emd2` on the Euclidean, not squared,
distance matrix.

Every bad input (not 2-D, dimensions that differ, an empty cloud, a non-finite value, an unknown
cost) raises `ConfigError` in one line; a solve the network simplex did not finish within
`max_iter` pivots raises `RuntimeError` (its plan would not be optimal, and POT only warns).
"""

import warnings
from collections.abc import Sequence

import numpy as np
import ot
from scipy.spatial.distance import cdist

from core.errors import ConfigError

COSTS = ("sqeuclidean", "euclidean")

# Network-simplex pivots. POT's default of 100k suffices for 2300 x 2300 2-D clouds but stopped
# short at 4000 x 4000 (W1 off in the 7th digit; 10M pivots finished it in 2.3 s): a plan that is
# not optimal would pass silently, so allow far more and raise if even that runs out.
MAX_ITER = 10_000_000


def _cloud(x, name: str) -> np.ndarray:
    """`x` as a float64 [n, D] array, or a one-line ConfigError naming `name`."""
    x = np.asarray(x)
    if x.ndim != 2:
        raise ConfigError(f"{name}: shape {x.shape}; expected a 2-D [points, dims] array")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ConfigError(f"{name}: shape {x.shape} is empty; need >= 1 point of >= 1 dim")
    x = x.astype(np.float64)  # before cdist: float32 costs would round near-ties to ties
    if not np.isfinite(x).all():
        raise ConfigError(f"{name}: {np.count_nonzero(~np.isfinite(x))} non-finite values")
    return x


def _pair(x, y, where: str) -> tuple[np.ndarray, np.ndarray]:
    x, y = _cloud(x, f"{where}: x"), _cloud(y, f"{where}: y")
    if x.shape[1] != y.shape[1]:
        raise ConfigError(f"{where}: x has {x.shape[1]} dims, y has {y.shape[1]}; they must match")
    return x, y


def cost_matrix(x_ND, y_MD, cost: str = "sqeuclidean", *, where: str = "cost_matrix"):
    """[N, M] float64 ground costs: ||x_i - y_j||^2 ("sqeuclidean") or ||x_i - y_j||."""
    if cost not in COSTS:
        raise ConfigError(f"{where}: cost {cost!r}; expected one of: {', '.join(COSTS)}")
    x, y = _pair(x_ND, y_MD, where)
    # scipy's cdist takes differences first: no cancellation from |x|^2 + |y|^2 - 2 x.y, which
    # can turn a true tie or a zero distance into a small negative or wrongly ordered cost.
    return cdist(x, y, metric=cost)


def _uniform(n: int) -> np.ndarray:
    return np.full(n, 1 / n)


def _solve(solver, C_NM: np.ndarray, max_iter: int):
    """`ot.emd` or `ot.emd2` with uniform weights; a RuntimeError where it stopped unsolved."""
    N, M = C_NM.shape
    with warnings.catch_warnings():  # POT warns and returns the unfinished answer; we raise
        warnings.simplefilter("ignore", UserWarning)
        out, log = solver(_uniform(N), _uniform(M), C_NM, numItermax=max_iter, log=True)
    if log["warning"] is not None:  # "numItermax reached before optimality" and the like
        raise RuntimeError(
            f"ot.{solver.__name__} on {N} x {M} points: {log['warning']} (max_iter={max_iter})"
        )
    return out


def _plan(x_ND, y_MD, cost: str, max_iter: int, where: str) -> np.ndarray:
    return _solve(ot.emd, cost_matrix(x_ND, y_MD, cost, where=where), max_iter)


def exact_plan(x_ND, y_MD, cost: str = "sqeuclidean", *, max_iter: int = MAX_ITER) -> np.ndarray:
    """The exact OT plan [N, M] between the uniform measures on x and y (entries sum to 1)."""
    return _plan(x_ND, y_MD, cost, max_iter, "exact_plan")


def exact_coupling(x_ND, y_MD, cost: str = "sqeuclidean", *, max_iter: int = MAX_ITER):
    """For each row of x the index of its OT partner in y: [N] int, `y[j_N]` aligns with x.

    A permutation when N == M; otherwise the column holding the largest share of each row's
    mass (ALI-CFM's `pi.argmax(axis=1)`; several rows may share a partner, some y go unused)."""
    return np.argmax(_plan(x_ND, y_MD, cost, max_iter, "exact_coupling"), axis=1)


def sample_plan(plan_NM, rng: np.random.Generator, n: int, *, replace: bool = True):
    """`n` index pairs (i_n, j_n) drawn from the plan as a joint distribution (torchcfm's
    `OTPlanSampler.sample_plan`: pairs (x[i_n], y[j_n]), with replacement by default)."""
    plan = np.asarray(plan_NM, dtype=np.float64)
    if plan.ndim != 2 or plan.size == 0:
        raise ConfigError(f"sample_plan: plan shape {plan.shape}; expected a non-empty [N, M]")
    if not (np.isfinite(plan).all() and (plan >= 0).all() and plan.sum() > 0):
        raise ConfigError("sample_plan: plan must be finite, >= 0 and not all zero")
    if n < 1:
        raise ConfigError(f"sample_plan: n={n}; must be >= 1")
    p = plan.ravel() / plan.sum()  # any nonnegative weights; rng.choice wants p summing to 1
    flat_n = rng.choice(p.size, size=n, p=p, replace=replace)
    return np.divmod(flat_n, plan.shape[1])


def chain(clouds: Sequence, cost: str = "sqeuclidean", *, max_iter: int = MAX_ITER):
    """Successive OT maps clouds[0] -> clouds[1] -> ... -> clouds[K-1] (ALI-CFM's "full"
    coupling): an int array [K, n_0] whose row k indexes clouds[k], so that
    `clouds[k][idx_KN[k]]` is the k-th point of each of the n_0 trajectories (row 0 is arange).

    Like ALI-CFM's `sample_full_batch`, step k transports the points the trajectories reached at
    k - 1 (uniform weight each, duplicates included) to clouds[k]. With equal sizes every map is
    a permutation and this is the composition of the pairwise maps, idx_k = map_k[idx_{k-1}]."""
    if len(clouds) < 2:
        raise ConfigError(f"chain: {len(clouds)} clouds; need >= 2 to couple")
    xs = [_cloud(x, f"chain: clouds[{k}]") for k, x in enumerate(clouds)]
    for k, x in enumerate(xs[1:], start=1):
        if x.shape[1] != xs[0].shape[1]:
            raise ConfigError(
                f"chain: clouds[{k}] has {x.shape[1]} dims, clouds[0] has {xs[0].shape[1]}"
            )
    idx = [np.arange(xs[0].shape[0])]
    for k in range(1, len(xs)):
        plan = _plan(xs[k - 1][idx[-1]], xs[k], cost, max_iter, "chain")
        idx.append(np.argmax(plan, axis=1))
    return np.stack(idx)


def w1(x_ND, y_MD, *, max_iter: int = MAX_ITER) -> float:
    """Exact Wasserstein-1 (EMD) between the uniform empirical measures on x and y, Euclidean
    ground cost: min over plans P of sum_ij P_ij ||x_i - y_j||. Symmetric; 0 iff the two
    empirical measures agree. N != M is fine (each x_i sends 1/N, each y_j receives 1/M)."""
    return float(_solve(ot.emd2, cost_matrix(x_ND, y_MD, "euclidean", where="w1"), max_iter))
