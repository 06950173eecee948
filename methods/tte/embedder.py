"""The embedders: the VLM with last-non-pad-token pooling (TTE_t, TTE_s, the baseline) and TTE_u's
head on a frozen reasoner; Precision@1 of either over a split's galleries.

    cfg = model_config(config)
    e_BD = embed(cfg, params, {"image": image_BHWC, "tokens": tokens_BT})     # float32
    e_BD = unified_embed(cfg, head_cfg, {"reasoner": r, "head": h}, side)
    p = precision(embed_fn, params, queries, texts, gallery)   # {family: P@1}

A side is a dict {"image" [B, 8, 16, 1], "tokens" [B, T]}: the query (instruction, trace, eos) or
the target (eos alone for an image; the answer word and eos for a text). Padding is PAD (id 0)
on the right; the pooled position is the last non-pad token (`core.contrastive.last_valid`).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from core.contrastive import last_valid, normalize
from core.nn import vlm
from core.precision import compute_dtype
from methods.tte import examples, heads, tasks


def model_config(config) -> vlm.VLMConfig:
    return vlm.from_fields(
        config.model,
        image_height=tasks.IMAGE_SHAPE[0],
        image_width=tasks.IMAGE_SHAPE[1],
        channels=1,
        vocab_size=len(tasks.VOCAB),
        text_len=tasks.QUERY_LEN + tasks.TRACE_LEN + 1,  # a reasoner's prompt and its trace
        dtype=compute_dtype(config.dtype),
    )


def states(cfg: vlm.VLMConfig, params, side: dict, name: str):
    """(the decoder's captured `name` states [B, N + T, D], the valid mask [B, N + T])."""
    mask_BT = side["tokens"] != tasks.PAD
    out = vlm.apply(
        cfg, params, side["image"], side["tokens"], text_key_mask_BT=mask_BT, capture=(name,)
    )
    B, N = mask_BT.shape[0], cfg.num_image_tokens
    return out.captured[name], jnp.concatenate([jnp.ones((B, N), bool), mask_BT], axis=1)


def embed(cfg: vlm.VLMConfig, params, side: dict):
    """The final-norm hidden state at the last non-pad token, float32 [B, D]."""
    h_BSD, mask_BS = states(cfg, params, side, "decoder/final_norm")
    return last_valid(h_BSD, mask_BS).astype(jnp.float32)


def unified_embed(cfg: vlm.VLMConfig, head_cfg: heads.HeadConfig, params, side: dict):
    """TTE_u: the head over the frozen reasoner's states (no gradient reaches the reasoner)."""
    name = "decoder/" + heads.reasoner_states(cfg.decoder, head_cfg)
    h_BSD, mask_BS = states(cfg, jax.lax.stop_gradient(params["reasoner"]), side, name)
    e = heads.head_embed(head_cfg, cfg.decoder, params["head"], h_BSD, mask_BS)
    return e.astype(jnp.float32)


def head_config(config) -> heads.HeadConfig:
    t = config.tte
    return heads.HeadConfig(
        kind=t.head, layer=t.head_layer, num_blocks=t.head_blocks, num_queries=t.pooler_queries
    )


def embed_all(embed_fn, params, image_N, tokens_N, batch: int = 512) -> np.ndarray:
    """Unit embeddings [N, D] (numpy) of many sides, `batch` rows per jitted call (the last
    batch padded to a full one so that one program serves every call)."""
    out = []
    for start in range(0, len(tokens_N), batch):
        image, tokens = image_N[start : start + batch], tokens_N[start : start + batch]
        n = len(tokens)
        pad = batch - n
        image = np.concatenate([image, np.repeat(image[-1:], pad, 0)]) if pad else image
        tokens = np.concatenate([tokens, np.repeat(tokens[-1:], pad, 0)]) if pad else tokens
        e = embed_fn(params, {"image": jnp.asarray(image), "tokens": jnp.asarray(tokens)})
        out.append(np.asarray(normalize(e))[:n])
    return np.concatenate(out)


def targets(g: examples.Gallery, family: str):
    """(images, tokens) of a family's candidates: the split's gallery, or its label texts."""
    if family in tasks.IMAGE_TARGETS:
        eos = tasks.target_text("simple", 0)
        return g.image, np.repeat(eos[None], len(g.image), 0)
    ids = examples.text_gallery(family)
    tokens = np.stack([tasks.target_text(family, int(a)) for a in ids])
    return np.repeat(tasks.BLANK[None], len(ids), 0), tokens


def precision(embed_fn, params, queries: dict, query_sides: dict, g: examples.Gallery) -> dict:
    """{family: P@1} for each family's `examples.Queries` and its encoded query sides
    {family: (images, tokens)}; the image gallery is embedded once."""
    gallery_e = embed_all(embed_fn, params, *targets(g, "simple"))
    out = {}
    for family, q in queries.items():
        e_q = embed_all(embed_fn, params, *query_sides[family])
        e_t = (
            gallery_e
            if family in tasks.IMAGE_TARGETS
            else embed_all(embed_fn, params, *targets(g, family))
        )
        out[family] = examples.precision_at_1(q, e_q @ e_t.T)
    return out


@functools.lru_cache(maxsize=16)
def jitted(cfg: vlm.VLMConfig, head_cfg: heads.HeadConfig | None = None):
    """One jitted embed function per model (and head): `fn(params, side) -> [B, D]`."""
    if head_cfg is None:
        return jax.jit(functools.partial(embed, cfg))
    return jax.jit(functools.partial(unified_embed, cfg, head_cfg))
