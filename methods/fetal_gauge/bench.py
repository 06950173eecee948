"""How fast does the harness score questions?

    python -m launch.bench --methods=fetal_gauge            # the experiment's model ("cpu")
    python -m launch.bench --methods=fetal_gauge --smoke    # the smoke size (seconds)

Figures, each two numbers measured in this process one after the other, on one device, over the
same phantom questions:
1. the VLM through the harness: batched option scoring (64 questions, all their options, one
   forward per batch; the image encoded once per question) vs one question at a time (the same
   code at batch 1): questions/s;
2. the generate path of the harness (prompt, a stub's text, the answer parser) vs the VLM's
   batched scoring: what the bookkeeping costs next to the model.
"""

import jax

from configs import fetal_gauge as fg_config
from core.benchmark import Ratio, Result, machine, median_seconds
from core.nn import vlm
from methods.fetal_gauge import harness, phantom_set, stubs
from methods.fetal_gauge.model import VLMModel, model_config


def measure(*, smoke: bool = False) -> Result:
    config = fg_config.get_config(f"size={'smoke' if smoke else 'cpu'}")
    cfg = model_config(config)
    params = vlm.init_params(cfg, jax.random.key(0))  # timing only: trained or not, same cost
    questions, repeats = (16, 1) if smoke else (256, 3)
    recs = [r for r in phantom_set.phantom_benchmark(30, 0) if r.split == "test"][:questions]
    batched = VLMModel(cfg, params, batch_size=min(64, len(recs)))
    single = VLMModel(cfg, params, batch_size=1)
    always_a = stubs.make_stub("always-a")

    def run(model):
        return lambda: harness.evaluate(model, recs, progress=False)

    seconds = {
        "batched": median_seconds(run(batched), repeats),
        "single": median_seconds(run(single), repeats),
        "generate_stub": median_seconds(run(always_a), repeats),
    }
    n = len(recs)
    m = config.model
    size = f"ViT {m.vit_layers}x{m.vit_d_model}, decoder {m.num_layers}x{m.d_model}"
    ratios = [
        Ratio(
            f"harness on {n} phantom questions ({size}): batched option scoring vs one at a time",
            f"batch {batched.batch_size}, every option in one forward",
            n / seconds["batched"],
            "batch 1",
            n / seconds["single"],
            "questions/s",
        ),
        Ratio(
            f"harness on {n} questions: prompt + parse of a text model vs the VLM's scoring",
            "always-A stub (prompt, parse)",
            n / seconds["generate_stub"],
            f"VLM, batch {batched.batch_size}",
            n / seconds["batched"],
            "questions/s",
        ),
    ]
    details = {
        "config": {"model": dict(m), "smoke": smoke, "questions": n},
        "seconds": seconds,
        "machine": machine(),
    }
    return Result(ratios, details, [])
