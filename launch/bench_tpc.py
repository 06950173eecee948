"""What evaluating every truncation at once saves, and what the early-exit cascade saves. (CPU;
no accelerator here.)

    python -m launch.bench_tpc          # B = 4096, N = 5, D in {384, 2048}, R in {16, 64, 256}
    python -m launch.bench_tpc --batch=1024 --dims=384 --ranks=16,64 --repeats=3
    python -m launch.bench_tpc --cascade_ranks=64 --train_rows=40000 --epochs=3 --out=/tmp/b.json

One process measures, each jitted, the median of `repeats` calls after a warm-up (every call
blocks on its result):
  1. probe evaluation throughput (examples/s) of all N truncations Y [B, N], per (D, R):
     (a) `poly_probe.op` with impl "auto": on CPU the jnp reference, which takes (b)'s form
         below rank `reference.PER_ORDER_MIN_RANK` and (c)'s from it on;
     (b) one matmul: every order's projection from one [B, D] x [D, (N - 1) R] product against
         all of U, then the float32 powers, lam and the cumulative sum: the Pallas kernel's
         formulation, here under XLA (2 dots with x . w1);
     (c) order by order: each order its own [B, D] x [D, R] projection against U[k], then its
         powers (N dots);
     (d) per truncation from scratch: for n = 1..N, P_{:n} recomputed with n matmuls, as the
         released code's cascade does at each stage: N (N + 1) / 2 matmuls, O(N^2) work. It is
         a `fori_loop` over n with a `lax.switch` on the truncation, because XLA's CSE merges
         the repeated matmuls of an unrolled loop (on CPU even through optimisation barriers);
     with each time's ratio to (a)'s, the number of dots in each compiled HLO (the structure
     each variant really has), the largest |difference| from (a), and the op's FLOP/s
     (2 B D (1 + (N - 1) R)) as a fraction of a plain jnp matmul's [B, D] x [D, 1 + (N - 1) R]
     timed in the same run.
  2. the cascade's saving: probes (N = 5, R = 16 and 256) trained order by order
     (`train.fit_progressive`, `epochs` per order) on the planted low-rank polynomial
     (`planted.splits`, D = 384), then on `rows` test rows, per tau in {0.8, 0.95, 0.99}: the
     exit-order distribution, F1, the cost fraction (mean parameters at exit over all N
     orders' parameters, the paper's measure), the fraction of the full matmul work the
     bucketed stages really compute (padded rows included), and the wall time of
     `cascade.cascade` (a host loop over jitted stages on buckets of active rows, 4 sizes per
     power of two) against the op on the same rows (all N truncations, no decisions), with
     the ratio. The cascade's first call (compiling its buckets) is reported apart.
On CPU the cascade pays a host round trip per stage (decide on the host, gather, dispatch, sync)
that the single op call does not: a parameter saving need not become a wall-time saving
here, and the report shows what was measured. R = 16 is the config's small size (each stage a
fraction of a millisecond, so the round trips weigh), R = 256 the paper's largest rank (the
stages' matmuls dominate).

Not measured: the Pallas kernel's time on a GPU or TPU (no accelerator was available).
"""

import contextlib
import io
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging

from configs import tpc as tpc_config
from core.kernels import poly_probe
from launch.timing import environment, median_seconds, write_json
from methods.tpc import cascade, model, planted
from methods.tpc import train as tpc_train

_HIGHEST = jax.lax.Precision.HIGHEST
VARIANTS = {
    "op": "(a) poly_probe.op",
    "one_matmul": "(b) one matmul for all orders",
    "order_by_order": "(c) a matmul per order",
    "per_truncation": "(d) per truncation",
    "matmul": "plain matmul [B,D]x[D,C]",
}
NOT_MEASURED = "Pallas kernel on GPU/TPU: NOT measured (no accelerator on this machine)"


# ------------------------------------------------------------------ 1. evaluation throughput


def _truncation(n: int, x_BD, w0, w1_D, U_KRD, lam_KR):
    """P_{:n} [B] from scratch: the linear term and orders 2..n, each from its own matmul."""
    y_B = jnp.dot(x_BD, w1_D, precision=_HIGHEST) + w0
    for k in range(2, n + 1):
        z_BR = jnp.dot(x_BD, U_KRD[k - 2].T, precision=_HIGHEST)
        y_B = y_B + jnp.sum(lam_KR[k - 2] * poly_probe.power(z_BR, k), axis=-1)
    return y_B


def _variants(N: int) -> dict:
    """name -> fn(x, w0, w1, U, lam) -> Y_BN (the matmul: its [B, C] product), unjitted."""

    def op(x, w0, w1, U, lam):
        return poly_probe.op(x, w0, w1, U, lam, impl="auto")

    def one_matmul(x, w0, w1, U, lam):
        Z_BKR = jnp.einsum("bd,krd->bkr", x, U, precision=_HIGHEST)
        terms = [jnp.dot(x, w1, precision=_HIGHEST) + w0]
        for k in range(2, N + 1):
            terms.append(jnp.sum(lam[k - 2] * poly_probe.power(Z_BKR[:, k - 2], k), axis=-1))
        return jnp.cumsum(jnp.stack(terms, axis=1), axis=1)

    def order_by_order(x, w0, w1, U, lam):
        terms = [jnp.dot(x, w1, precision=_HIGHEST) + w0]
        for k in range(2, N + 1):
            z_BR = jnp.dot(x, U[k - 2].T, precision=_HIGHEST)
            terms.append(jnp.sum(lam[k - 2] * poly_probe.power(z_BR, k), axis=-1))
        return jnp.cumsum(jnp.stack(terms, axis=1), axis=1)

    def per_truncation(x, w0, w1, U, lam):
        branches = [lambda ops, n=n: _truncation(n, *ops) for n in range(1, N + 1)]

        def body(i, Y_BN):
            return Y_BN.at[:, i].set(jax.lax.switch(i, branches, (x, w0, w1, U, lam)))

        return jax.lax.fori_loop(0, N, body, jnp.zeros((x.shape[0], N), jnp.float32))

    def matmul(x, W_CD):
        return jnp.einsum("bd,cd->bc", x, W_CD, precision=_HIGHEST)

    return {
        "op": op,
        "one_matmul": one_matmul,
        "order_by_order": order_by_order,
        "per_truncation": per_truncation,
        "matmul": matmul,
    }


def _probe_arrays(B: int, D: int, N: int, R: int, seed: int):
    rng = np.random.default_rng(seed)
    x_BD = jnp.asarray(rng.standard_normal((B, D), np.float32))
    w1_D = rng.standard_normal(D).astype(np.float32) / np.sqrt(D)
    p = model.init_params(D, N, R, jax.random.PRNGKey(seed), linear=(0.1, w1_D), lam_std=0.1)
    return x_BD, p["w0"], p["w1"], p["U"], p["lam"]


def throughput_shape(B: int, D: int, N: int, R: int, repeats: int, seed: int = 0) -> dict:
    """Section 1 for one (D, R)."""
    args = _probe_arrays(B, D, N, R, seed)
    x_BD, _, w1_D, U_KRD, _ = args
    W_CD = jnp.concatenate([w1_D[None], U_KRD.reshape(-1, D)])
    C = W_CD.shape[0]
    flops = 2 * B * D * C
    seconds, dots, outputs = {}, {}, {}
    for name, fn in _variants(N).items():
        call_args = (x_BD, W_CD) if name == "matmul" else args
        compiled = jax.jit(fn).lower(*call_args).compile()
        dots[name] = compiled.as_text().count(" dot(")
        outputs[name] = np.asarray(compiled(*call_args))
        seconds[name] = median_seconds(
            lambda f=compiled, a=call_args: jax.block_until_ready(f(*a)), repeats
        )
    Y_BN = outputs["op"]
    scale = float(np.abs(Y_BN).max())
    return {
        "D": D,
        "R": R,
        "C": C,
        "flops": flops,
        "seconds": seconds,
        "examples_per_second": {name: B / t for name, t in seconds.items()},
        "hlo_dots": dots,
        "max_abs_diff_vs_op": {
            name: float(np.abs(outputs[name] - Y_BN).max())
            for name in ("one_matmul", "order_by_order", "per_truncation")
        },
        "max_abs_op": scale,
        **{
            f"ratio_{name}_over_op": seconds[name] / seconds["op"]
            for name in ("one_matmul", "order_by_order", "per_truncation")
        },
        "op_gflops_per_second": flops / seconds["op"] / 1e9,
        "matmul_gflops_per_second": flops / seconds["matmul"] / 1e9,
        "op_fraction_of_matmul": seconds["matmul"] / seconds["op"],
    }


def throughput(
    B: int = 4096, N: int = 5, dims=(384, 2048), ranks=(16, 64, 256), repeats: int = 10
) -> dict:
    shapes = [throughput_shape(B, D, N, R, repeats) for D in dims for R in ranks]
    return {"B": B, "N": N, "repeats": repeats, "shapes": shapes}


# ------------------------------------------------------------------------ 2. the cascade


def train_probe(D: int, N: int, R: int, train_rows: int, rows: int, epochs: int, seed: int = 0):
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


def stage_rows(exit_B: np.ndarray, N: int) -> list[int]:
    """[N]: the rows stage k evaluates (every row at k = 1; those not exited before k)."""
    return [int(np.sum(exit_B >= k)) for k in range(1, N + 1)]


def cascade_saving(
    D: int = 384,
    N: int = 5,
    R: int = 16,
    train_rows: int = 40000,
    rows: int = 4096,
    epochs: int = 3,
    taus=(0.8, 0.95, 0.99),
    repeats: int = 10,
    seed: int = 0,
) -> dict:
    s, params, train_seconds = train_probe(D, N, R, train_rows, rows, epochs, seed)
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
        active_N = stage_rows(r.exit_order, N)
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


# ------------------------------------------------------------------------------- report


def _cascade_lines(c: dict) -> list[str]:
    lines = [
        f"   R={c['R']}: trained in {c['train_seconds']:.1f} s; test F1 by truncation order "
        + " ".join(f"{f:.3f}" for f in c["test_f1_by_order"])
        + f"; all {c['N']} orders by the op: {1e3 * c['full_seconds']:.2f} ms",
        f"{'tau':>7} {'F1':>6} {'exit fraction by order 1..N':>34} {'cost':>6} {'work':>6} "
        f"{'cascade':>10} {'x full':>7} {'1st call':>9}",
    ]
    for r in c["taus"]:
        fractions = " ".join(f"{f:.3f}" for f in r["exit_fraction"])
        lines.append(
            f"{r['tau']:>7.2f} {r['f1']:>6.3f} {fractions:>34} {r['cost_fraction']:>6.3f} "
            f"{r['work_fraction_padded']:>6.3f} {1e3 * r['cascade_seconds']:>8.2f}ms "
            f"x{r['time_ratio_cascade_over_full']:<6.2f} "
            f"{1e3 * r['cascade_first_call_seconds']:>7.0f}ms"
        )
    return lines


def report_lines(result: dict) -> list[str]:
    e, t, probes = result["environment"], result["throughput"], result["cascade"]
    lines = [
        f"TPC probe on {e['backend']} ({e['device_kind']}, {e['host_cpu_count']} cores, load "
        f"{e['load_avg_1m']}), jax {e['jax_version']}; medians of {t['repeats']} after warm-up",
        f"1. all N={t['N']} truncations of B={t['B']} rows, examples/s (x: time over (a)); "
        "dots: in the compiled HLO",
        f"{'D':>5} {'R':>4} {'(a) op':>11} {'(b) one matmul':>18} {'(c) per order':>18} "
        f"{'(d) per trunc.':>18} {'dots a/b/c/d':>13} {'(a) GFLOP/s':>12} {'matmul':>8} "
        f"{'(a)/matmul':>11}",
    ]
    for r in t["shapes"]:
        ex, d = r["examples_per_second"], r["hlo_dots"]
        lines.append(
            f"{r['D']:>5} {r['R']:>4} {ex['op']:>11.0f} "
            f"{ex['one_matmul']:>10.0f} x{r['ratio_one_matmul_over_op']:<6.2f}"
            f"{ex['order_by_order']:>11.0f} x{r['ratio_order_by_order_over_op']:<6.2f}"
            f"{ex['per_truncation']:>11.0f} x{r['ratio_per_truncation_over_op']:<6.2f}"
            f"{d['op']:>5}/{d['one_matmul']}/{d['order_by_order']}/{d['per_truncation']:<3}"
            f"{r['op_gflops_per_second']:>12.1f} {r['matmul_gflops_per_second']:>8.1f} "
            f"{r['op_fraction_of_matmul']:>11.2f}"
        )
    worst = max(max(r["max_abs_diff_vs_op"].values()) / r["max_abs_op"] for r in t["shapes"])
    c = probes[0]
    lines += [
        f"   (b), (c) and (d) equal (a) to {worst:.1e} of max |Y|. (a)/matmul: the op's FLOP/s "
        "over a plain [B,D]x[D,1+(N-1)R] matmul's, same run.",
        f"2. cascade: probes D={c['D']} N={c['N']} trained progressively on the planted "
        f"polynomial ({c['train_rows']} rows, {c['epochs_per_order']} epochs/order), on "
        f"{c['rows']} test rows; medians of {c['repeats']}",
    ]
    for c in probes:
        lines += _cascade_lines(c)
    lines += [
        "   cost: mean params at exit / full params (the paper's measure); work: matmul rows x "
        "columns the bucketed stages compute / the full op's; x full: cascade time / the op's.",
        "   On CPU each cascade stage is a host round trip (decide, gather, dispatch, sync) that "
        "the one op call avoids: the measured ratio, not the cost fraction, is the saving here.",
        result["not_measured"],
    ]
    return lines


def _ints(text: str) -> tuple:
    return tuple(int(v) for v in text.split(",") if v)


def define_flags() -> None:
    """Called only when run as a script: absl refuses a flag defined twice, and the tests import
    several benchmarks into one process."""
    flags.DEFINE_integer("batch", 4096, "B of the throughput comparison")
    flags.DEFINE_integer("order", 5, "N (every section)")
    flags.DEFINE_string("dims", "384,2048", "D values of the throughput comparison")
    flags.DEFINE_string("ranks", "16,64,256", "R values of the throughput comparison")
    flags.DEFINE_integer("repeats", 10, "Timed calls per function, after one warm-up.")
    flags.DEFINE_integer("cascade_dim", 384, "D of the planted data the cascade's probe sees")
    flags.DEFINE_string("cascade_ranks", "16,256", "R of each probe the cascade runs")
    flags.DEFINE_integer("train_rows", 40000, "planted training rows")
    flags.DEFINE_integer("epochs", 3, "epochs per order")
    flags.DEFINE_integer("rows", 4096, "test rows the cascade and the full op evaluate")
    flags.DEFINE_string("taus", "0.8,0.95,0.99", "cascade thresholds")
    flags.DEFINE_string("out", "results/bench_tpc.json", "Where the JSON report goes.")


def main(argv):
    del argv
    FLAGS = flags.FLAGS
    logging.set_verbosity(logging.WARNING)  # orbax's INFO lines from the probe's training run
    result = {
        "environment": environment(),
        "throughput": throughput(
            FLAGS.batch, FLAGS.order, _ints(FLAGS.dims), _ints(FLAGS.ranks), FLAGS.repeats
        ),
        "cascade": [
            cascade_saving(
                FLAGS.cascade_dim,
                FLAGS.order,
                R,
                FLAGS.train_rows,
                FLAGS.rows,
                FLAGS.epochs,
                tuple(float(v) for v in FLAGS.taus.split(",")),
                repeats=2 * FLAGS.repeats,
            )
            for R in _ints(FLAGS.cascade_ranks)
        ],
        "pallas_kernel_accelerator_timing": None,
        "not_measured": NOT_MEASURED,
    }
    print("\n".join(report_lines(result)))
    write_json(result, FLAGS.out)
    print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
