"""How fast is the jitted learner, and how does a round's cost grow with t?

    python -m launch.bench --methods=hybrid_online          # T = 400; t up to 2000
    python -m launch.bench --methods=hybrid_online --smoke  # seconds

One process, float64 (as the experiment), one device:
1. rounds/s of FTRL-FW over the same T rounds (x_t ~ U[0, 1], oblivious random thresholds,
   squared loss): the jitted `learner.step` in one `lax.scan` vs `reference.Reference`, the
   same algorithm in NumPy (sorting its samples each round). Both make the same oracle calls.
2. the cost of one round's Frank-Wolfe solve at t stored samples (buffers of size t, weights
   from t random rounds): seconds per round and per oracle call, and the fitted log-log slopes
   in t. With the two-weight bookkeeping an oracle call (gradient + cumulative sum) is O(t),
   so per call the slope is about 1 (it would be 2 if the objective re-summed the O(t^2)
   (round, sample) pairs); the calls per round grow too (about t at this tolerance), so a
   round costs about t^2.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

from core.benchmark import Ratio, Result, machine, median_seconds
from methods.hybrid_online import learner as ftrl
from methods.hybrid_online import reference
from methods.hybrid_online.classes import Label


def random_rounds(T: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(size=T)
    lo, flip = rng.uniform(size=T), rng.integers(0, 2, T)
    return x, lo, flip


def jax_rounds(T: int, loss: str):
    s = ftrl.settings(T, loss=loss)

    @jax.jit
    def run(x_T, lo_T, flip_T):
        def body(state, inputs):
            x, lo, flip = inputs
            state, (p, _, solution) = ftrl.step(state, x, Label(lo, jnp.inf, flip), s)
            return state, (p, solution.calls)

        return jax.lax.scan(body, ftrl.init(T, jnp.float64), (x_T, lo_T, flip_T))[1]

    return run


def buffer_of(t: int, seed: int = 1) -> ftrl.Buffer:
    """A buffer of t samples after t random rounds (no Frank-Wolfe: weights only)."""
    x, lo, flip = random_rounds(t, seed)

    def body(buffer, inputs):
        x, lo, flip = inputs
        return ftrl.add_round(buffer, x, Label(lo, jnp.inf, flip))[0], None

    inputs = (jnp.asarray(x), jnp.asarray(lo), jnp.asarray(flip))
    return jax.jit(lambda: jax.lax.scan(body, ftrl.empty_buffer(t, jnp.float64), inputs)[0])()


def slope(t, seconds) -> float:
    return float(np.polyfit(np.log(t), np.log(seconds), 1)[0])


def measure(*, smoke: bool = False) -> Result:
    T, sizes, repeats = (60, (50, 100, 200), 2) if smoke else (400, (250, 500, 1000, 2000), 3)
    loss = "squared"
    with jax.enable_x64(True):
        x, lo, flip = random_rounds(T)
        run = jax_rounds(T, loss)
        args = (jnp.asarray(x), jnp.asarray(lo), jnp.asarray(flip))
        jax_s = median_seconds(lambda: jax.block_until_ready(run(*args)), repeats)
        predictions, calls = jax.device_get(run(*args))

        ref = reference.Reference(T, loss=loss)
        start = time.perf_counter()
        ref_out = [ref.round(x[t], (lo[t], np.inf, flip[t])) for t in range(T)]
        numpy_s = time.perf_counter() - start
        same = float(np.max(np.abs(predictions - np.array([r[0] for r in ref_out]))))

        per_round, per_call, calls_at = [], [], []
        for t in sizes:
            buffer = buffer_of(t)
            s = ftrl.settings(t, loss=loss)
            solve = jax.jit(lambda b, s=s: ftrl.frank_wolfe(b, s))
            seconds = median_seconds(
                lambda solve=solve, buffer=buffer: jax.block_until_ready(solve(buffer)), repeats
            )
            n_calls = int(solve(buffer).calls)
            per_round.append(seconds)
            per_call.append(seconds / n_calls)
            calls_at.append(n_calls)

    ratios = [
        Ratio(
            f"FTRL-FW rounds/s over T={T} rounds (thresholds, squared loss, float64)",
            "jitted step in one lax.scan",
            T / jax_s,
            "NumPy reference",
            T / numpy_s,
            "rounds/s",
        ),
        Ratio(
            f"one round's Frank-Wolfe at t={sizes[-1]} vs t={sizes[0]} stored samples",
            f"t={sizes[-1]} ({calls_at[-1]} oracle calls)",
            per_round[-1],
            f"t={sizes[0]} ({calls_at[0]} calls)",
            per_round[0],
            "s",
        ),
        Ratio(
            f"one oracle call (gradient + cumulative sum) at t={sizes[-1]} vs t={sizes[0]}",
            f"t={sizes[-1]}",
            per_call[-1],
            f"t={sizes[0]}",
            per_call[0],
            "s",
        ),
    ]
    details = {
        "T": T,
        "loss": loss,
        "jax_seconds": jax_s,
        "numpy_seconds": numpy_s,
        "oracle_calls": int(np.sum(calls)),
        "numpy_oracle_calls": int(sum(r[3] for r in ref_out)),
        "max_prediction_difference": same,
        "sizes": list(sizes),
        "seconds_per_round": per_round,
        "seconds_per_call": per_call,
        "calls_per_round": calls_at,
        "slope_per_round": slope(sizes, per_round),
        "slope_per_call": slope(sizes, per_call),
        "slope_calls": slope(sizes, calls_at),
        "machine": machine(),
    }
    notes = [
        f"cost vs t: per round ~ t^{details['slope_per_round']:.2f}, per oracle call ~ "
        f"t^{details['slope_per_call']:.2f}, calls per round ~ t^{details['slope_calls']:.2f}"
    ]
    return Result(ratios, details, notes)
