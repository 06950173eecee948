"""Position encodings applied to attention queries and keys.

Attention calls one entry, `apply_positions(kind, q, k, positions, base=...)`, so a model picks
its encoding with a config string and the attention code never branches on it.

Kinds:
  "none": q and k unchanged (the model only sees order through the causal mask).
  "rope": rotary embedding: pair j of each head's features is rotated by angle
          position * base^(-2j/K). Which features form pair j is the layout (`layout=`):
          "half" (the default; "rotate_half", GPT-NeoX, Hugging Face Llama): j and j + K/2;
          "interleaved" (GPT-J, Meta's Llama, llama.cpp's stored GGUF weights): 2j and 2j + 1.
          The two are the same model up to a permutation of each head's q and k features,
          `half_to_interleaved_columns` (and its inverse) on the q/k kernels' output columns.
  "rope2d": 2-D rotary embedding for a grid of patches (DDT's, as in EVA / FLUX): positions
          are [B, T, 2] (row, column); the first half of each head's features is a "rope"
          over the row, the second half a "rope" over the column, so a query-key score
          depends on the two positions only through their 2-D offset.
"""

import functools

import jax.numpy as jnp

POSITION_KINDS = ("none", "rope", "rope2d")
ROPE_LAYOUTS = ("half", "interleaved")


def check_layout(layout: str) -> None:
    """Raises the one-line error for an unknown rotary pair layout."""
    if layout not in ROPE_LAYOUTS:
        raise ValueError(
            f"unknown rope layout {layout!r}; expected one of: {', '.join(ROPE_LAYOUTS)}"
        )


def rope(x_BTHK, positions_BT, *, base: float = 10000.0, layout: str = "half"):
    """Rotates feature pair j of x by positions * base^(-2j/K); the pair is (j, j + K/2) for
    layout "half", (2j, 2j + 1) for "interleaved".

    Angles, sines and the rotation are computed in float32 and the result is cast back to
    x's dtype: bfloat16 angles lose integer precision above position 256.
    """
    check_layout(layout)
    K = x_BTHK.shape[-1]
    if K % 2:
        raise ValueError(f"rope needs an even head dim, got {K}")
    half = K // 2
    freqs_J = base ** (-2.0 * jnp.arange(half, dtype=jnp.float32) / K)
    angles_BTJ = positions_BT.astype(jnp.float32)[..., None] * freqs_J
    cos_BT1J = jnp.cos(angles_BTJ)[:, :, None, :]
    sin_BT1J = jnp.sin(angles_BTJ)[:, :, None, :]
    x_BTHK_f32 = x_BTHK.astype(jnp.float32)
    if layout == "interleaved":
        x_BTHJ2 = x_BTHK_f32.reshape(*x_BTHK.shape[:-1], half, 2)
        x1, x2 = x_BTHJ2[..., 0], x_BTHJ2[..., 1]
        out_BTHJ2 = jnp.stack([x1 * cos_BT1J - x2 * sin_BT1J, x2 * cos_BT1J + x1 * sin_BT1J], -1)
        return out_BTHJ2.reshape(x_BTHK.shape).astype(x_BTHK.dtype)
    x1, x2 = x_BTHK_f32[..., :half], x_BTHK_f32[..., half:]
    out = jnp.concatenate([x1 * cos_BT1J - x2 * sin_BT1J, x2 * cos_BT1J + x1 * sin_BT1J], -1)
    return out.astype(x_BTHK.dtype)


def half_to_interleaved_columns(kernel, num_heads: int):
    """A q or k kernel [..., num_heads * K] (heads' features along the last axis, as a Flax
    [in, out] kernel) with each head's features reordered from the "half" layout to the
    "interleaved" one: new feature 2j is old j, new 2j + 1 is old j + K/2. A "half" model and
    an "interleaved" model with its q/k kernels so permuted give the same scores (Hugging Face
    Llama weights vs llama.cpp's GGUF ones). NumPy or JAX arrays."""
    *lead, HK = kernel.shape
    K = HK // num_heads
    return kernel.reshape(*lead, num_heads, 2, K // 2).swapaxes(-1, -2).reshape(*lead, HK)


def interleaved_to_half_columns(kernel, num_heads: int):
    """The inverse of `half_to_interleaved_columns`: a GGUF-ordered q/k kernel [..., H * K]
    to the "half" layout."""
    *lead, HK = kernel.shape
    K = HK // num_heads
    return kernel.reshape(*lead, num_heads, K // 2, 2).swapaxes(-1, -2).reshape(*lead, HK)


def rope2d(x_BTHK, positions_BT2, *, base: float = 10000.0):
    """`rope` of the first half of x's head features by the row (positions[..., 0]) and of
    the second half by the column (positions[..., 1]). Needs a head dim divisible by 4."""
    K = x_BTHK.shape[-1]
    if K % 4:
        raise ValueError(f"rope2d needs a head dim divisible by 4, got {K}")
    if positions_BT2.ndim != 3 or positions_BT2.shape[-1] != 2:
        raise ValueError(
            f"rope2d needs positions [B, T, 2] (row, column), got {positions_BT2.shape}"
        )
    half = K // 2
    rows = rope(x_BTHK[..., :half], positions_BT2[..., 0], base=base)
    cols = rope(x_BTHK[..., half:], positions_BT2[..., 1], base=base)
    return jnp.concatenate([rows, cols], axis=-1)


def check_kind(kind: str) -> None:
    """Raises the one-line error for an unknown encoding (shared by configs and attention)."""
    if kind not in POSITION_KINDS:
        raise ValueError(
            f"unknown position encoding {kind!r}; expected one of: {', '.join(POSITION_KINDS)}"
        )


def apply_positions(
    kind: str, q_BTHK, k_BTHK, positions_BT, *, base: float = 10000.0, layout: str = "half"
):
    """Encodes positions into queries and keys; returns (q_BTHK, k_BTHK). `layout` is the
    "rope" pair layout (`rope`); "rope2d" keeps its own (half-split per axis).

    q and k share `positions_BT` because in self-attention (with or without a KV cache) each new
    token's query and key sit at the same position; cached keys were encoded when written.
    """
    check_kind(kind)
    if kind == "none":
        return q_BTHK, k_BTHK
    if kind == "rope":
        rotate = functools.partial(rope, positions_BT=positions_BT, base=base, layout=layout)
        return rotate(q_BTHK), rotate(k_BTHK)
    if kind == "rope2d":  # positions_BT is [B, T, 2] here
        return rope2d(q_BTHK, positions_BT, base=base), rope2d(k_BTHK, positions_BT, base=base)
    # A new kind plugs in here and in POSITION_KINDS. An input-dependent one (e.g. selective
    # rotary, whose angles are a cumulative sum of a projection of x) also needs x and, for
    # decoding, an angle offset carried in the KV cache; extend this signature and the cache then.
    raise AssertionError(kind)
