"""The VWF-unit localiser: which decoder MLP gate units respond to written words.

Every localiser image (`stimuli.localiser_images`: words, scrambled words, line faces, line
objects) goes through the VLM with one fixed prompt (`PROMPT`, the same for every category, so
the contrast is the image's); each decoder MLP gate pre-activation is averaged over all token
positions (image and prompt) per unit inside the jitted forward. A Welch t-test per unit then
compares words with the three non-word categories pooled (NaN, from units with no variance, ->
0), and the selected units are the top k % of t over all layers at once (`top_k_global`, the
paper's choice) or within each layer (`top_k_per_layer`, reported for comparison).

Controls (`random_matched`) are drawn uniformly from the units of the same layers, as many per
layer as the selection has: matched in count and layer histogram. Random units may include
selected ones (the paper's control draws from the whole layer).

Shape suffixes: N images, L decoder layers, F d_ff units, U = L * F units flattened.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from core.nn import vlm
from methods.vwf_dyslexia import stimuli, tasks

PROMPT = ("<lexical>", "<query>")  # the text after the image: identical for every category
NON_WORDS = ("scrambled_word", "face", "object")


def prompt_tokens(prompt=PROMPT) -> np.ndarray:
    return np.array([tasks.TOKEN[t] for t in prompt], np.int32)


@functools.partial(jax.jit, static_argnums=0)
def _position_means(cfg: vlm.VLMConfig, params, images_BHWC, tokens_BT):
    out = vlm.apply(cfg, params, images_BHWC, tokens_BT, capture=vlm.gate_names(cfg))
    means = [out.captured[name].astype(jnp.float32).mean(axis=1) for name in vlm.gate_names(cfg)]
    return jnp.stack(means, axis=1)  # [B, L, F]


def unit_means(cfg, params, images_NHW, *, batch_size: int = 64, prompt=PROMPT) -> np.ndarray:
    """[N, L, F]: each image's gate pre-activation per unit, averaged over every token
    position. The last batch is padded to batch_size (one compiled shape) and cut back."""
    images_NHW = np.asarray(images_NHW, np.float32)
    n = len(images_NHW)
    tokens_BT = np.broadcast_to(prompt_tokens(prompt), (batch_size, len(prompt)))
    out = []
    for start in range(0, n, batch_size):
        chunk = images_NHW[start : start + batch_size]
        pad = batch_size - len(chunk)
        chunk = np.concatenate([chunk, np.zeros((pad, *chunk.shape[1:]), np.float32)])
        means = _position_means(cfg, params, chunk[..., None], tokens_BT)
        out.append(np.asarray(means)[: batch_size - pad])
    return np.concatenate(out)


def welch_t(a_NU, b_MU) -> np.ndarray:
    """Welch's t per column, a against b (unequal variances; float64); 0 where it is
    undefined (both samples constant in that column)."""
    a, b = np.asarray(a_NU, np.float64), np.asarray(b_MU, np.float64)
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"Welch's t needs >= 2 samples per group, got {len(a)} and {len(b)}")
    se2 = a.var(axis=0, ddof=1) / len(a) + b.var(axis=0, ddof=1) / len(b)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (a.mean(axis=0) - b.mean(axis=0)) / np.sqrt(se2)
    return np.nan_to_num(t, nan=0.0, posinf=0.0, neginf=0.0)


def category_images(n_per_category: int, seed: int, jitter: float = 1.0, words=None) -> dict:
    """{category: [n, H, W]} for one localiser resample (the seed fixes every category; words
    at the model's jitter, `stimuli.render_text`). Words and scrambled words share one seed,
    so scrambled image i is word image i with its tiles moved: the ink-matched pairs
    `stimuli.localiser_images` draws (until issue 47 each category had a seed of its own, so
    the two were different words). words: the pool they come from (the re-test: the taught
    lexicon, `tasks.lexicon`; default `stimuli.word_list()`)."""
    seeds = {"word": seed * 10, "scrambled_word": seed * 10, "face": seed * 10 + 2,
             "object": seed * 10 + 3}  # fmt: skip
    return {
        c: stimuli.localiser_images(c, n_per_category, seed=seeds[c], jitter=jitter, words=words)
        for c in stimuli.CATEGORIES
    }


def t_map(
    cfg,
    params,
    n_per_category: int,
    seed: int,
    *,
    batch_size: int = 64,
    jitter: float = 1.0,
    words=None,
) -> np.ndarray:
    """[L, F] Welch t of words vs the pooled non-word categories for one resample (words:
    `category_images`')."""
    images = category_images(n_per_category, seed, jitter, words)
    means = {c: unit_means(cfg, params, x, batch_size=batch_size) for c, x in images.items()}
    words_NU = means["word"].reshape(n_per_category, -1)
    others_MU = np.concatenate([means[c] for c in NON_WORDS]).reshape(3 * n_per_category, -1)
    return welch_t(words_NU, others_MU).reshape(means["word"].shape[1:])


def unit_count(num_units: int, percent: float) -> int:
    """round(percent % of num_units), at least 1: the size of a top-k % selection."""
    if not 0 < percent <= 100:
        raise ValueError(f"k = {percent} % must be in (0, 100]")
    return max(1, round(num_units * percent / 100))


def _top(t_U, count: int) -> np.ndarray:
    # Stable on ties (lower index first), so a selection is a function of t alone.
    order = np.argsort(-np.asarray(t_U), kind="stable")[:count]
    mask = np.zeros(len(t_U), bool)
    mask[order] = True
    return mask


def top_k_global(t_LF, percent: float) -> np.ndarray:
    """bool [L, F]: the units with the largest t over all layers together."""
    t_LF = np.asarray(t_LF)
    return _top(t_LF.ravel(), unit_count(t_LF.size, percent)).reshape(t_LF.shape)


def top_k_per_layer(t_LF, percent: float) -> np.ndarray:
    """bool [L, F]: the top k % of each layer's units separately."""
    t_LF = np.asarray(t_LF)
    count = unit_count(t_LF.shape[1], percent)
    return np.stack([_top(row, count) for row in t_LF])


def random_matched(selected_LF, rng: np.random.Generator) -> np.ndarray:
    """bool [L, F]: as many units per layer as `selected_LF` has, uniformly at random."""
    selected_LF = np.asarray(selected_LF, bool)
    out = np.zeros_like(selected_LF)
    for layer, count in enumerate(selected_LF.sum(axis=1)):
        out[layer, rng.choice(selected_LF.shape[1], size=int(count), replace=False)] = True
    return out


def overlap(a_LF, b_LF) -> float:
    """|a & b| / |a|: the fraction of one selection the other shares (equal sizes)."""
    a_LF, b_LF = np.asarray(a_LF, bool), np.asarray(b_LF, bool)
    if a_LF.sum() != b_LF.sum():
        raise ValueError(f"overlap of selections of different sizes: {a_LF.sum()}, {b_LF.sum()}")
    return float((a_LF & b_LF).sum() / max(a_LF.sum(), 1))


def mean_pairwise_overlap(selections) -> float:
    """The mean `overlap` over every pair of selections (localiser resamples)."""
    pairs = [overlap(a, b) for i, a in enumerate(selections) for b in selections[i + 1 :]]
    if not pairs:
        raise ValueError("overlap across resamples needs at least two selections")
    return float(np.mean(pairs))
