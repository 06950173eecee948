"""One precision policy for every method: the compute dtype and the default matmul precision.

    config.dtype             "auto" | "float32" | "bfloat16" | "float16"
    config.matmul_precision  "auto" | "default" | "high" | "highest"

The compute dtype is the method's to apply (activations and matmul inputs; parameters stay
float32): a method reads it with `compute_dtype(config.dtype, supported=...)`, and a method that
only computes in float32 says so there, so `dtype=bfloat16` is refused in one line rather than
ignored. The matmul precision is the core's to apply: `core.train` traces every step,
evaluation step and init under `jax.default_matmul_precision(matmul_precision(config))`, and
calls a method's host `evaluate` and `hook` in that context, so no method can forget it. "auto"
is "highest" when the compute dtype is float32 (float32 means float32: without it a float32
matmul is one bfloat16 pass on TPU and TF32 on recent NVIDIA GPUs) and "default" otherwise
(bfloat16 inputs need no extra passes). An op that must differ from the policy passes
`precision=` itself (e.g. TPC's MiniLM, HIGHEST to match its reference); explicit arguments
win over the default.
"""

import jax
import jax.numpy as jnp

from core.errors import ConfigError

_NAMES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
MATMUL_PRECISIONS = ("default", "high", "highest")


def compute_dtype(
    name: str,
    supported: tuple[str, ...] = tuple(_NAMES),
    why: str = "",
    platform: str | None = None,
) -> str:
    """Resolve `config.dtype` for a method computing in one of `supported` (`why`: the reason a
    method supports fewer, for the error). "auto" is float32 on CPU (no fast bfloat16 there) and
    bfloat16 on accelerators (`platform`, default: this process's backend; another for an
    ahead-of-time compile); a method without bfloat16 refuses "auto" (its config says
    dtype="float32", which is also what `matmul_precision` reads)."""
    if name not in ("auto", *_NAMES):
        raise ConfigError(
            f"dtype={name!r} is unknown; expected auto or one of: {', '.join(_NAMES)}"
        )
    if name == "auto" and "bfloat16" in supported:
        return "float32" if (platform or jax.default_backend()) == "cpu" else "bfloat16"
    if name not in supported:
        raise ConfigError(
            f"dtype={name!r} is not supported by this method: it computes in "
            f"{', '.join(supported)}{' (' + why + ')' if why else ''}"
        )
    return name


def matmul_precision(config) -> str:
    """The default precision of every matmul the core traces for `config` (see the module)."""
    name = config.get("matmul_precision", "auto")
    if name == "auto":
        dtype = config.get("dtype", "auto")
        # A method's own restriction is not known here, but a float32-only method's make()
        # refuses dtype="auto", so "auto" here is a method that has bfloat16.
        return "highest" if compute_dtype(dtype) == "float32" else "default"
    if name not in MATMUL_PRECISIONS:
        raise ConfigError(
            f"matmul_precision={name!r} is unknown; expected auto or one of: "
            f"{', '.join(MATMUL_PRECISIONS)}"
        )
    return name


def scope(config):
    """A context in which everything traced gets the config's default matmul precision (for
    the host calls the core makes into a method: its `evaluate` and `hook`, which may jit)."""
    return jax.default_matmul_precision(matmul_precision(config))


def traced_with(config, fn):
    """`fn` traced under the config's default matmul precision (the context is read at trace
    time, so wrapping the Python function is enough; explicit `precision=` arguments win)."""
    precision = matmul_precision(config)

    def wrapped(*args, **kwargs):
        with jax.default_matmul_precision(precision):
            return fn(*args, **kwargs)

    return wrapped
