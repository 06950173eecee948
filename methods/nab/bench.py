"""How fast NAB trains with the kernel's encoder, against the reference's autodiff and RFF.

    python -m launch.bench --methods=nab --kernels=binned_encoding

Training steps per second on one device after compilation (`steps` steps, the state threaded
through: the step donates it), for `configs/nab.py` at sizes small and paper (64^2 and 128^2)
with three encoders: NAB with `model.impl="auto"` (the kernel's tiles, "tiled", on CPU; the
Pallas kernel on GPU/TPU), NAB with the jnp reference differentiated by autodiff
(`impl="xla"`), and RFF. Figures: NAB (auto) against each. The first layer alone, reference vs
kernel, in time and memory: `core/kernels/binned_encoding/bench.py`.
"""

import time

import jax

from configs import nab as nab_config
from core import train
from core.benchmark import Ratio, Result
from methods import nab

ENCODERS = {"nab": "NAB (auto)", "nab-xla": "NAB (reference autodiff)", "rff": "RFF"}


def _steps_per_second(size: str, encoder: str, steps: int) -> dict:
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
    return {
        "image": config.model.size,
        "hidden": config.model.hidden,
        "steps_per_second": steps / (time.perf_counter() - start),
    }


def measure(*, smoke: bool = False) -> Result:
    sizes, steps = (("smoke",), 2) if smoke else (("small", "paper"), 10)
    rates, ratios = {}, []
    for size in sizes:
        by_encoder = {e: _steps_per_second(size, e, steps) for e in ENCODERS}
        rates.update({f"{size}/{e}": r for e, r in by_encoder.items()})
        nab_rate = by_encoder["nab"]
        for other in ("nab-xla", "rff"):
            ratios.append(
                Ratio(
                    f"training steps/s, size={size} ({nab_rate['image']}^2 pixels, hidden "
                    f"{nab_rate['hidden']}), one device",
                    ENCODERS["nab"],
                    nab_rate["steps_per_second"],
                    ENCODERS[other],
                    by_encoder[other]["steps_per_second"],
                    "steps/s",
                )
            )
    return Result(ratios, {"steps": steps, "train": rates})
