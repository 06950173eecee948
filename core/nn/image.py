"""What image transformers share (DiT / DDT in `core.nn.dit`, the ViT in `core.nn.vit` and so
the VLM): row-major patches and their inverse, fixed 2-D sin-cos positions, patch grid
coordinates (for 2-D RoPE), and the config checks of an image block stack.

Shape suffixes: B batch, H W C image, N tokens, P patch features (p * p * C).
"""

import jax
import numpy as np

from core.errors import ConfigError
from core.nn import attention, layers

POSITIONS = ("sincos", "learned", "none")  # what core.nn.vit accepts too


def check_image_blocks(cfg, who: str, positions=POSITIONS) -> None:
    """The checks an image transformer's config shares (DiTConfig, core.nn.vit.ViTConfig):
    heads dividing d_model, the position encoding, the attention impl and the dtypes."""
    if cfg.d_model % cfg.num_heads:
        raise ConfigError(
            f"{who}.d_model={cfg.d_model} must be divisible by num_heads={cfg.num_heads}"
        )
    if cfg.position not in positions:
        raise ConfigError(
            f"{who}.position: unknown {cfg.position!r}; expected one of: " + ", ".join(positions)
        )
    if cfg.position == "sincos" and cfg.d_model % 4:
        raise ConfigError(
            f"{who}.d_model={cfg.d_model} must be divisible by 4 for position='sincos'"
        )
    try:
        attention.check_impl(cfg.attention_impl)
    except ValueError as e:
        raise ConfigError(f"{who}.attention_impl: {e}") from None
    for name in ("dtype", "param_dtype"):
        value = getattr(cfg, name)
        if not layers.is_float_dtype(value):
            raise ConfigError(f"{who}.{name} must name a float dtype, got {value!r}")


def patchify(x_BHWC: jax.Array, patch: int) -> jax.Array:
    """[B, H, W, C] -> [B, (H/p)(W/p), p*p*C]: row-major patches, each (row, col, channel)."""
    B, H, W, C = x_BHWC.shape
    x = x_BHWC.reshape(B, H // patch, patch, W // patch, patch, C)
    return x.transpose(0, 1, 3, 2, 4, 5).reshape(B, (H // patch) * (W // patch), patch**2 * C)


def unpatchify(x_BNP: jax.Array, patch: int, height: int, width: int) -> jax.Array:
    """The inverse of `patchify`: [B, N, p*p*C] -> [B, height, width, C]."""
    B, _, P = x_BNP.shape
    C = P // patch**2
    x = x_BNP.reshape(B, height // patch, width // patch, patch, patch, C)
    return x.transpose(0, 1, 3, 2, 4, 5).reshape(B, height, width, C)


def sincos_1d(index: np.ndarray, dim: int) -> np.ndarray:
    """Fixed 1-D positions [len(index), dim]: [sin, cos] of the index times
    10000^(-j / (dim/2)), j < dim/2 (MAE's and Brain-Semantoks' patch-index encoding)."""
    half = dim // 2
    freqs = 1.0 / 10000.0 ** (np.arange(half, dtype=np.float64) / half)
    angles = np.asarray(index, np.float64).reshape(-1, 1) * freqs
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)


def sincos_positions(grid: int, dim: int, grid_cols: int | None = None) -> np.ndarray:
    """Fixed 2-D absolute positions [grid * grid_cols, dim] (grid_cols default grid: square),
    row-major as `patchify`: half the features encode the row, half the column, each
    `sincos_1d` of the index in dim/2 features."""
    cols = grid if grid_cols is None else grid_cols
    rows, cols = np.meshgrid(np.arange(grid), np.arange(cols), indexing="ij")
    half = (dim // 4) * 2
    return np.concatenate([sincos_1d(rows, half), sincos_1d(cols, half)], axis=1).astype(np.float32)


def grid_positions(grid: int) -> np.ndarray:
    """(row, column) of every patch, row-major as `patchify`: int32 [grid * grid, 2]."""
    rows, cols = np.meshgrid(np.arange(grid), np.arange(grid), indexing="ij")
    return np.stack([rows.ravel(), cols.ravel()], axis=1).astype(np.int32)
