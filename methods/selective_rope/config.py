"""The hyperparameters of methods/selective_rope's sequence models (`model.py` describes them).

cfg = ModelConfig(vocab_size=3, num_classes=3, model="gla", position="selective")
"""

import dataclasses
import numbers

MODELS = ("gla", "transformer")
POSITIONS = ("selective", "rope", "none")
PHI_PARAMETRIZATIONS = ("low-rank", "full-rank")
TEMP_TYPES = ("rope", "rfa")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters; frozen and hashable (a static jit argument and an lru_cache key)."""

    vocab_size: int
    num_classes: int
    model: str = "gla"
    position: str = "selective"
    num_layers: int = 1
    d_model: int = 64
    num_heads: int = 4
    d_ff: int = 128
    # Selective RoPE
    phi_parametrization: str = "low-rank"
    phi_rank: int = 16
    conv_size: int = 4
    conv_silu: bool = False
    use_bias: bool = True
    use_gate: bool = False
    temp_type: str = "rope"
    temp_theta: float = 1.0
    temp_max: float = 1.0
    rotary_impl: str = "auto"
    # RoPE
    rope_base: float = 10000.0
    # softmax transformer
    qk_norm: bool = True
    # GLA
    gate_rank: int = 16
    gate_normalizer: float = 16.0
    output_gate: bool = True
    short_conv: bool = True  # GLA: causal depthwise conv (kernel 4) + SiLU on q, k and v
    gla_chunk: int = 8  # chunk length of the chunked form; 0: the sequential scan
    dtype: str = "float32"
    param_dtype: str = "float32"

    def __post_init__(self):
        for name in ("vocab_size", "num_classes", "num_layers", "d_model", "num_heads", "d_ff"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        for name, value, allowed in (
            ("model", self.model, MODELS),
            ("position", self.position, POSITIONS),
            ("phi_parametrization", self.phi_parametrization, PHI_PARAMETRIZATIONS),
            ("temp_type", self.temp_type, TEMP_TYPES),
        ):
            if value not in allowed:
                raise ValueError(
                    f"ModelConfig.{name}={value!r} is unknown; expected one of: "
                    f"{', '.join(allowed)}"
                )
        if self.d_model % self.num_heads:
            raise ValueError(
                f"ModelConfig.d_model={self.d_model} must be divisible by "
                f"num_heads={self.num_heads}"
            )
        if self.position != "none" and self.head_dim % 2:
            raise ValueError(
                f"ModelConfig head dim d_model/num_heads={self.head_dim} must be even for "
                f"position={self.position!r}"
            )
        if self.temp_type == "rope" and not self.temp_theta >= 1.0:
            raise ValueError("ModelConfig.temp_theta must be >= 1 for temp_type='rope'")
        if self.temp_type == "rfa" and not 0.0 < self.temp_theta < 1.0:
            raise ValueError("ModelConfig.temp_theta must be in (0, 1) for temp_type='rfa'")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads
