"""A ViT encoder for images [B, H, W, C] (any aspect ratio): Flax NNX inside, pure functions over
plain pytrees outside (as `core.nn.transformer`).

    params = init_params(cfg, rng)
    tokens_BND = apply(cfg, params, images_BHWC)                 # N = (H/p)(W/p) tokens
    tokens_BND, captured = forward(cfg, params, images_BHWC, capture=("blocks/1",))

Architecture: patchify (row-major p x p patches, `core.nn.image.patchify`) -> Linear(p*p*C, D)
(bias-free, like every dense layer here) -> + positions -> num_layers x `PreNormBlock`
[RMSNorm -> bidirectional MHA (no rotary) -> residual; RMSNorm -> SwiGLU -> residual] ->
RMSNorm. Positions (cfg.position): "sincos" (fixed 2-D sin-cos, `image.sincos_positions` on the
rows x cols grid), "learned" (a [N, D] table, normal(0.02)) or "none". No class token: a
consumer pools or reads the N patch tokens (the VLM feeds all of them to its decoder).

Capture names (`capture_names`): "embed" (patch embeddings + positions), "blocks/<i>/attn",
"blocks/<i>/mlp" (a block's residual updates), "blocks/<i>/mlp/gate" (the SwiGLU gate before
SiLU), "blocks/<i>" (the residual stream after block i), "final_norm" (= the output tokens).

Shape suffixes: B batch, H W C image, N tokens, D d_model, F d_ff.
"""

import dataclasses
import functools
import numbers

import jax
import jax.numpy as jnp
from flax import nnx

from core.errors import ConfigError
from core.nn import attention, image, layers
from core.nn.pure import PureModule

POSITIONS = image.POSITIONS


@dataclasses.dataclass(frozen=True)
class ViTConfig:
    """Hyperparameters; frozen and hashable so it can be a static jit argument."""

    image_height: int
    image_width: int
    channels: int
    patch_size: int
    d_model: int
    num_heads: int
    d_ff: int
    num_layers: int
    position: str = "sincos"
    dtype: str = "float32"
    param_dtype: str = "float32"
    attention_impl: str = "xla"  # core.nn.attention.IMPLS

    def __post_init__(self):
        ints = ("image_height", "image_width", "channels", "patch_size", "d_model")
        for name in (*ints, "num_heads", "d_ff", "num_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
                raise ConfigError(f"ViTConfig.{name} must be a positive int, got {value!r}")
        for name in ("image_height", "image_width"):
            if getattr(self, name) % self.patch_size:
                raise ConfigError(
                    f"ViTConfig.{name}={getattr(self, name)} must be divisible by "
                    f"patch_size={self.patch_size}"
                )
        image.check_image_blocks(self, "ViTConfig")

    @property
    def grid(self) -> tuple[int, int]:
        """Patches per column and per row: (H/p, W/p)."""
        return self.image_height // self.patch_size, self.image_width // self.patch_size

    @property
    def num_tokens(self) -> int:
        rows, cols = self.grid
        return rows * cols

    @property
    def patch_dim(self) -> int:
        return self.patch_size**2 * self.channels


class ViT(nnx.Module):
    def __init__(self, cfg: ViTConfig, rngs: nnx.Rngs):
        self.embed = layers.dense_factory(cfg, rngs)(cfg.patch_dim, cfg.d_model)
        if cfg.position == "learned":
            init = nnx.initializers.normal(0.02)
            shape = (cfg.num_tokens, cfg.d_model)
            self.positions = nnx.Param(init(rngs.params(), shape, jnp.dtype(cfg.param_dtype)))
        mha = functools.partial(
            attention.MultiHeadAttention, positions="none", impl=cfg.attention_impl
        )
        self.blocks = nnx.List(
            [layers.PreNormBlock(cfg, mha(cfg, rngs), rngs) for _ in range(cfg.num_layers)]
        )
        self.final_norm = layers.norm_factory(cfg)(cfg.d_model)
        self.cfg = cfg

    def __call__(self, images_BHWC, keep):
        cfg = self.cfg
        patches_BNP = image.patchify(images_BHWC.astype(jnp.dtype(cfg.dtype)), cfg.patch_size)
        x_BND = self.embed(patches_BNP)
        if cfg.position == "sincos":
            rows, cols = cfg.grid
            table_ND = image.sincos_positions(rows, cfg.d_model, grid_cols=cols)
            x_BND = x_BND + table_ND.astype(x_BND.dtype)
        elif cfg.position == "learned":
            x_BND = x_BND + self.positions[...].astype(x_BND.dtype)
        keep("embed", x_BND)
        B, N, _ = x_BND.shape
        mask_BNN = attention.make_mask("bidirectional", jnp.ones((B, N), bool))
        positions_BN = jnp.zeros((B, N), jnp.int32)  # unused: position "none" in attention
        for i, block in enumerate(self.blocks):
            x_BND, _, sub = block(x_BND, positions_BN, mask_BNN)
            for name in ("attn", "mlp", "mlp/gate"):
                keep(f"blocks/{i}/{name}", sub[name])
            keep(f"blocks/{i}", x_BND)
        out_BND = self.final_norm(x_BND)
        keep("final_norm", out_BND)
        return out_BND


MODULE = PureModule(ViT)


def model(cfg: ViTConfig, params: dict) -> ViT:
    """The NNX module holding `params` (for code that walks the layers by hand, e.g. tests)."""
    return MODULE.bind(cfg, params)


def init_params(cfg: ViTConfig, rng: jax.Array) -> dict:
    """Fresh parameters as a nested dict of arrays (params["blocks"][0]["attn"]["q"]["kernel"],
    ...). Safe under `jax.eval_shape`."""
    return MODULE.init(cfg, rng)


def capture_names(cfg: ViTConfig) -> tuple[str, ...]:
    """Every name `forward(..., capture=...)` accepts (module docstring)."""
    per_block = [
        f"blocks/{i}{suffix}"
        for i in range(cfg.num_layers)
        for suffix in ("/attn", "/mlp", "/mlp/gate", "")
    ]
    return ("embed", *per_block, "final_norm")


def keeper(names, capture):
    """(captured dict, keep(name, value)) for the requested `capture` names, after a one-line
    error for a name outside `names`."""
    unknown = sorted(set(capture) - set(names))
    if unknown:
        raise ValueError(
            f"unknown capture name(s) {', '.join(unknown)}; expected any of: " + ", ".join(names)
        )
    captured = {}

    def keep(name, value):
        if name in capture:
            captured[name] = value

    return captured, keep


def check_images(cfg: ViTConfig, images_BHWC) -> None:
    expected = (cfg.image_height, cfg.image_width, cfg.channels)
    if images_BHWC.ndim != 4 or tuple(images_BHWC.shape[1:]) != expected:
        raise ValueError(
            f"images have shape {tuple(images_BHWC.shape)}, expected "
            f"[B, {', '.join(map(str, expected))}]"
        )


def forward(cfg: ViTConfig, params: dict, images_BHWC, *, capture=()):
    """(tokens_BND in cfg.dtype, captured): the encoder's output tokens and the intermediates
    named in `capture` (`capture_names`)."""
    check_images(cfg, images_BHWC)
    captured, keep = keeper(capture_names(cfg), capture)
    return model(cfg, params)(images_BHWC, keep), captured


def apply(cfg: ViTConfig, params: dict, images_BHWC) -> jax.Array:
    """The output tokens [B, N, D], N = (H/p)(W/p) in row-major patch order."""
    return forward(cfg, params, images_BHWC)[0]
