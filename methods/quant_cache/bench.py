"""What do quantisation and the feature cache buy at sampling time, measured and counted?

    python -m launch.bench --methods=quant_cache            # the experiment's full model size
    python -m launch.bench --methods=quant_cache --smoke    # the smoke size (seconds)

Figures, each two numbers from this process, one after the other, on one device, at the same
step count (50 respaced DDPM steps), from one random model (speed does not depend on training):
1. images/s of the FORA cache (N = 2) vs the full-precision sampler;
2. images/s of fake-quantised W4A8 + cache vs the cache alone: fake quantisation is extra
   elementwise work around float matmuls (it simulates numerics; it cannot be faster);
3. images/s of the integer path (W8A8: int8 x int8 -> int32 `dot_general`, dequantised in the
   epilogue) vs full precision: the figure that means something on an accelerator with int8
   units; on XLA:CPU it is recorded, not claimed;
4. the paper's accounting: BOPs of full precision vs W4A8 + cache over the 50 steps (`cost.py`).
"""

import jax
import jax.numpy as jnp
import numpy as np

from configs import quant_cache as qc_config
from core import digits
from core.benchmark import Ratio, Result, machine, median_seconds
from methods.quant_cache import calibrate, cost, model_config, sampling, schedule
from methods.quant_cache.settings import parse


def _sampler(cfg, params, sched, setting, ranges, noise, labels, steps, int8=False):
    run = jax.jit(
        lambda x, y, k: sampling.sample(
            cfg, params, sched, setting, x, y, k, steps=steps, eta=1.0, ranges=ranges,
            int8=int8,
        ).x
    )  # fmt: skip
    key = jax.random.key(2)
    return lambda: run(noise, labels, key).block_until_ready()


def measure(*, smoke: bool = False) -> Result:
    config = qc_config.get_config(f"size={'smoke' if smoke else 'full'}")
    cfg, sched = model_config(config), schedule(config)
    params = jax.jit(lambda k: sampling.dit.init_params(cfg, k))(jax.random.key(0))
    # adaLN-Zero's zero gates would make every block the identity: a trained-like random model.
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(3), len(leaves))
    params = treedef.unflatten(
        [a + 0.02 * jax.random.normal(k, a.shape) for a, k in zip(leaves, keys, strict=True)]
    )
    num, steps, repeats = (16, 10, 2) if smoke else (500, 50, 5)
    noise = jax.random.normal(jax.random.key(1), (num, *digits.IMAGE_SHAPE))
    labels = jnp.asarray(calibrate.labels(num))
    t = jnp.asarray(np.linspace(0, sched.num_steps - 1, num), jnp.float32)
    ranges = calibrate.ranges(
        cfg, params, sched,
        calibrate.Pool(np.asarray(noise), np.asarray(t), None, np.asarray(labels), None),
        np.arange(num),
    )  # fmt: skip
    seconds = {}
    for name, int8 in (("fp", False), ("c2", False), ("w4a8+c2", False), ("w8a8", True)):
        run = _sampler(cfg, params, sched, parse(name), ranges, noise, labels, steps, int8)
        seconds[(name, int8)] = median_seconds(run, repeats)
    ips = {key: num / s for key, s in seconds.items()}
    macs = sampling.layer_macs(cfg, params, sched)
    bops = {n: cost.sampler_bops(cfg, macs, parse(n), steps) for n in ("fp", "w4a8+c2")}
    what = f"{steps} steps, {num} images, DiT {cfg.encoder_blocks} blocks d={cfg.d_model}"
    ratios = [
        Ratio(f"sampling ({what}): FORA cache N = 2 vs none", "cache N = 2",
              ips[("c2", False)], "full precision", ips[("fp", False)], "images/s"),
        Ratio(f"sampling ({what}): fake-quant W4A8 + cache vs the cache alone (the cost of "
              "simulating quantisation)", "W4A8 + C2 (fake quant)", ips[("w4a8+c2", False)],
              "cache N = 2", ips[("c2", False)], "images/s"),
        Ratio(f"sampling ({what}): int8 dot_general W8A8 vs full precision",
              "W8A8 (int8 path)", ips[("w8a8", True)], "full precision", ips[("fp", False)],
              "images/s"),
        Ratio(f"bit operations over the sampler ({what}): full precision vs W4A8 + C2",
              "full precision", bops["fp"], "W4A8 + C2", bops["w4a8+c2"], "BOPs"),
    ]  # fmt: skip
    platform = jax.devices()[0].platform
    notes = [f"platform {platform}: int8 speed is only meaningful with int8 matmul units (TPU, "
             "GPU); fake quantisation simulates numerics, it is not fast"]  # fmt: skip
    details = {
        "config": {"model": dict(config.model), "smoke": smoke, "steps": steps, "images": num},
        "seconds": {f"{n}{' int8' if i else ''}": s for (n, i), s in seconds.items()},
        "bops": bops,
        "machine": machine(),
    }
    return Result(ratios, details, notes)
