"""How much does selective rotary cost over plain RoPE? (CPU, the jnp reference path.)

    python -m launch.bench_selective_rotary                   # B=8, T=512, H=8, K=64
    python -m launch.bench_selective_rotary --seq=2048 --repeats=50

One process times, at the same sizes and dtype, each jitted, as the median of `repeats` calls
after a warm-up (every call blocks on its result):
  1. forward: `core.nn.positions.rope` on q and k vs `op(..., impl="xla")` (selective rotary:
     cumsum of phi, angle, rotation of q and k, final_state);
  2. forward + backward: the vjp to (q, k) for RoPE vs to (q, k, phi) for selective rotary
     (phi's gradient, a reverse cumsum, is part of the method's cost);
and prints the overhead ratios. It also reports the forward's effective bandwidth over the
minimum traffic (read q, k, phi; write q', k'), for context only: on CPU this is cache- and
core-bound, not a statement about HBM.

Not measured here: the Pallas kernel's GPU/TPU time and its fraction of memory bandwidth (this
machine has no accelerator; the kernel ran only in interpret mode and was lowered, not
compiled).

3. a whole train step (loss + gradient) of the paper's two small models (1-layer GLA and 1-layer
   softmax transformer from `methods.selective_rope`) with selective rotary vs RoPE, at matched
   parameter counts.
"""

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from core.kernels.selective_rotary import op
from core.nn.positions import rope
from launch.timing import environment, median_seconds, write_json

NOT_MEASURED = (
    "Pallas kernel on GPU/TPU: time and memory-bandwidth fraction NOT measured "
    "(no accelerator on this machine; the kernel was only interpreted and lowered)"
)


def _inputs(B, T, H, K, dtype):
    rng = np.random.default_rng(0)
    R = K // 2
    x = lambda *shape: jnp.asarray(rng.standard_normal(shape, np.float32), dtype)
    return {
        "q": x(B, T, H, K),
        "k": x(B, T, H, K),
        "phi": jnp.asarray(rng.uniform(size=(B, T, H, R)), jnp.float32),
        "temp": 10000.0 ** (-2.0 * jnp.arange(R, dtype=jnp.float32) / K),
        "pos": jnp.broadcast_to(jnp.arange(1, T + 1), (B, T)),
        "gq": x(B, T, H, K),
        "gk": x(B, T, H, K),
    }


def _functions():
    """name -> (jitted fn, argument names). Both methods see q, k and their cotangents."""

    def rope_fwd(q, k, pos):
        return rope(q, pos), rope(k, pos)

    def srope_fwd(q, k, phi, temp):
        return op(q, k, phi, temp, impl="xla")

    def rope_fwd_bwd(q, k, pos, gq, gk):
        _, vjp = jax.vjp(lambda q, k: rope_fwd(q, k, pos), q, k)
        return vjp((gq, gk))

    def srope_fwd_bwd(q, k, phi, temp, gq, gk):
        _, vjp = jax.vjp(lambda q, k, phi: srope_fwd(q, k, phi, temp)[:2], q, k, phi)
        return vjp((gq, gk))

    return {
        "rope_fwd": (jax.jit(rope_fwd), ("q", "k", "pos")),
        "selective_fwd": (jax.jit(srope_fwd), ("q", "k", "phi", "temp")),
        "rope_fwd_bwd": (jax.jit(rope_fwd_bwd), ("q", "k", "pos", "gq", "gk")),
        "selective_fwd_bwd": (
            jax.jit(srope_fwd_bwd),
            ("q", "k", "phi", "temp", "gq", "gk"),
        ),
    }


def measure(B=8, T=512, H=8, K=64, *, dtype="float32", repeats=20) -> dict:
    data = _inputs(B, T, H, K, jnp.dtype(dtype))
    seconds = {}
    for name, (fn, arg_names) in _functions().items():
        args = [data[a] for a in arg_names]
        seconds[name] = median_seconds(
            lambda fn=fn, args=args: jax.block_until_ready(fn(*args)), repeats
        )
    itemsize = jnp.dtype(dtype).itemsize
    qk_bytes = 2 * B * T * H * K * itemsize
    min_bytes = 2 * qk_bytes + B * T * H * (K // 2) * 4  # q, k in and out; phi (f32) in
    return {
        **environment(),
        "sizes": {"B": B, "T": T, "H": H, "K": K, "dtype": dtype},
        "repeats": repeats,
        "impl": "xla (jnp reference)",
        "seconds": seconds,
        "overhead_fwd": seconds["selective_fwd"] / seconds["rope_fwd"],
        "overhead_fwd_bwd": seconds["selective_fwd_bwd"] / seconds["rope_fwd_bwd"],
        "selective_fwd_min_bytes": min_bytes,
        "selective_fwd_effective_GBps": min_bytes / seconds["selective_fwd"] / 1e9,
        "pallas_kernel_accelerator_timing": None,
        "pallas_kernel_bandwidth_fraction": None,
        "not_measured": NOT_MEASURED,
    }


def model_steps(B=64, T=128, *, repeats=10) -> dict:
    """Seconds per jitted train step (loss + gradient) of each small model of
    `methods.selective_rope` with selective rotary vs RoPE at matched parameter counts."""
    from methods.selective_rope import loss_fn
    from methods.selective_rope.model import ModelConfig, init_params, matched

    rng = np.random.default_rng(0)
    batch = {
        "inputs": jnp.asarray(rng.integers(1, 3, (B, T)), jnp.int32),
        "targets": jnp.asarray(rng.integers(1, 3, (B, T)), jnp.int32),
        "mask": jnp.ones((B, T), jnp.float32),
    }
    out = {}
    for arch in ("gla", "transformer"):
        seconds = {}
        for position in ("rope", "selective"):
            cfg = matched(ModelConfig(vocab_size=3, num_classes=3, model=arch, position=position))
            params = init_params(cfg, jax.random.PRNGKey(0))
            grad = jax.jit(jax.grad(lambda p, cfg=cfg: loss_fn(cfg, p, batch)[0]))
            seconds[position] = median_seconds(
                lambda grad=grad, params=params: jax.block_until_ready(grad(params)), repeats
            )
        out[arch] = {**seconds, "overhead": seconds["selective"] / seconds["rope"]}
    return {"sizes": {"B": B, "T": T}, "repeats": repeats, "seconds_per_step": out}


def report_lines(r: dict) -> list[str]:
    s, z = r["seconds"], r["sizes"]
    ms = lambda x: f"{1e3 * x:8.3f} ms"
    return [
        f"selective rotary vs RoPE on {r['backend']} ({r['device_kind']}, "
        f"{r['host_cpu_count']} cores, load {r['load_avg_1m']}), jax {r['jax_version']}",
        f"B={z['B']} T={z['T']} H={z['H']} K={z['K']} {z['dtype']}; "
        f"median of {r['repeats']} after warm-up; impl={r['impl']}",
        f"  forward        RoPE {ms(s['rope_fwd'])}   selective {ms(s['selective_fwd'])}"
        f"   overhead x{r['overhead_fwd']:.2f}",
        f"  fwd + bwd      RoPE {ms(s['rope_fwd_bwd'])}   selective {ms(s['selective_fwd_bwd'])}"
        f"   overhead x{r['overhead_fwd_bwd']:.2f}",
        f"  selective fwd: {r['selective_fwd_min_bytes'] / 1e6:.1f} MB minimum traffic, "
        f"{r['selective_fwd_effective_GBps']:.2f} GB/s effective (CPU, context only)",
        f"  {r['not_measured']}",
    ]


def model_report_lines(m: dict) -> list[str]:
    z = m["sizes"]
    lines = [f"train step (loss + grad), B={z['B']} T={z['T']}, matched parameter counts:"]
    for arch, s in m["seconds_per_step"].items():
        lines.append(
            f"  {arch:<12} RoPE {1e3 * s['rope']:8.2f} ms   selective "
            f"{1e3 * s['selective']:8.2f} ms   overhead x{s['overhead']:.2f}"
        )
    return lines


def define_flags() -> None:
    """Called only when run as a script: absl refuses a flag defined twice, and the tests import
    several benchmarks into one process."""
    flags.DEFINE_integer("batch", 8, "B")
    flags.DEFINE_integer("seq", 512, "T")
    flags.DEFINE_integer("heads", 8, "H")
    flags.DEFINE_integer("head_dim", 64, "K (even)")
    flags.DEFINE_string("dtype", "float32", "q/k dtype")
    flags.DEFINE_integer("repeats", 20, "Timed calls per function, after one warm-up.")
    flags.DEFINE_string("out", "results/bench_selective_rotary.json", "Where the JSON report goes.")


def main(argv):
    del argv
    FLAGS = flags.FLAGS
    result = measure(
        FLAGS.batch,
        FLAGS.seq,
        FLAGS.heads,
        FLAGS.head_dim,
        dtype=FLAGS.dtype,
        repeats=FLAGS.repeats,
    )
    result["model_steps"] = model_steps(repeats=max(FLAGS.repeats // 2, 3))
    print("\n".join(report_lines(result) + model_report_lines(result["model_steps"])))
    write_json(result, FLAGS.out)
    print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
