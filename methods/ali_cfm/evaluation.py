"""ALI-CFM's host evaluation: W1 (`core.ot.w1`, data units) against the observed marginals.

    times_T, ref = eval_targets(split)                   # held-out time, or every intermediate
    w = flow_w1(v_params, split, n=1000, seed=0)         # ODE from q_0 (dopri5) to each time
    w = interpolant_w1(g_params, split, n=1000, seed=0)  # G(x0, x1, t) on OT-coupled (x0, x1)
    # {"w1/t0.500": ..., "w1/mean": ...}

The flow's W1 is that of the paper's tables: the velocity field integrated from q_0's samples
(torchdyn's dopri5 there, `core.ode.solve` here) compared with the marginal at that time. The
interpolant's W1 checks the GAN stage alone: x0 ~ q_0 and x1 ~ q_1 paired by exact OT, pushed
through G without t-noise.
"""

import jax
import jax.numpy as jnp
import numpy as np

from core import ode, ot
from methods.ali_cfm.batches import Split
from methods.ali_cfm.nets import interpolant, velocity


def eval_targets(split: Split) -> tuple[np.ndarray, list[np.ndarray]]:
    """(times [T], samples per time): the held-out marginal, or every training intermediate."""
    if split.held_time is not None:
        return np.array([split.held_time], np.float32), [split.held_samples]
    return split.train.times[1:-1], split.train.samples[1:-1]


def _subsample(x_ND, n: int, rng: np.random.Generator) -> np.ndarray:
    return x_ND if len(x_ND) <= n else x_ND[rng.choice(len(x_ND), n, replace=False)]


def _metrics(split: Split, times_T, generated_TND, refs) -> dict:
    m = split.train
    out = {
        f"w1/t{t:.3f}": ot.w1(m.denormalise(x_ND), m.denormalise(ref_ND))
        for t, x_ND, ref_ND in zip(times_T, generated_TND, refs, strict=True)
    }
    return {**out, "w1/mean": float(np.mean(list(out.values())))}


@jax.jit
def _flow(v_params, x0_ND, save_at_T):
    field = lambda t, x: velocity(v_params, x, t)
    return ode.solve(field, x0_ND, 0.0, 1.0, method="dopri5", save_at=save_at_T)


def second_difference_energy(path_TND, dt: float) -> float:
    """The discretised curvature energy of trajectories on a uniform time grid: the mean over
    trajectories of sum_i ||x_{i+1} - 2 x_i + x_{i-1}||^2 / dt^3, a Riemann sum of the integral
    of ||d^2x/dt^2||^2 over t (each second difference is d^2x/dt^2 dt^2)."""
    second_SND = np.diff(np.asarray(path_TND, np.float64), n=2, axis=0)
    return float(np.mean(np.sum(second_SND**2, axis=(0, 2))) / dt**3)


def flow_paths(v_params, split: Split, *, n: int, seed: int, steps: int = 100) -> np.ndarray:
    """[steps + 1, n, D] trajectories in data units of u_theta's flow from (up to n of) q_0's
    samples, saved at `steps` + 1 equally spaced times over [0, 1]."""
    x0_ND = _subsample(split.train.samples[0], n, np.random.default_rng(seed))
    grid_T = jnp.linspace(0.0, 1.0, steps + 1)
    return split.train.denormalise(np.asarray(_flow(v_params, jnp.asarray(x0_ND), grid_T)))


def flow_energy(v_params, split: Split, *, n: int, seed: int, steps: int = 100) -> float:
    """`second_difference_energy` of `flow_paths`."""
    path_TND = flow_paths(v_params, split, n=n, seed=seed, steps=steps)
    return second_difference_energy(path_TND, 1.0 / steps)


def flow_w1(v_params, split: Split, *, n: int, seed: int) -> dict:
    """W1 at each evaluation time of the flow of u_theta started from (up to n of) q_0's
    samples; the references are (up to n of) that marginal's samples."""
    times_T, refs = eval_targets(split)
    rng = np.random.default_rng(seed)
    x0_ND = _subsample(split.train.samples[0], n, rng)
    path_TND = np.asarray(_flow(v_params, jnp.asarray(x0_ND), jnp.asarray(times_T)))
    return _metrics(split, times_T, path_TND, [_subsample(r, n, rng) for r in refs])


@jax.jit
def _interpolate(g_params, x0_ND, x1_ND, times_T):
    return jax.vmap(lambda t: interpolant(g_params, x0_ND, x1_ND, t))(times_T)


def interpolant_w1(g_params, split: Split, *, n: int, seed: int) -> dict:
    """W1 at each evaluation time of G(x0, x1, t) (no t-noise), x0 from q_0 and x1 from q_1
    (up to n each) paired by the exact OT coupling."""
    times_T, refs = eval_targets(split)
    rng = np.random.default_rng(seed)
    x0_ND = _subsample(split.train.samples[0], n, rng)
    x1_MD = _subsample(split.train.samples[-1], n, rng)
    x1_ND = x1_MD[ot.exact_coupling(x0_ND, x1_MD)]
    fake_TND = np.asarray(_interpolate(g_params, x0_ND, x1_ND, jnp.asarray(times_T)))
    return _metrics(split, times_T, fake_TND, [_subsample(r, n, rng) for r in refs])
