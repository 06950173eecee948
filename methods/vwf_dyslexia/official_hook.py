"""The official code's lesion, reproduced as written: an arm labelled "official code's behaviour"
beside the unit lesion the paper describes (`lesion.py`; issue 47).

What the official code does (epflneuroailab/VWFA-Localization, commit f955415,
`apply_VWFA_mask_roar.py` and `apply_VWFA_mask_ksct.py`, `apply_noise_with_mask`, ZO = True):
a forward hook on every decoder layer's `mlp.gate_proj` replaces its output o [B, T, F] by
o * (1 - m) + o * m * 0 with m = mask[layer][:T] reshaped to [1, T, 1], where mask[layer] is the
layer's [F] row of the localiser's 0/1 unit mask (`contrast_activations.py`, 21 % by default).
The unit mask is read along the token axis:

- during `model.generate`'s prefill (the whole prompt, T tokens: image and text) position t of
  layer l loses its whole gate, every unit, when unit t of layer l is selected; which units
  with index >= T are selected plays no part;
- during cached decoding every call has T = 1, so m = mask[layer][:1]: each generated token's
  layer l MLP is silenced whole when unit 0 of layer l is selected, and untouched otherwise.

Here the same zeroing runs on our model. The prompt is the image tokens and the text up to the
query token (the prefill); every answer token after the first is fed back as a cached decoding
step. The zeroing depends on the position, which `core.nn.vlm`'s unit mask (one [L, F] array
at every position) cannot express, so the decoder runs one position at a time through its KV
cache, with that position's zeroing as a whole-row `gate_mask_LF` (0 on every unit of a zeroed
layer, 1 elsewhere). That is exact: a causal decoder's cached steps compute its full forward
(`test_official_hook_without_a_selection_is_the_intact_model`). Scoring by teacher forcing
counts what greedy decoding answers: an answer is right only when every token is, and a wrong
token ends the match either way. One-token answers (every yes/no task) are predicted at the
last prompt position, so only the prefill's zeroing reaches them; the letter read-out's later
letters also meet the decoding steps' whole-layer zeroing.

`reference_hook` is the official hook transcribed line by line (torch -> numpy); the tests
compare this module's zeroing with it.

Shape suffixes: B examples, M masks, L decoder layers, F d_ff units, S positions (image tokens
then text), T text positions, V vocabulary, D width, N image tokens.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from core.nn import transformer, vlm
from methods.vwf_dyslexia import answer_counts, lesion, tasks


def reference_hook(output_BTF, mask_F) -> np.ndarray:
    """`hook_fn` of `apply_noise_with_mask` for a 3-D output with ZO = True (scale 0), line by
    line; mask_F is one layer's 0/1 unit mask."""
    output = np.asarray(output_BTF)
    mask = np.asarray(mask_F)[: output.shape[1]]  # mask = mask[:output.shape[1]]
    adjusted_mask = mask[None, :, None]  # mask.unsqueeze(0).unsqueeze(2)
    scale_factor = 0  # 0 if ZO else ...
    inv_mask = output * (1 - adjusted_mask)
    return inv_mask + output * adjusted_mask * scale_factor


def prefill_lengths(cfg: vlm.VLMConfig, mask_BT) -> jax.Array:
    """[B] the prompt's length per example: the image tokens and the text through the query
    token, which predicts the first answer token (the first 1 of the answer mask)."""
    return cfg.num_image_tokens + jnp.argmax(mask_BT > 0, axis=1) + 1


def keep_LS(selected_LF, prefill_len, length: int) -> jax.Array:
    """float32 [L, S]: 0 where the official hook zeroes layer l's gate at position s (unit s
    selected, inside the prompt; unit 0 selected, at a decoding step), 1 elsewhere."""
    positions_S = jnp.arange(length)
    unit_S = jnp.where(positions_S < prefill_len, positions_S, 0)
    return 1.0 - jnp.asarray(selected_LF, jnp.float32)[:, unit_S]


def _one_example(cfg, params, image_HWC, inputs_T, prefill_len, selected_LF, capture):
    """(logits [T, V] at the text positions, gates [S, L, F] after the hook, or None)."""
    image_1ND, _ = vlm.image_embeddings(cfg, params, image_HWC[None])
    text_1TD = transformer.embed(cfg.decoder, params["decoder"], inputs_T[None])
    x_SD = jnp.concatenate([image_1ND, text_1TD.astype(image_1ND.dtype)], axis=1)[0]
    length = x_SD.shape[0]
    keep_SL = keep_LS(selected_LF, prefill_len, length).T
    names = vlm.gate_names(cfg) if capture else ()
    width = cfg.decoder.d_ff

    def position(cache, inputs):
        x_D, keep_L = inputs
        mask_LF = jnp.broadcast_to(keep_L[:, None], (len(keep_L), width))
        out = transformer.forward(
            cfg.decoder,
            params["decoder"],
            embeddings_BTD=x_D[None, None],
            cache=cache,
            gate_mask_LF=mask_LF,
            capture=tuple(n.removeprefix("decoder/") for n in names),
        )
        gates_LF = jnp.stack([g[0, 0] for g in out.captured.values()]) if capture else None
        return out.cache, (out.logits_BTV[0, 0], gates_LF)

    cache = vlm.init_cache(cfg, 1, length)
    _, (logits_SV, gates_SLF) = lax.scan(position, cache, (x_SD, keep_SL))
    return logits_SV[cfg.num_image_tokens :], gates_SLF


def check_width(cfg: vlm.VLMConfig) -> None:
    """The official hook reads unit t for position t: a layer narrower than the sequence would
    make its [1, T, 1] mask shorter than T (torch refuses the broadcast)."""
    length = cfg.num_image_tokens + tasks.TEXT_LEN
    if cfg.decoder.d_ff < length:
        raise ValueError(
            f"official hook: d_ff {cfg.decoder.d_ff} is below the sequence length {length} "
            "(the hook reads unit t for token t)"
        )


@functools.partial(jax.jit, static_argnums=(0, 4))
def _logits(cfg, params, batch, selected_LF, capture=False):
    prefill_B = prefill_lengths(cfg, batch["mask"])
    one = functools.partial(_one_example, cfg, params, capture=capture)
    return jax.vmap(one, in_axes=(0, 0, 0, None))(
        batch["image"], batch["inputs"], prefill_B, selected_LF
    )


def logits(cfg, params, batch, selected_LF) -> jax.Array:
    """[B, TEXT_LEN, V]: the text positions' logits under the official hook of a bool [L, F]
    selection (none selected: the intact model's)."""
    check_width(cfg)
    return _logits(cfg, params, batch, jnp.asarray(selected_LF, bool))[0]


def gates(cfg, params, batch, selected_LF) -> jax.Array:
    """[B, S, L, F]: every decoder MLP's gate pre-activation after the official hook."""
    check_width(cfg)
    return _logits(cfg, params, batch, jnp.asarray(selected_LF, bool), True)[1]


@functools.partial(jax.jit, static_argnums=0)
def _right_counts(cfg, params, batch, selected_MLF):
    """[M, tasks, 2]: (exactly right, examples) per selection and task on one batch."""

    def one(selected_LF):
        logits_BTV, _ = _logits(cfg, params, batch, selected_LF)
        counts = answer_counts(logits_BTV, batch)
        return jnp.stack([jnp.stack(counts[f"accuracy/{t}"]) for t in tasks.ALL_TASKS])

    return jax.vmap(one)(selected_MLF)


def accuracy(cfg, params, examples: dict, selected_MLF, *, batch_size=128, chunk=4) -> dict:
    """{task: float [M]}: each task's exact-answer accuracy under the official hook of each of
    M bool [L, F] selections (as `lesion.accuracy` for the unit lesion)."""
    check_width(cfg)
    selected_MLF = np.asarray(selected_MLF, bool)
    num = len(selected_MLF)
    pad = -num % chunk  # whole chunks: one compiled shape
    selected_MLF = np.concatenate([selected_MLF, np.zeros((pad, *selected_MLF.shape[1:]), bool)])
    totals = np.zeros((num + pad, len(tasks.ALL_TASKS), 2))
    for batch in lesion.batches(examples, batch_size):
        for m in range(0, num, chunk):
            counts = _right_counts(cfg, params, batch, jnp.asarray(selected_MLF[m : m + chunk]))
            totals[m : m + chunk] += np.asarray(counts)
    return {
        task: totals[:num, i, 0] / totals[:num, i, 1]
        for i, task in enumerate(tasks.ALL_TASKS)
        if totals[0, i, 1] > 0
    }
