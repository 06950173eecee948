"""The policies that choose each cycle's optimiser, as `Method.hook`s of core.cycles: DOIT
(cold start, then one GP per optimiser and the acquisition), and the random and periodic
switching baselines. Every decision is a function of the train state (the policy's own state
lives in `extra["doit"]`, its random draws are keyed by the run's key and the cycle index),
so a resumed run repeats it.

DOIT after cycle i (0-based) ran optimiser j with losses l:
1. s = cycle_score(l); store (j, s); cold-start weight w[j] = max((s + 1) / 2, w_min).
2. Encode the state that starts cycle i + 1: during the cold start, a snapshot of the
   selected layers; when it ends, the PCA basis is fitted on those snapshots and every stored
   state encoded; afterwards, one on-device projection per cycle.
3. Choose cycle i + 1's optimiser: during the cold start (cycles < n_ini), a draw with
   probability proportional to w; afterwards argmax_j sigmoid(mu_j + kappa * sigma_j) of each
   optimiser's GP posterior at the encoding, the encodings standardised per cycle (mean and
   std of every stored encoding, recomputed each cycle: parameters drift in scale).
   kappa (exploration) is halved every `halving` cycles: (1 - omega_t) * 2^-floor(i / n)
   ("self_consistent", the default); the formula as printed, 1 - 2^-floor(i / n) * omega_t,
   grows instead ("printed", a flag).
"""

import dataclasses
import time

import jax
import numpy as np

from core import cycles
from methods.doit import encoding, score, surrogate


@dataclasses.dataclass(frozen=True)
class Settings:
    num_optimizers: int
    num_cycles: int
    n_ini: int = 10  # cold-start cycles
    components: int = 2  # PCA components per selected leaf
    layers: str = ".*"  # regex over parameter paths
    alpha: float = 0.0  # the score's weight on the spread of one-step progress
    w_min: float = 0.05  # the cold start's floor on a weight
    halving: int = 10  # cycles per halving of kappa
    omega_t: float = 0.0  # transferability weight (0: training from scratch)
    schedule: str = "self_consistent"  # or "printed"

    @property
    def snapshot_rows(self) -> int:
        return min(self.n_ini, self.num_cycles) + 1


def kappa(s: Settings, cycle: int) -> float:
    halvings = 2.0 ** -(cycle // s.halving)
    if s.schedule == "printed":
        return 1.0 - halvings * s.omega_t
    return (1.0 - s.omega_t) * halvings


def initial_state(s: Settings, params) -> dict:
    """The policy's state (extra["doit"]) for a run starting from `params` (traced in init)."""
    import jax.numpy as jnp

    snaps = encoding.initial_snapshots(params, s.layers, s.snapshot_rows)
    dim = s.components * len(snaps)
    return {
        "chosen": jnp.full((s.num_cycles,), -1, jnp.int32),
        "scores": jnp.zeros((s.num_cycles,), jnp.float32),
        "weights": jnp.ones((s.num_optimizers,), jnp.float32),
        "encodings": jnp.zeros((s.num_cycles + 1, dim), jnp.float32),
        "snapshots": snaps,
        "pca_mean": {k: jnp.zeros(v.shape[1:], jnp.float32) for k, v in snaps.items()},
        "pca_basis": {
            k: jnp.zeros((s.components, v.shape[1]), jnp.float32) for k, v in snaps.items()
        },
    }


def draw(state, cycle: int) -> np.random.Generator:
    """The generator of `cycle`'s random choice: keyed by the run's key, not host history."""
    return np.random.default_rng([*np.asarray(state.rng).tolist(), cycle])


@dataclasses.dataclass
class Timers:
    """Host seconds spent per part (for the overhead benchmark; not part of any decision)."""

    score: float = 0.0
    pca: float = 0.0
    surrogate: float = 0.0
    acquisition: float = 0.0


def acquire(s: Settings, chosen, scores, encodings, cycle: int, timers: Timers) -> tuple:
    """(choice, e per optimiser) at the encoding of `cycle`'s starting state."""
    start = time.perf_counter()
    rows = encodings[: cycle + 1].astype(np.float64)
    mean, scale = surrogate.standardise(rows)
    z = (rows - mean) / scale
    posts = []
    for j in range(s.num_optimizers):
        mine = np.flatnonzero(chosen[:cycle] == j)
        posts.append(surrogate.posterior(z[mine], scores[mine], z[cycle : cycle + 1]))
    mid = time.perf_counter()
    mu = np.array([m[0] for m, _ in posts])
    sd = np.array([d[0] for _, d in posts])
    e = 1.0 / (1.0 + np.exp(-(mu + kappa(s, cycle) * sd)))
    choice = int(np.argmax(e))
    timers.surrogate += mid - start
    timers.acquisition += time.perf_counter() - mid
    return choice, e


def doit_hook(s: Settings, timers: Timers | None = None):
    """The DOIT policy as `Method.hook(state, *, step)`."""
    timers = timers or Timers()

    def hook(state, *, step):
        i = step - 1  # the cycle that just ran
        t0 = time.perf_counter()
        extra = state.extra
        doit = dict(extra["doit"])
        small = jax.device_get(
            {k: doit[k] for k in ("chosen", "scores", "weights", "encodings")}
            | {"losses": extra[cycles.LOSSES], "ran": extra[cycles.PREVIOUS]}
        )
        chosen, scores = small["chosen"].copy(), small["scores"].copy()
        weights, encodings = small["weights"].copy(), small["encodings"].copy()
        j = int(small["ran"])
        value = score.cycle_score(small["losses"], s.alpha)
        chosen[i], scores[i] = j, value
        weights[j] = max((value + 1) / 2, s.w_min)
        t1 = time.perf_counter()
        timers.score += t1 - t0
        row, last_snapshot = i + 1, s.snapshot_rows - 1
        if row <= last_snapshot:
            doit["snapshots"] = encoding.record(
                doit["snapshots"], state.params, row, pattern=s.layers
            )
            if row == last_snapshot:
                host = jax.device_get(doit["snapshots"])
                means, bases = encoding.fit(host, row + 1, s.components)
                doit["pca_mean"], doit["pca_basis"] = means, bases
                encodings[: row + 1] = encoding.project_rows(host, row + 1, means, bases)
        else:
            encodings[row] = np.asarray(
                encoding.project(
                    state.params, doit["pca_mean"], doit["pca_basis"], pattern=s.layers
                )
            )
        timers.pca += time.perf_counter() - t1
        if row >= s.num_cycles:
            nxt = j  # the run is over; nothing left to choose
        elif row < s.n_ini:
            nxt = int(draw(state, row).choice(len(weights), p=weights / weights.sum()))
        else:
            nxt, _ = acquire(s, chosen, scores, encodings, row, timers)
        doit.update(chosen=chosen, scores=scores, weights=weights, encodings=encodings)
        new_extra = {**extra, "doit": doit, cycles.OPTIMIZER: np.int32(nxt)}
        return state.replace(extra=new_extra)

    return hook


def random_hook(num_optimizers: int):
    """Random switching: each cycle's optimiser drawn uniformly."""

    def hook(state, *, step):
        nxt = int(draw(state, step).integers(num_optimizers))
        return state.replace(extra={**state.extra, cycles.OPTIMIZER: np.int32(nxt)})

    return hook


def periodic_hook(num_optimizers: int):
    """Periodic switching: cycle c (0-based) runs optimiser c mod K (start at 0)."""

    def hook(state, *, step):
        nxt = step % num_optimizers
        return state.replace(extra={**state.extra, cycles.OPTIMIZER: np.int32(nxt)})

    return hook
