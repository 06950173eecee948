"""How fast do the localiser and the lesion sweep run?

    python -m launch.bench --methods=vwf_dyslexia            # the experiment's model ("cpu")
    python -m launch.bench --methods=vwf_dyslexia --smoke    # the smoke size (seconds)

Figures, each two numbers measured in this process one after the other, on one device:
1. localiser images/s through the captured forward (gate pre-activations of every decoder
   layer, averaged over positions inside the jitted function) vs the plain forward (logits
   only) on the same images: what capturing costs;
2. the lesion evaluation of M masks on one batch, vmapped over the masks in one compiled call,
   vs a Python loop over the masks (the same compiled function at M = 1): masks/s.
"""

import jax
import numpy as np

from configs import vwf_dyslexia as vwf_config
from core.benchmark import Ratio, Result, machine, median_seconds
from core.nn import vlm
from methods.vwf_dyslexia import lesion, localiser, model_config

_logits = jax.jit(lambda cfg, p, x, t: vlm.apply(cfg, p, x, t).logits_BTV, static_argnums=0)


def measure(*, smoke: bool = False) -> Result:
    config = vwf_config.get_config(f"size={'smoke' if smoke else 'cpu'}")
    cfg = model_config(config)
    params = vlm.init_params(cfg, jax.random.key(0))
    batch, masks, repeats = (8, 4, 2) if smoke else (128, 16, 5)
    images = np.random.default_rng(0).uniform(0, 1, (batch, *cfg_shape(cfg))).astype(np.float32)
    tokens = np.broadcast_to(localiser.prompt_tokens(), (batch, len(localiser.PROMPT)))

    def captured():
        localiser.unit_means(cfg, params, images, batch_size=batch)

    def plain():
        _logits(cfg, params, images[..., None], tokens).block_until_ready()

    seconds_captured = median_seconds(captured, repeats)
    seconds_plain = median_seconds(plain, repeats)

    examples = lesion.eval_set(max(batch // 4, 1), seed=0, lexicon_size=0)  # timing only
    L, F = cfg.decoder.num_layers, cfg.decoder.d_ff
    rng = np.random.default_rng(1)
    mask_MLF = lesion.unit_masks(rng.random((masks, L, F)) < 0.05)
    n = len(examples["task"])

    def vmapped():
        lesion.accuracy(cfg, params, examples, mask_MLF, batch_size=n)

    def loop():
        lesion.accuracy(cfg, params, examples, mask_MLF, batch_size=n, chunk=1)

    seconds_vmapped = median_seconds(vmapped, repeats)
    seconds_loop = median_seconds(loop, repeats)
    m = config.model
    size = (
        f"ViT {m.vit_layers}x{m.vit_d_model}, decoder {m.num_layers}x{m.d_model} "
        f"(d_ff {m.d_ff}), {cfg.num_image_tokens} image tokens"
    )
    ratios = [
        Ratio(
            f"localiser forward, batch {batch} ({size}): gate capture vs logits only",
            "captured gates, position means",
            batch / seconds_captured,
            "plain forward",
            batch / seconds_plain,
            "images/s",
        ),
        Ratio(
            f"lesion evaluation, {masks} masks x {n} examples: vmapped vs a loop over masks",
            "vmap over masks (one call)",
            masks / seconds_vmapped,
            "Python loop (M = 1 per call)",
            masks / seconds_loop,
            "masks/s",
        ),
    ]
    details = {
        "config": {"model": dict(m), "smoke": smoke, "batch": batch, "masks": masks},
        "seconds": {
            "captured": seconds_captured,
            "plain": seconds_plain,
            "vmapped": seconds_vmapped,
            "loop": seconds_loop,
        },
        "localiser_images_per_s": batch / seconds_captured,
        "machine": machine(),
    }
    return Result(ratios, details, [])


def cfg_shape(cfg: vlm.VLMConfig) -> tuple[int, int]:
    return cfg.vit.image_height, cfg.vit.image_width
