"""What the early-exit cascade saves on a trained probe, in wall time, against the full op.

    python -m launch.bench --methods=tpc --kernels=poly_probe

One process trains probes (N = 5, R = 16 and 256) order by order (`train.fit_progressive`,
`epochs` per order) on the planted low-rank polynomial (`planted.splits`, D = 384), then on
`rows` test rows, per tau in {0.8, 0.95, 0.99}, measures the exit-order distribution, F1, the
cost fraction (mean parameters at exit over all N orders' parameters, the paper's measure), the
fraction of the full matmul work the bucketed stages really compute (padded rows included), and
the wall time of `cascade.cascade` (a host loop over jitted stages on buckets of active rows, 4
sizes per power of two) against the op on the same rows (all N truncations, no decisions), the
median of `repeats` calls after a warm-up. The cascade's first call (compiling its buckets) is
reported apart. Figures: cascade time / full op time, and mean parameters / full parameters.

On CPU the cascade pays a host round trip per stage (decide on the host, gather, dispatch, sync)
that the single op call does not: a parameter saving need not become a wall-time saving here.
R = 16 is the config's small size (each stage a fraction of a millisecond, so the round trips
weigh), R = 256 the paper's largest rank (the stages' matmuls dominate). Evaluating every
truncation at once against recomputing each: `core/kernels/poly_probe/bench.py`.
"""

import contextlib
import io
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from configs import tpc as tpc_config
from core.benchmark import Ratio, Result, median_seconds
from methods.tpc import cascade, model, planted
from methods.tpc import train as tpc_train


def _train_probe(D: int, N: int, R: int, train_rows: int, rows: int, epochs: int, seed: int = 0):
    """(splits, params, train seconds): `fit_progressive` on the planted polynomial (rank 2,
    orders 2 and 3) with `epochs` per order; its step log is swallowed (the report has F1)."""
    s = planted.splits(D, n_train=train_rows, n_val=max(rows // 4, 64), n_test=rows, seed=seed)
    config = tpc_config.get_config("mesh=cpu,size=small,dataset=planted")
    config.model.order, config.model.rank = N, R
    config.train.checkpoint_every = 0
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as workdir, contextlib.redirect_stdout(io.StringIO()):
        fit = tpc_train.fit_progressive(
            config, s, workdir, epochs=epochs, devices=jax.devices()[:1]
        )
    return s, fit.params, time.perf_counter() - start


def _stage_rows(exit_B: np.ndarray, N: int) -> list[int]:
    """[N]: the rows stage k evaluates (every row at k = 1; those not exited before k)."""
    return [int(np.sum(exit_B >= k)) for k in range(1, N + 1)]


def _cascade_saving(
    D: int,
    N: int,
    R: int,
    train_rows: int,
    rows: int,
    epochs: int,
    taus=(0.8, 0.95, 0.99),
    repeats: int = 10,
    seed: int = 0,
) -> dict:
    """One probe's figures: trained, then the cascade at each tau against the full op."""
    s, params, train_seconds = _train_probe(D, N, R, train_rows, rows, epochs, seed)
    x_BD = jnp.asarray(s.x_test)  # on the device once, for both sides
    B = x_BD.shape[0]
    device_params = {k: jnp.asarray(v, jnp.float32) for k, v in params.items()}
    counts_N = model.param_counts(D, N, R)
    full_op = jax.jit(lambda p, x: model.logits(p, x))
    Y_BN = np.asarray(full_op(device_params, x_BD))
    full_seconds = median_seconds(
        lambda: jax.block_until_ready(full_op(device_params, x_BD)), repeats
    )
    out = {
        "D": D,
        "N": N,
        "R": R,
        "train_rows": train_rows,
        "epochs_per_order": epochs,
        "train_seconds": train_seconds,
        "rows": B,
        "test_f1_by_order": [model.f1_score(s.y_test, Y_BN[:, n]) for n in range(N)],
        "full_params": int(counts_N[-1]),
        "full_seconds": full_seconds,
        "repeats": repeats,
        "taus": [],
    }
    for tau in taus:
        run = lambda tau=tau: cascade.cascade(device_params, x_BD, s.y_test, tau)
        start = time.perf_counter()
        r = run()
        first = time.perf_counter() - start
        seconds = median_seconds(run, repeats)  # the cascade syncs on the host every stage
        active_N = _stage_rows(r.exit_order, N)
        computed_N = [B] + [cascade.bucket(n, B) if n else 0 for n in active_N[1:]]
        work = (computed_N[0] + R * sum(computed_N[1:])) / (B * (1 + (N - 1) * R))
        out["taus"].append(
            {
                "tau": tau,
                "f1": r.f1,
                "exit_fraction": [float(f) for f in r.exit_fraction],
                "mean_exit_order": r.mean_exit_order,
                "mean_params": r.mean_params,
                "cost_fraction": r.mean_params / counts_N[-1],
                "stage_rows": active_N,
                "stage_bucket_rows": computed_N,
                "work_fraction_padded": work,
                "cascade_first_call_seconds": first,
                "cascade_seconds": seconds,
                "full_seconds": full_seconds,
                "time_ratio_cascade_over_full": seconds / full_seconds,
            }
        )
    return out


def measure(*, smoke: bool = False) -> Result:
    if smoke:
        kw = dict(D=16, N=3, train_rows=512, rows=256, epochs=1, taus=(0.6, 0.9), repeats=1)
        ranks = (4,)
    else:
        kw = dict(D=384, N=5, train_rows=40000, rows=4096, epochs=3, repeats=60)
        ranks = (16, 256)
    probes = [_cascade_saving(R=R, **kw) for R in ranks]
    ratios = []
    for c in probes:
        size = f"D={c['D']} N={c['N']} R={c['R']}, {c['rows']} rows"
        for r in c["taus"]:
            ratios.append(
                Ratio(
                    f"cascade at tau={r['tau']:g} vs all truncations, time, {size}",
                    "cascade",
                    r["cascade_seconds"],
                    "op (all N orders)",
                    r["full_seconds"],
                    "s",
                )
            )
            ratios.append(
                Ratio(
                    f"cascade at tau={r['tau']:g}, parameters used (the paper's cost), {size}",
                    "mean at exit",
                    r["mean_params"],
                    "all N orders",
                    c["full_params"],
                    "params",
                )
            )
    return Result(ratios, {"cascade": probes})
