"""Compute precision from config: float32 on CPU, bfloat16 compute (float32 params) elsewhere."""

import jax
import jax.numpy as jnp

from core.errors import ConfigError

_NAMES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def compute_dtype(name: str, platform: str | None = None) -> str:
    """Resolve `config.dtype`: "auto" is float32 on CPU (no fast bf16 there) and bfloat16 on
    accelerators (`platform`, default: this process's backend; another for an ahead-of-time
    compile); explicit names are checked and returned unchanged."""
    if name == "auto":
        platform = platform or jax.default_backend()
        return "float32" if platform == "cpu" else "bfloat16"
    if name not in _NAMES:
        raise ConfigError(
            f"dtype={name!r} is unknown; expected auto or one of: {', '.join(_NAMES)}"
        )
    return name
