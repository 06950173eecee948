"""What does DUPA's second path cost, and what does encoder sharing save at sampling time?

    python -m launch.bench --methods=dupa            # the experiment's full model size
    python -m launch.bench --methods=dupa --smoke    # the smoke size (seconds)

Figures, each two numbers measured in this process one after the other, on one device:
1. training images/s of the jitted step, DDT at batch B vs DUPA at B images (2B rows: the
   second path doubles the forward and backward), and DUPA vs DDT at batch 2B (equal rows);
2. achieved FLOP/s of the DUPA step (XLA's FLOP count of the compiled step / its time) vs this
   machine's float32 matmul peak (`core.benchmark.matmul_peak`);
3. Euler sampler images/s (CFG, 50 steps) recomputing the encoder every step vs every 2nd step
   (DDT's encoder sharing, `core.diffusion`'s share_every).
"""

import time

import jax
import numpy as np

from configs import dupa as dupa_config
from core import digits, train
from core.benchmark import Ratio, Result, machine, matmul_peak, median_seconds
from methods.dupa import evaluation, make, model_config

WARMUP_STEPS = 2


def _config(arm: str, smoke: bool):
    config = dupa_config.get_config(f"size={'smoke' if smoke else 'full'},arm={arm}")
    config.eval.num_samples = 0  # the step alone: no classifier, no evaluation
    return config


def step_speed(config, steps: int) -> dict:
    """Images/s and XLA FLOPs of the config's compiled train step (one device)."""
    session = train.init(config, make(config), devices=jax.devices()[:1])
    state = session.state
    batches = [session.next_batch() for _ in range(WARMUP_STEPS + steps)]
    compiled = session.step.lower(state, batches[0]).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) and cost else cost
    flops = cost["flops"] if cost and cost.get("flops", -1) > 0 else None
    for batch in batches[:WARMUP_STEPS]:
        state, metrics = compiled(state, batch)
    jax.block_until_ready((state, metrics))
    start = time.perf_counter()
    for batch in batches[WARMUP_STEPS:]:
        state, metrics = compiled(state, batch)
    jax.block_until_ready((state, metrics))
    seconds = (time.perf_counter() - start) / steps
    images = config.train.batch_size
    return {
        "seconds_per_step": seconds,
        "images_per_step": images,
        "rows_per_step": images * config.dupa.paths,
        "images_per_s": images / seconds,
        "xla_flops_per_step": flops,
        "achieved_flops_per_s": flops / seconds if flops else None,
    }


def sampler_speed(config, num_samples: int, sample_steps: int, repeats: int) -> dict:
    cfg = model_config(config)
    params = make(config).init(jax.random.key(0), None)["params"]["net"]
    noise = np.asarray(jax.random.normal(jax.random.key(1), (num_samples, 8, 8, 1)), np.float32)
    labels = evaluation.sample_labels(num_samples)
    guidance = evaluation.guidance(cfg, config.eval)
    out = {}
    for share in (1, 2):
        run = lambda share=share: evaluation.sample(  # noqa: E731
            cfg, params, noise, labels, steps=sample_steps, guidance=guidance, share_every=share
        ).block_until_ready()
        seconds = median_seconds(run, repeats)
        out[share] = {"seconds": seconds, "images_per_s": num_samples / seconds}
    return out


def measure(*, smoke: bool = False) -> Result:
    steps, repeats = (3, 2) if smoke else (20, 5)
    num_samples, sample_steps = (20, 10) if smoke else (200, 50)
    speeds = {arm: step_speed(_config(arm, smoke), steps) for arm in ("ddt", "dupa", "ddt_2b")}
    peak = matmul_peak(jax.devices()[:1], sizes=(256, 512) if smoke else (512, 1024), repeats=3)
    sampling = sampler_speed(_config("dupa", smoke), num_samples, sample_steps, repeats)
    ddt, dupa, ddt_2b = speeds["ddt"], speeds["dupa"], speeds["ddt_2b"]
    m = _config("dupa", smoke).model
    blocks = f"{m.encoder_blocks}+{m.decoder_blocks}"
    size = f"DDT {blocks} blocks d={m.d_model}, B={ddt['images_per_step']}"
    ratios = [
        Ratio(
            f"training images/s ({size}): DDT vs DUPA (K = 2)",
            "DDT, B images (B rows)",
            ddt["images_per_s"],
            "DUPA, B images (2B rows)",
            dupa["images_per_s"],
            "images/s",
        ),
        Ratio(
            f"training rows/s ({size}): DUPA vs DDT at 2B (equal rows per step)",
            "DUPA, 2B rows",
            dupa["rows_per_step"] / dupa["seconds_per_step"],
            "DDT, 2B rows",
            ddt_2b["rows_per_step"] / ddt_2b["seconds_per_step"],
            "rows/s",
        ),
        Ratio(
            f"CFG Euler sampling, {sample_steps} steps, {num_samples} images: encoder sharing",
            "encoder every 2nd step",
            sampling[2]["images_per_s"],
            "encoder every step",
            sampling[1]["images_per_s"],
            "images/s",
        ),
    ]
    notes = []
    if dupa["achieved_flops_per_s"]:
        ratios.insert(
            2,
            Ratio(
                f"DUPA train step ({size}): achieved FLOP/s (XLA's count) vs matmul peak",
                "achieved",
                dupa["achieved_flops_per_s"],
                f"float32 matmul peak ({peak['best_size']}^2)",
                peak["peak_flops_per_s"],
                "FLOP/s",
            ),
        )
    else:
        notes.append("XLA reported no FLOP count for the step: no FLOP/s figure")
    details = {
        "config": {"model": dict(m), "smoke": smoke, "steps": steps},
        "train_step": speeds,
        "matmul_peak": peak,
        "sampler": {"num_samples": num_samples, "steps": sample_steps, "by_share_every": sampling},
        "machine": machine(),
        "digits_classes": digits.NUM_CLASSES,
    }
    return Result(ratios, details, notes)
