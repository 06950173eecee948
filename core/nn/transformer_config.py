"""`TransformerConfig`: the decoder's hyperparameters, checked when made (one-line
`ConfigError`s, a `ValueError`), frozen and hashable so it can be a static jit argument."""

import dataclasses
import numbers
from collections.abc import Callable

from core.errors import ConfigError
from core.nn import attention, layers


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Hyperparameters; frozen and hashable so it can be a static jit argument."""

    vocab_size: int
    num_layers: int
    d_model: int
    num_heads: int
    d_ff: int
    max_len: int
    position: str | Callable = "rope"  # a kind name or a position function (core.nn.attention)
    rope_base: float = 10000.0
    dtype: str = "float32"
    param_dtype: str = "float32"
    attention_mask: str = "causal"  # core.nn.attention.MASKS
    attention_impl: str = "xla"  # core.nn.attention.IMPLS

    def __post_init__(self):
        for name in ("vocab_size", "num_layers", "d_model", "num_heads", "d_ff", "max_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
                raise ConfigError(f"TransformerConfig.{name} must be a positive int, got {value!r}")
        if self.d_model % self.num_heads:
            raise ConfigError(
                f"TransformerConfig.d_model={self.d_model} must be divisible by "
                f"num_heads={self.num_heads}"
            )
        for name, check in (
            ("position", attention.check_positions),
            ("attention_mask", attention.check_mask),
            ("attention_impl", attention.check_impl),
        ):
            try:
                check(getattr(self, name))
            except ValueError as e:
                raise ConfigError(f"TransformerConfig.{name}: {e}") from None
        if self.position == "rope2d":  # apply's positions are token indices [B, T]
            raise ConfigError(
                "TransformerConfig.position='rope2d' needs (row, column) patch positions; a "
                "token decoder has 1-D positions (rope2d is core.nn.dit's, for image patches)"
            )
        if self.position == "rope" and self.head_dim % 2:
            raise ConfigError(
                f"TransformerConfig.d_model/num_heads={self.head_dim} (head dim) must be even "
                "for position='rope'"
            )
        if not self.rope_base > 0:
            raise ConfigError(f"TransformerConfig.rope_base must be > 0, got {self.rope_base!r}")
        for name in ("dtype", "param_dtype"):
            value = getattr(self, name)
            if not layers.is_float_dtype(value):
                raise ConfigError(
                    f"TransformerConfig.{name} must name a float dtype, got {value!r}"
                )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads
