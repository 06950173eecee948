"""`DiTConfig`: the hyperparameters of `core.nn.dit`'s diffusion transformer (DiT, or DDT's
condition encoder + velocity decoder), checked on construction; see that module for the model.
`from_fields` builds one from a config's model fields."""

import dataclasses
import numbers

from core.errors import ConfigError
from core.nn.image import POSITIONS, check_image_blocks

DIT_POSITIONS = (*POSITIONS, "rope2d")


@dataclasses.dataclass(frozen=True)
class DiTConfig:
    """Hyperparameters; frozen and hashable so it can be a static jit argument."""

    image_size: int  # square images [B, image_size, image_size, channels]
    channels: int
    patch_size: int
    d_model: int
    num_heads: int
    d_ff: int
    encoder_blocks: int
    decoder_blocks: int  # 0: plain DiT (no condition/velocity split)
    num_classes: int  # labels 0..num_classes-1; num_classes is the null class
    position: str = "sincos"  # DIT_POSITIONS
    qk_norm: bool = False
    time_scale: float = 1000.0  # t in [0, 1] (flow) -> DiT's integer-step frequency range
    freq_dim: int = 256  # width of the sinusoidal timestep features
    dtype: str = "float32"
    param_dtype: str = "float32"
    attention_impl: str = "xla"  # core.nn.attention.IMPLS

    def __post_init__(self):
        positive = ("image_size", "channels", "patch_size", "d_model", "num_heads", "d_ff")
        for name in (*positive, "encoder_blocks", "num_classes", "freq_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
                raise ConfigError(f"DiTConfig.{name} must be a positive int, got {value!r}")
        d = self.decoder_blocks
        if isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 0:
            raise ConfigError(f"DiTConfig.decoder_blocks must be an int >= 0, got {d!r}")
        if self.image_size % self.patch_size:
            raise ConfigError(
                f"DiTConfig.image_size={self.image_size} must be divisible by "
                f"patch_size={self.patch_size}"
            )
        if self.freq_dim % 2:
            raise ConfigError(f"DiTConfig.freq_dim must be even, got {self.freq_dim}")
        check_image_blocks(self, "DiTConfig", DIT_POSITIONS)
        head_dim = self.d_model // self.num_heads
        if self.position == "rope2d" and head_dim % 4:
            raise ConfigError(
                f"DiTConfig.position='rope2d' needs a head dim (d_model / num_heads = {head_dim}) "
                "divisible by 4"
            )
        if not isinstance(self.qk_norm, bool):
            raise ConfigError(f"DiTConfig.qk_norm must be a bool, got {self.qk_norm!r}")

    @property
    def grid(self) -> int:
        """Patches per side."""
        return self.image_size // self.patch_size

    @property
    def num_tokens(self) -> int:
        return self.grid**2

    @property
    def patch_dim(self) -> int:
        return self.patch_size**2 * self.channels


def from_fields(m, *, image_size: int, channels: int, num_classes: int, dtype: str) -> DiTConfig:
    """The DiTConfig of a config's model fields (patch_size, d_model, num_heads, d_ff,
    encoder_blocks; optional decoder_blocks (0: plain DiT), position, qk_norm), a bad value one
    ConfigError line starting "model:" (what dupa and quant_cache read)."""
    try:
        return DiTConfig(
            image_size=image_size,
            channels=channels,
            patch_size=m.patch_size,
            d_model=m.d_model,
            num_heads=m.num_heads,
            d_ff=m.d_ff,
            encoder_blocks=m.encoder_blocks,
            decoder_blocks=m.get("decoder_blocks", 0),
            position=m.get("position", "sincos"),
            qk_norm=m.get("qk_norm", False),
            num_classes=num_classes,
            dtype=dtype,
        )
    except ValueError as e:  # ConfigError is one too: keep its text, name the block
        raise ConfigError(f"model: {e}") from None
