"""What the fused NAB encoder saves, and how fast NAB trains. (CPU; no accelerator here.)

    python -m launch.bench_nab                    # 256 x 256 pixels, M = 456 bins, F = 256
    python -m launch.bench_nab --size=128 --repeats=5

One process measures, each jitted, the median of `repeats` calls after a warm-up:
  1. the first layer z = encode(coords, bins) @ W1 + b1, forward and forward + backward (to the
     bins, W1 and b1), by the jnp reference (`impl="xla"`, which materialises the N x M
     features), by the kernel's tile code scanned over pixel tiles (`impl="tiled"`, what
     "auto" runs on CPU) and by the fused Pallas kernel run by the Pallas interpreter
     (`impl="interpret"`: its time is the interpreter's, not a kernel's), with the ratio of
     the reference's time to "tiled"'s;
  2. XLA's compiled memory analysis of each (temporary bytes: the reference's includes the
     N x M feature matrix and its tanh terms, the kernel's only tiles), and the size of the
     N x M float32 matrix for scale;
  3. training steps per second of the NAB INR (encoder "tiled", and the reference's autodiff)
     and the RFF INR (`configs/nab.py`, sizes small and paper: 64^2 and 128^2) on one CPU
     device.

Not measured: the Pallas kernel's time on a GPU or TPU (no accelerator was available).
"""

import functools
import time

import jax
import jax.numpy as jnp
from absl import app, flags

from configs import nab as nab_config
from core import train
from core.kernels import binned_encoding
from launch.timing import median_seconds, write_json
from methods import nab
from methods.nab import model

IMPLS = {"xla": "reference (jnp)", "tiled": "tiled (lax.scan)", "interpret": "fused, interpreted"}
NOT_MEASURED = "Pallas kernel on GPU/TPU: NOT measured (no accelerator on this machine)"


def _layer_inputs(size: int, M: int, F: int):
    cfg = model.ModelConfig(size=size, num_features=M, hidden=F)
    params, frozen = model.init_params(cfg, jax.random.PRNGKey(0))
    bins = binned_encoding.Bins(**model.bins_of(params, frozen))
    layer = params["mlp"][0]
    return jnp.asarray(model.pixel_coords(size)), bins, layer["w"], layer["b"]


def first_layer(size: int = 256, M: int = 456, F: int = 256, repeats: int = 3) -> dict:
    coords, bins, w1, b1 = _layer_inputs(size, M, F)
    out = {"pixels": size * size, "bins": M, "width": F, "features_bytes": size * size * M * 4}
    for impl in IMPLS:
        fwd = jax.jit(functools.partial(binned_encoding.op, impl=impl))
        loss = lambda b, w, c, i=impl: jnp.sum(binned_encoding.op(coords, b, w, c, impl=i) ** 2)
        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        for name, fn, args in (
            ("fwd", fwd, (coords, bins, w1, b1)),
            ("fwd_bwd", grad, (bins, w1, b1)),
        ):
            compiled = fn.lower(*args).compile()
            memory = compiled.memory_analysis()
            out[f"{impl}_{name}_temp_bytes"] = int(memory.temp_size_in_bytes) if memory else None
            out[f"{impl}_{name}_seconds"] = median_seconds(
                lambda f=compiled, a=args: jax.block_until_ready(f(*a)), repeats
            )
    return out


def train_rates(sizes=("small", "paper"), steps: int = 10) -> dict:
    """Steps per second of `steps` training steps after compilation, per (size, encoder)."""
    out = {}
    for size in sizes:
        for encoder in ("nab", "nab-xla", "rff"):
            config = nab_config.get_config(f"size={size},encoding={encoder[:3]}")
            config.model.impl = "xla" if encoder == "nab-xla" else "auto"
            session = train.init(config, nab.make(config), devices=jax.devices()[:1])
            state, batch = session.state, session.next_batch()
            state, metrics = session.step(state, batch)  # compile
            jax.block_until_ready(metrics)
            start = time.perf_counter()
            for _ in range(steps):  # the step donates its state: thread it through
                state, metrics = session.step(state, batch)
            jax.block_until_ready(metrics)
            seconds = (time.perf_counter() - start) / steps
            out[f"{size}/{encoder}"] = {
                "image": config.model.size,
                "steps_per_second": 1 / seconds,
            }
    return out


def report_lines(layer: dict, rates: dict) -> list[str]:
    mb = lambda b: f"{b / 2**20:8.1f} MB" if b is not None else "     n/a"
    lines = [
        f"first layer at {layer['pixels']} pixels, M={layer['bins']}, F={layer['width']} "
        f"(N x M float32 features: {mb(layer['features_bytes'])})",
        f"{'':<28}{'time':>12}{'XLA temp memory':>18}",
    ]
    for impl, label in IMPLS.items():
        for name in ("fwd", "fwd_bwd"):
            t, temp = layer[f"{impl}_{name}_seconds"], layer[f"{impl}_{name}_temp_bytes"]
            lines.append(f"{label + ' ' + name:<28}{t * 1e3:>10.1f}ms{mb(temp):>18}")
    for name in ("fwd", "fwd_bwd"):
        ratio = layer[f"xla_{name}_seconds"] / layer[f"tiled_{name}_seconds"]
        lines.append(f"reference / tiled time, {name}: x{ratio:.2f}")
    lines.append("training steps per second (one CPU device):")
    for key, r in rates.items():
        lines.append(f"  {key:<16} {r['image']:>4}^2 pixels  {r['steps_per_second']:7.2f} steps/s")
    lines.append(NOT_MEASURED)
    return lines


def define_flags() -> None:
    """Called only when run as a script: absl refuses a flag defined twice, and the tests import
    several benchmarks into one process."""
    flags.DEFINE_integer("size", 256, "image side of the first-layer comparison")
    flags.DEFINE_integer("bins", 456, "M")
    flags.DEFINE_integer("width", 256, "F")
    flags.DEFINE_integer("repeats", 3, "Timed calls per function, after one warm-up.")
    flags.DEFINE_string("out", "results/bench_nab.json", "Where the JSON report goes.")


def main(argv):
    del argv
    FLAGS = flags.FLAGS
    layer = first_layer(FLAGS.size, FLAGS.bins, FLAGS.width, FLAGS.repeats)
    rates = train_rates()
    print("\n".join(report_lines(layer, rates)))
    write_json({"first_layer": layer, "train": rates, "not_measured": NOT_MEASURED}, FLAGS.out)
    print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
