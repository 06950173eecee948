"""The paper's speed accounting: bit operations (BOPs = MACs x weight bits x activation bits)
summed over the sampler's steps, with a cached step running only what a FORA cache cannot
skip. Full precision counts as 32 x 32 bits.

Per image and step: every linear layer's MACs (measured by `sampling.layer_macs`), plus the
attention's score and value products (2 N^2 D per block, unquantised: not linear layers). A
cached step runs the embeddings, the timestep MLP, each block's adaLN modulation (the gates of
the replayed residual adds) and the final layer; attention and MLP branches are skipped. Step i
is a refresh when i % N == 0, as in `core.diffusion`.
"""

from methods.quant_cache import sampling

FLOAT_BITS = 32


def _runs_when_cached(path: str) -> bool:
    return not sampling.is_quantized(path) or path.endswith("modulation")


def step_bops(cfg, macs: dict, setting, *, cached: bool) -> int:
    """BOPs of one forward of one image under `setting` (cached: a replay step)."""
    total = 0
    for path, m in macs.items():
        if cached and not _runs_when_cached(path):
            continue
        quantized = setting.quantized and sampling.is_quantized(path)
        w, a = (setting.w_bits, setting.a_bits) if quantized else (FLOAT_BITS, FLOAT_BITS)
        total += m * w * a
    if not cached:  # attention scores and weighted values, every block, in float
        total += cfg.encoder_blocks * 2 * cfg.num_tokens**2 * cfg.d_model * FLOAT_BITS**2
    return total


def sampler_bops(cfg, macs: dict, setting, steps: int) -> int:
    refreshes = len(range(0, steps, setting.cache_every))
    full = step_bops(cfg, macs, setting, cached=False)
    replay = step_bops(cfg, macs, setting, cached=True)
    return refreshes * full + (steps - refreshes) * replay


def speedup(cfg, macs: dict, setting, steps: int) -> float:
    """Full precision's BOPs over the setting's, at the same step count."""
    from methods.quant_cache.settings import Setting

    fp = sampler_bops(cfg, macs, Setting("fp"), steps)
    return fp / sampler_bops(cfg, macs, setting, steps)
