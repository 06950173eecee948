"""Layers shared by the models in `core.nn` and in methods: RMSNorm, a dense-layer factory, the
SwiGLU MLP and the pre-norm residual block.

They are Flax NNX modules (models are built from them inside; pure functions over plain
pytrees are what crosses into the core, see `core/nn/transformer.py`). Each reads its dtypes
from a config with `dtype` (compute) and `param_dtype` fields, so any model config can use them.

Attribute names are parameter paths ("attn_norm/scale", "mlp/gate/kernel"), which checkpoints
and sharding rules match: renaming one breaks both.
"""

import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax


class RMSNorm(nnx.Module):
    """RMSNorm computed in float32 whatever the input dtype, output cast to `dtype`."""

    def __init__(self, dim: int, *, dtype, param_dtype, eps: float = 1e-6):
        self.scale = nnx.Param(jnp.ones((dim,), param_dtype))
        self.dtype = dtype
        self.eps = eps

    def __call__(self, x_BTD):
        x = x_BTD.astype(jnp.float32)
        x = x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps)
        return (x * self.scale[...].astype(jnp.float32)).astype(self.dtype)


def is_float_dtype(value) -> bool:
    """Whether `value` names a floating dtype ("float32", jnp.bfloat16, ...): what the model
    configs' `dtype` / `param_dtype` fields accept."""
    try:
        return bool(jnp.issubdtype(jnp.dtype(value), jnp.floating))
    except TypeError:
        return False


def norm_factory(cfg):
    """RMSNorm(dim) in `cfg.dtype` output and `cfg.param_dtype` scale, epsilon `cfg.norm_eps`
    (1e-6 for a config without that field)."""
    return functools.partial(
        RMSNorm,
        dtype=jnp.dtype(cfg.dtype),
        param_dtype=jnp.dtype(cfg.param_dtype),
        eps=getattr(cfg, "norm_eps", 1e-6),
    )


def flat_dot_general(lhs, rhs, dimension_numbers, **kwargs):
    """`lax.dot_general` for a dense layer, with the input's leading dims merged into one.

    `nnx.Linear(..., dot_general=flat_dot_general)` computes x[B, T, D] @ W[D, F] as
    x[B*T, D] @ W, then reshapes back: the same product. What changes is the gradient: for W
    it contracts one dim (B*T) instead of two (B, T), which XLA:CPU runs as a plain matmul
    where the 3-D form gets layout transposes around it (a SwiGLU MLP's gradient was 2.5x
    slower in the 3-D form at the LM's quick size, side by side in `methods/lm/bench.py`).
    A reshape that merges row-major leading dims is free on every backend. Any other
    contraction (batched, or not over the last dim) goes to `lax.dot_general` unchanged.
    """
    (contract_lhs, contract_rhs), (batch_lhs, batch_rhs) = dimension_numbers
    dense = (
        not batch_lhs
        and not batch_rhs
        and tuple(contract_lhs) == (lhs.ndim - 1,)
        and tuple(contract_rhs) == (0,)
        and rhs.ndim == 2
        and kwargs.get("out_sharding") is None  # a 3-D output sharding has no 2-D form here
    )
    if not dense or lhs.ndim == 2:
        return lax.dot_general(lhs, rhs, dimension_numbers, **kwargs)
    lead = lhs.shape[:-1]
    out = lax.dot_general(lhs.reshape(-1, lhs.shape[-1]), rhs, (((1,), (0,)), ((), ())), **kwargs)
    return out.reshape(*lead, out.shape[-1])


def dense_factory(cfg, rngs: nnx.Rngs):
    """Bias-free linear layers in `cfg.dtype` compute and `cfg.param_dtype` parameters."""
    return functools.partial(
        nnx.Linear,
        use_bias=False,
        dtype=jnp.dtype(cfg.dtype),
        param_dtype=jnp.dtype(cfg.param_dtype),
        dot_general=flat_dot_general,
        rngs=rngs,
    )


class SwiGLU(nnx.Module):
    """down(silu(gate(x)) * up(x)); three [D, F]/[F, D] kernels, so d_ff ~ 8/3 d_model
    matches a 4x GELU MLP's parameter count. Reads cfg.d_model and cfg.d_ff."""

    def __init__(self, cfg, rngs: nnx.Rngs):
        dense = dense_factory(cfg, rngs)
        self.gate = dense(cfg.d_model, cfg.d_ff)
        self.up = dense(cfg.d_model, cfg.d_ff)
        self.down = dense(cfg.d_ff, cfg.d_model)

    def __call__(self, x_BTD):
        return self.with_gate(x_BTD)[0]

    def with_gate(self, x_BTD, gate_mask_F=None):
        """(output, gate_BTF): gate_BTF is the gate projection's output before SiLU, multiplied
        by gate_mask_F [F] along the unit axis when given (a lesion: 0 silences unit f at every
        position, since SiLU(0) = 0; another value scales its pre-activation). Without a mask
        the product is skipped, so the output is the plain MLP's, bit for bit."""
        gate_BTF = self.gate(x_BTD)
        if gate_mask_F is not None:
            gate_BTF = gate_BTF * gate_mask_F.astype(gate_BTF.dtype)
        return self.down(jax.nn.silu(gate_BTF) * self.up(x_BTD)), gate_BTF


class PreNormBlock(nnx.Module):
    """x += mixer(norm(x)); x += mlp(norm(x)), the mixer (attention, a recurrence) given.

    Parameters sit under `<mixer_name>_norm`, `<mixer_name>`, `mlp_norm` and `mlp` (the
    transformer names its mixer "attn", methods/selective_rope "mixer"); the mixer is built
    before the MLP, so parameter initialisation draws in the same order as a hand-written block.

    The mixer returns (y_BTD, aux) (aux: its cache, angles, ...). The block returns
    (x_BTD, aux, sublayers) with sublayers = {"<mixer_name>": y_BTD, "mlp": the MLP's output,
    "mlp/gate": the SwiGLU gate before SiLU [B, T, F]}, for callers that capture
    intermediates. gate_mask_F [F] (keyword) multiplies that gate (`SwiGLU.with_gate`).
    """

    def __init__(self, cfg, mixer: nnx.Module, rngs: nnx.Rngs, *, mixer_name: str = "attn"):
        norm = norm_factory(cfg)
        self.mixer_name = mixer_name
        setattr(self, f"{mixer_name}_norm", norm(cfg.d_model))
        setattr(self, mixer_name, mixer)
        self.mlp_norm = norm(cfg.d_model)
        self.mlp = SwiGLU(cfg, rngs)

    def __call__(self, x_BTD, *mixer_args, gate_mask_F=None, **mixer_kwargs):
        name = self.mixer_name
        norm, mixer = getattr(self, f"{name}_norm"), getattr(self, name)
        y_BTD, aux = mixer(norm(x_BTD), *mixer_args, **mixer_kwargs)
        x_BTD = x_BTD + y_BTD
        mlp_BTD, gate_BTF = self.mlp.with_gate(self.mlp_norm(x_BTD), gate_mask_F)
        return x_BTD + mlp_BTD, aux, {name: y_BTD, "mlp": mlp_BTD, "mlp/gate": gate_BTF}
