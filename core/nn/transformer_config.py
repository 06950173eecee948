"""`TransformerConfig`: the decoder's hyperparameters, checked when made (one-line
`ConfigError`s, a `ValueError`), frozen and hashable so it can be a static jit argument; and
`flops_per_token`, the training cost a config implies.

Llama's options (issue 39), each defaulting to the model this package always had:
  num_kv_heads    None = num_heads (multi-head attention); fewer = grouped-query attention:
                  query head h reads kv head h // (num_heads // num_kv_heads) (Hugging Face's
                  and llama.cpp's grouping); k/v kernels [D, num_kv_heads * head_dim], the KV
                  cache [L, B, S, num_kv_heads, head_dim]. `cfg.kv_heads` is the resolved count.
  tie_embeddings  True = no lm_head: logits = final_norm(h) @ embed.embedding.T.
  rope_layout     "half" (feature j pairs with j + K/2) or "interleaved" (pairs (2j, 2j+1));
                  `core.nn.positions.ROPE_LAYOUTS`.
  norm_eps        every RMSNorm's epsilon (1e-6; Llama checkpoints say 1e-5 or 1e-6).
"""

import dataclasses
import numbers
from collections.abc import Callable

from core.errors import ConfigError
from core.nn import attention, layers, positions


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
    num_kv_heads: int | None = None  # None = num_heads; fewer = grouped-query attention
    tie_embeddings: bool = False  # True: the output projection is embed.embedding.T
    rope_layout: str = "half"  # core.nn.positions.ROPE_LAYOUTS
    norm_eps: float = 1e-6  # every RMSNorm's epsilon

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
        kv = self.num_kv_heads
        if kv is not None and (
            isinstance(kv, bool) or not isinstance(kv, numbers.Integral) or kv <= 0
        ):
            raise ConfigError(f"TransformerConfig.num_kv_heads must be a positive int, got {kv!r}")
        if kv is not None and self.num_heads % kv:
            raise ConfigError(
                f"TransformerConfig.num_kv_heads={kv} must divide num_heads={self.num_heads}"
            )
        if not isinstance(self.tie_embeddings, bool):
            raise ConfigError(
                f"TransformerConfig.tie_embeddings must be a bool, got {self.tie_embeddings!r}"
            )
        eps = self.norm_eps
        if isinstance(eps, bool) or not (isinstance(eps, numbers.Real) and eps > 0):
            raise ConfigError(f"TransformerConfig.norm_eps must be > 0, got {self.norm_eps!r}")
        for name, check in (
            ("position", attention.check_positions),
            ("rope_layout", positions.check_layout),
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

    @property
    def kv_heads(self) -> int:
        """The number of key/value heads: num_kv_heads, or num_heads when that is None."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads


def flops_per_token(cfg: TransformerConfig, seq_len: int) -> float:
    """Training FLOPs (forward + backward) per token, the standard estimate (Kaplan et al.;
    PaLM appendix B):

        6 * N_matmul + 12 * num_layers * seq_len * d_model

    N_matmul = num_layers * (2 D^2 + 2 D kv_dim + 3 D d_ff) + D * vocab_size counts the weights
    that take part in a matmul (the embedding lookup and norms do not): q and o are [D, D], k
    and v [D, kv_dim] with kv_dim = kv_heads * head_dim (= D without grouped-query attention),
    and the output projection costs D * V whether or not it is tied to the embedding. The
    second term is the QK^T and AV products (2 matmuls x 2 FLOPs x 3 for fwd+bwd; grouped
    queries still each score every key), counted over the full context even though the causal
    mask makes half of it zeros. Divide by 3 for inference.
    """
    D, F, L = cfg.d_model, cfg.d_ff, cfg.num_layers
    kv_dim = cfg.kv_heads * cfg.head_dim
    n_matmul = L * (2 * D * D + 2 * D * kv_dim + 3 * D * F) + D * cfg.vocab_size
    return float(6 * n_matmul + 12 * L * seq_len * D)
