"""One Gaussian-process surrogate per optimiser: an exact GP in numpy (Cholesky on the host),
its kernel hyperparameters chosen by maximum marginal likelihood.

Kernel: a^2 (exp(-|x - x'|^2 / (2 l^2)) + r [x = x']): an RBF on standardised encodings with
a white-noise ratio r (a cycle's score is a noisy function of the state). The amplitude a^2
has its maximum-likelihood value in closed form for each (l, r), y' K~^-1 y / n, so the
likelihood is maximised over a fixed grid of (l, r) only, all Cholesky factorisations in one
batched call. Why not scikit-learn's GaussianProcessRegressor: its L-BFGS fit took 0.2-1.3 s
per fit on 5-40 points here (shared 2-core machine), 5 fits per cycle; this takes
milliseconds and is deterministic (a resumed run repeats it). Zero prior mean (a score of 0
is "no progress"); an optimiser with no data yet gets the prior, mean 0 and std 1 (scores lie
in [-1, 1]). The posterior std is the latent function's (no noise term): the uncertainty the
acquisition explores.
"""

from typing import NamedTuple

import numpy as np

LENGTH_SCALES = np.logspace(-1, 1.5, 11)  # of standardised inputs
NOISE_RATIOS = np.array([1e-4, 1e-3, 1e-2, 1e-1, 1.0])
MIN_AMPLITUDE = 1e-6  # a^2 floor: all-zero scores would otherwise give a singular kernel
PRIOR_STD = 1.0


class Fit(NamedTuple):
    x_ND: np.ndarray
    chol_NN: np.ndarray  # Cholesky factor of R + r I (unit amplitude)
    alpha_N: np.ndarray  # (R + r I)^-1 y
    length: float
    noise: float
    amplitude: float  # a^2
    log_likelihood: float


def rbf(a_ND, b_MD, length):
    d2 = ((a_ND[:, None, :] - b_MD[None, :, :]) ** 2).sum(-1)
    return np.exp(-0.5 * d2 / length**2)


def log_likelihood(x_ND, y_N, length, noise, amplitude) -> float:
    """log p(y | x) under the kernel, computed directly (slogdet and solve): the reference
    `fit`'s grid maximisation is tested against."""
    n = len(y_N)
    k = amplitude * (rbf(x_ND, x_ND, length) + noise * np.eye(n))
    _, logdet = np.linalg.slogdet(k)
    return float(-0.5 * y_N @ np.linalg.solve(k, y_N) - 0.5 * logdet - 0.5 * n * np.log(2 * np.pi))


def fit(x_ND, y_N, *, length: float | None = None, noise: float | None = None) -> Fit:
    """The GP on (x, y): hyperparameters by maximum marginal likelihood over the grid, or the
    given `length` and `noise` (the amplitude is always its maximum-likelihood value)."""
    x_ND, y_N = np.asarray(x_ND, np.float64), np.asarray(y_N, np.float64)
    n = len(y_N)
    lengths = LENGTH_SCALES if length is None else np.array([length])
    noises = NOISE_RATIOS if noise is None else np.array([noise])
    grid_l, grid_r = (g.ravel() for g in np.meshgrid(lengths, noises, indexing="ij"))
    d2 = ((x_ND[:, None, :] - x_ND[None, :, :]) ** 2).sum(-1)
    k_GNN = np.exp(-0.5 * d2[None] / grid_l[:, None, None] ** 2) + grid_r[:, None, None] * np.eye(n)
    chol = np.linalg.cholesky(k_GNN)
    alpha = np.linalg.solve(np.swapaxes(chol, 1, 2), np.linalg.solve(chol, y_N[None, :, None]))
    alpha = alpha[..., 0]
    amp = np.maximum(np.einsum("n,gn->g", y_N, alpha) / n, MIN_AMPLITUDE)
    log_det = 2 * np.log(np.diagonal(chol, axis1=1, axis2=2)).sum(-1)
    # log p = -y'K^-1y/2 - log|K|/2 - n log(2 pi)/2 with K = a^2 K~
    ll = (
        -0.5 * np.einsum("n,gn->g", y_N, alpha) / amp
        - 0.5 * (log_det + n * np.log(amp))
        - 0.5 * n * np.log(2 * np.pi)
    )
    g = int(np.argmax(ll))  # first maximum: ties go to the shorter length, lower noise
    return Fit(x_ND, chol[g], alpha[g], float(grid_l[g]), float(grid_r[g]), float(amp[g]),
               float(ll[g]))  # fmt: skip


def predict(f: Fit, query_QD) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and std of the latent function at `query_QD`."""
    k_NQ = rbf(f.x_ND, np.asarray(query_QD, np.float64), f.length)
    mean = k_NQ.T @ f.alpha_N
    v = np.linalg.solve(f.chol_NN, k_NQ)
    var = f.amplitude * np.maximum(1.0 - (v * v).sum(0), 0.0)
    return mean, np.sqrt(var)


def posterior(x_ND, y_N, query_QD) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and std at `query_QD` of the GP fitted to (x, y); the prior for no data."""
    if len(y_N) == 0:
        q = np.asarray(query_QD).shape[0]
        return np.zeros(q), np.full(q, PRIOR_STD)
    return predict(fit(x_ND, y_N), query_QD)


def standardise(rows_ND: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, scale) of the rows per column (scale 1 where a column is constant)."""
    mean = rows_ND.mean(axis=0)
    scale = rows_ND.std(axis=0)
    return mean, np.where(scale > 1e-12, scale, 1.0)
