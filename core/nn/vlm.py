"""A vision-language model: ViT -> linear merger -> the decoder LM of `core.nn.transformer`, fed
the image tokens first and then the text tokens through its embeddings-in path. Pure functions
over plain pytrees (params = {"vit", "merger", "decoder"}).

The merger (cfg.merge = m, default 1) concatenates each m x m block of neighbouring ViT tokens
before its linear map, as Qwen2-VL's 2 x 2 merger: the encoder sees fine patches, the decoder
gets m^2 times fewer image tokens (N = (H/p)(W/p) / m^2, in row-major block order).

    params = init_params(cfg, rng)
    out = apply(cfg, params, images_BHWC, tokens_BT, capture=gate_names(cfg))
    out.logits_BTV                     # [B, N + T, V]: N image positions, then T text ones
    out.captured["decoder/blocks/0/mlp/gate"]          # [B, N + T, F], SwiGLU gate before SiLU
    out = apply(..., gate_mask_LF=mask_LF)             # a unit lesion (0 silences a unit)
    cache = init_cache(cfg, B, max_len)                # decoding: prefill image + prompt,
    out = apply(cfg, params, images, prompt_BT, cache=cache)   # then one text token a call:
    out = step(cfg, params, next_B1, out.cache, gate_mask_LF=mask_LF)
    pp = {"model": params, "image_BND": image_embeddings(cfg, params, images)[0]}  # or sampler:
    out = sampler.sample_jit(policy(cfg, image_token), pp, prompt_BP, rng=key, max_new_tokens=8)

The decoder's mask is causal over [image tokens; text tokens], as in Qwen2-VL's language model:
the ViT already mixes the image bidirectionally, so a prefix-LM block mask would add nothing the
text positions need, and the causal form keeps the decoder the LM it is (the same numbers,
exact KV-cached decoding without block ids). Image positions never see the text; every text
position sees the whole image. Rotary positions run 0 .. N + T - 1 over both. Through the
sampler (`policy`), prompt_BP is left-padded [pad..., image_token x N, text...]: N placeholder
ids stand where the image goes, so the same positions and mask give the same logits.

The lesion (`gate_mask_LF` [decoder layers, d_ff]) multiplies each decoder MLP's gate
pre-activation along its LAST axis, the unit axis, at every position and every cached step
(`core.nn.layers.SwiGLU.with_gate`); it is an input array, so one compiled function serves
every mask (`jax.vmap` over masks). The official VWF code's bug, a unit mask sliced to T and
applied along the token axis, is what this layout rules out (tests/core/test_vlm.py).

Capture names (`capture_names`): "vit/<name>" (`core.nn.vit.capture_names`), "merger" (the
image tokens in the decoder's width, = the decoder's first N input embeddings), "decoder/<name>"
(`core.nn.transformer.capture_names`; "decoder/embed" is the whole input sequence).

Shape suffixes: B batch, H W C image, N image tokens (after merging), M merged token width,
T text tokens, D width, F decoder d_ff, L decoder layers, V vocab.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from core.errors import ConfigError
from core.nn import image, layers, transformer, vit
from core.nn.policy import Policy
from core.nn.pure import PureModule

Output = transformer.Output


@dataclasses.dataclass(frozen=True)
class VLMConfig:
    """The encoder's and the decoder's configs; frozen and hashable (a static jit argument)."""

    vit: vit.ViTConfig
    decoder: transformer.TransformerConfig
    merge: int = 1  # m: each m x m block of ViT tokens becomes one decoder token

    def __post_init__(self):
        rows, cols = self.vit.grid
        if (
            not isinstance(self.merge, int)
            or self.merge <= 0
            or rows % self.merge
            or cols % self.merge
        ):
            raise ConfigError(
                f"VLMConfig.merge={self.merge!r} must be a positive int dividing the ViT's "
                f"{rows} x {cols} patch grid"
            )
        if self.decoder.attention_mask != "causal":
            raise ConfigError(
                "VLMConfig.decoder.attention_mask must be 'causal' (image tokens then text, "
                f"the module docstring says why), got {self.decoder.attention_mask!r}"
            )
        if self.decoder.max_len <= self.num_image_tokens:
            raise ConfigError(
                f"VLMConfig.decoder.max_len={self.decoder.max_len} leaves no room for text "
                f"after the {self.num_image_tokens} image tokens"
            )

    @property
    def num_image_tokens(self) -> int:
        """N: the image tokens the decoder reads (the ViT's, over merge^2)."""
        return self.vit.num_tokens // self.merge**2


def from_fields(m, *, image_height, image_width, channels, vocab_size, text_len, dtype):
    """The VLMConfig of a config's model fields (patch_size, vit_d_model, vit_heads, vit_d_ff,
    vit_layers, d_model, num_heads, d_ff, num_layers, optional merge), the decoder long enough
    for the image tokens and `text_len` text tokens (what vwf_dyslexia and fetal_gauge read)."""
    merge = m.get("merge", 1)
    encoder = vit.ViTConfig(
        image_height=image_height,
        image_width=image_width,
        channels=channels,
        patch_size=m.patch_size,
        d_model=m.vit_d_model,
        num_heads=m.vit_heads,
        d_ff=m.vit_d_ff,
        num_layers=m.vit_layers,
        dtype=dtype,
    )
    decoder = transformer.TransformerConfig(
        vocab_size=vocab_size,
        num_layers=m.num_layers,
        d_model=m.d_model,
        num_heads=m.num_heads,
        d_ff=m.d_ff,
        max_len=encoder.num_tokens // merge**2 + text_len,
        dtype=dtype,
    )
    return VLMConfig(encoder, decoder, merge=merge)


def _merger(cfg: VLMConfig, rngs: nnx.Rngs) -> nnx.Linear:
    """Bias-free Linear(merge^2 vit d_model -> decoder d_model) in the decoder's dtypes."""
    d_in = cfg.merge**2 * cfg.vit.d_model
    return layers.dense_factory(cfg.decoder, rngs)(d_in, cfg.decoder.d_model)


MERGER = PureModule(_merger)


def merge_tokens(cfg: VLMConfig, tokens_BND):
    """[B, (H/p)(W/p), D] -> [B, N, merge^2 D]: each merge x merge block of the row-major patch
    grid concatenated (row-major inside the block), blocks in row-major order; the same
    rearrangement as patchifying the token grid, so `image.patchify` does it."""
    if cfg.merge == 1:
        return tokens_BND
    B, _, D = tokens_BND.shape
    rows, cols = cfg.vit.grid
    return image.patchify(tokens_BND.reshape(B, rows, cols, D), cfg.merge)


def init_params(cfg: VLMConfig, rng: jax.Array) -> dict:
    """{"vit": ..., "merger": {"kernel"}, "decoder": ...}; safe under `jax.eval_shape`."""
    rng_vit, rng_merger, rng_decoder = jax.random.split(rng, 3)
    return {
        "vit": vit.init_params(cfg.vit, rng_vit),
        "merger": MERGER.init(cfg, rng_merger),
        "decoder": transformer.init_params(cfg.decoder, rng_decoder),
    }


def capture_names(cfg: VLMConfig) -> tuple[str, ...]:
    """Every name `apply(..., capture=...)` accepts (module docstring)."""
    return (
        *(f"vit/{name}" for name in vit.capture_names(cfg.vit)),
        "merger",
        *(f"decoder/{name}" for name in transformer.capture_names(cfg.decoder)),
    )


def gate_names(cfg: VLMConfig) -> tuple[str, ...]:
    """The capture names of every decoder MLP's gate pre-activation, layer order (the VWF
    localiser's candidate units: gate_mask_LF's rows)."""
    return tuple(f"decoder/blocks/{i}/mlp/gate" for i in range(cfg.decoder.num_layers))


def _split_capture(cfg, capture):
    vit.keeper(capture_names(cfg), capture)  # the one-line error for an unknown name
    vit_names = tuple(n.removeprefix("vit/") for n in capture if n.startswith("vit/"))
    dec_names = tuple(n.removeprefix("decoder/") for n in capture if n.startswith("decoder/"))
    return vit_names, dec_names


def image_embeddings(cfg: VLMConfig, params: dict, images_BHWC, *, capture=()):
    """(image tokens [B, N, decoder d_model], captured "vit/..." names): what the decoder reads
    first."""
    tokens_BND, captured = vit.forward(cfg.vit, params["vit"], images_BHWC, capture=capture)
    merger = MERGER.bind(cfg, params["merger"])
    merged_BNM = merge_tokens(cfg, tokens_BND.astype(jnp.dtype(cfg.decoder.dtype)))
    return merger(merged_BNM), captured


def _decode(cfg, params, x_BTD, key_mask_BT, cache, gate_mask_LF, dec_names, captured):
    out = transformer.forward(
        cfg.decoder,
        params["decoder"],
        embeddings_BTD=x_BTD,
        key_mask_BT=key_mask_BT,
        cache=cache,
        capture=dec_names,
        gate_mask_LF=gate_mask_LF,
    )
    captured.update({f"decoder/{k}": v for k, v in out.captured.items()})
    return Output(out.logits_BTV, out.cache, captured)


def apply(
    cfg: VLMConfig,
    params: dict,
    images_BHWC,
    tokens_BT,
    *,
    capture=(),
    gate_mask_LF=None,
    text_key_mask_BT=None,
    cache: transformer.KVCache | None = None,
    image_BND=None,
) -> Output:
    """Output(logits [B, N + T, V] float32, advanced cache or None, captured) for images
    [B, H, W, C] and text tokens [B, T] placed after the N image tokens.

    capture: names from `capture_names`. gate_mask_LF [L, F]: the unit lesion (module
    docstring). text_key_mask_BT: False on padding text tokens (image tokens are always real).
    cache: from `init_cache`, empty (this call is the prefill); continue with `step`.
    image_BND: `image_embeddings` computed already (images_BHWC is then None): one encoded image
    read by several text rows (e.g. its tokens tiled over K answer options) is encoded once.
    """
    vit_names, dec_names = _split_capture(cfg, capture)
    if image_BND is None:
        image_BND, vit_captured = image_embeddings(cfg, params, images_BHWC, capture=vit_names)
    elif images_BHWC is not None or vit_names:
        raise ValueError("apply: give images_BHWC or image_BND (then no vit/ captures), not both")
    else:
        vit_captured = {}
    B, N, _ = image_BND.shape
    if tokens_BT.ndim != 2 or tokens_BT.shape[0] != B:
        raise ValueError(f"tokens have shape {tuple(tokens_BT.shape)}, expected ({B}, T)")
    captured = {f"vit/{k}": v for k, v in vit_captured.items()}
    if "merger" in capture:
        captured["merger"] = image_BND
    text_BTD = transformer.embed(cfg.decoder, params["decoder"], tokens_BT)
    x_BSD = jnp.concatenate([image_BND, text_BTD.astype(image_BND.dtype)], axis=1)
    key_mask_BS = None
    if text_key_mask_BT is not None:
        key_mask_BS = jnp.concatenate([jnp.ones((B, N), bool), text_key_mask_BT.astype(bool)], 1)
    return _decode(cfg, params, x_BSD, key_mask_BS, cache, gate_mask_LF, dec_names, captured)


def step(
    cfg: VLMConfig,
    params: dict,
    tokens_BT,
    cache: transformer.KVCache,
    *,
    capture=(),
    gate_mask_LF=None,
) -> Output:
    """A cached decoding call: T more text tokens after what `cache` holds (the image and the
    prompt from `apply(..., cache=)`); captures are "decoder/..." names only."""
    vit_names, dec_names = _split_capture(cfg, capture)
    if vit_names or "merger" in capture:
        raise ValueError("step: the image was encoded at the prefill; capture decoder names")
    x_BTD = transformer.embed(cfg.decoder, params["decoder"], tokens_BT)
    return _decode(cfg, params, x_BTD, None, cache, gate_mask_LF, dec_names, {})


def init_cache(cfg: VLMConfig, batch_size: int, max_len: int) -> transformer.KVCache:
    """An empty decoder cache of max_len slots (image tokens + prompt + generated text)."""
    return transformer.init_cache(cfg.decoder, batch_size, max_len)


def _splice_image(image_BND, x_BTD, tokens_BT, key_mask_BT, image_token):
    """x_BTD with the k-th placeholder of each row (counting over this call's T positions)
    replaced by image_BND[:, k]. Padding never counts (image_token may equal the pad id). The
    index is clipped so that non-placeholder positions (all of them in a T = 1 decode step)
    still gather a valid row, which jnp.where then discards."""
    is_image_BT = tokens_BT == image_token
    if key_mask_BT is not None:
        is_image_BT &= key_mask_BT.astype(bool)
    k_BT = jnp.clip(jnp.cumsum(is_image_BT, axis=1) - 1, 0, image_BND.shape[1] - 1)
    image_BTD = jnp.take_along_axis(image_BND, k_BT[..., None], axis=1)
    return jnp.where(is_image_BT[..., None], image_BTD.astype(x_BTD.dtype), x_BTD)


def _policy_apply(
    cfg: VLMConfig,
    image_token: int,
    params: dict,
    tokens_BT=None,
    *,
    positions_BT=None,
    key_mask_BT=None,
    cache=None,
    embeddings_BTD=None,
):
    """`Policy.apply` for params {"model", "image_BND"}: (logits [B, T, V] float32, cache)."""
    if (tokens_BT is None) == (embeddings_BTD is None):
        raise ValueError("pass exactly one of tokens_BT and embeddings_BTD")
    decoder = params["model"]["decoder"]
    if embeddings_BTD is None:  # soft tokens (the sampler's embeddings path) are fed as given
        text_BTD = transformer.embed(cfg.decoder, decoder, tokens_BT)
        embeddings_BTD = _splice_image(
            params["image_BND"], text_BTD, tokens_BT, key_mask_BT, image_token
        )
    out = transformer.forward(
        cfg.decoder,
        decoder,
        embeddings_BTD=embeddings_BTD,
        positions_BT=positions_BT,
        key_mask_BT=key_mask_BT,
        cache=cache,
    )
    return out.logits_BTV, out.cache


def _policy_embed(cfg: VLMConfig, params: dict, tokens_BT):
    return transformer.embed(cfg.decoder, params["model"]["decoder"], tokens_BT)


@functools.lru_cache(maxsize=64)
def _policy(cfg: VLMConfig, image_token: int) -> Policy:
    return Policy(
        apply=functools.partial(_policy_apply, cfg, image_token),
        init_cache=functools.partial(init_cache, cfg),
        embed=functools.partial(_policy_embed, cfg),
    )


def policy(cfg: VLMConfig, image_token: int) -> Policy:
    """The VLM as a `core.nn.policy.Policy`, for `core.nn.sampler` and `core.grpo`.

    Its params are {"model": vlm params, "image_BND": `image_embeddings(...)[0]`}; its prompts
    are left-padded [pad..., image_token x N, text...], the N placeholders (an id the caller
    reserves) standing where the image goes, so positions and the causal mask are those of
    `apply` on the unpadded text. A generated image_token would be read as the image's first
    token: keep the reserved id out of what the model emits. Cached per (cfg, image_token), so
    jit compiles once.
    """
    if (
        not isinstance(image_token, int)
        or isinstance(image_token, bool)
        or not 0 <= image_token < cfg.decoder.vocab_size
    ):
        raise ValueError(
            f"image_token={image_token!r} must be an int in [0, {cfg.decoder.vocab_size})"
        )
    return _policy(cfg, image_token)
