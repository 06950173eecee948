"""Uniform asymmetric quantisation as pure functions, and linear-layer products that use it.

The quantiser (b bits, 2 <= b <= 8; l and u the range of the data it is calibrated on):

    s = (u - l) / (2^b - 1),   z = clip(round(-l / s), 0, 2^b - 1)
    Q(x) = clip(round(x / s) + z, 0, 2^b - 1)    (integer codes)
    x_hat = s (Q(x) - z)                          (dequantised; fake_quant(x) = x_hat)

The range is first widened to include 0 (l <- min(l, 0), u <- max(u, 0)): then z needs no
clipping, 0 is exact, and inside [l, u] the error is at most s / 2 (without it, data with l > 0
would clip z to 0 and lose up to l near u). A value on the grid s (q - z) comes back exactly.
Weights are quantised per output channel (l, u over every axis but the last of a kernel
[..., out]), activations per tensor (one l, u from calibration data, `observe_dot_general`).

Two products for `nnx.Linear(dot_general=...)` (every linear layer in core.nn has one;
`patch_linears` swaps them in a freshly bound module):
- `fake_quant_dot_general`: quantise-dequantise both operands, then the float product. It
  simulates the numerics on any backend; on CPU it is extra elementwise work, so it is slower.
- `int8_dot_general`: the integer path for accelerators with int8 units: codes shifted into
  int8, an int8 x int8 -> int32 `dot_general`, and per-output-channel dequantisation with the
  zero-point cross terms in the epilogue. It equals the fake-quant product up to float rounding.

    store = {}
    observe = lambda path: quant.observe_dot_general(store, path)
    dit.apply(cfg, params, x, t, y, patch=partial(quant.patch_linears, choose=observe))
    act = quant.qparams(store[path]["min"], store[path]["max"], 8)   # per layer
    w4a8 = lambda path: quant.fake_quant_dot_general(act, 4)
    dit.apply(cfg, params, x, t, y, patch=partial(quant.patch_linears, choose=w4a8))
"""

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from core.nn import layers

# The smallest range a quantiser is given: a constant tensor (u == l) would make s = 0 and
# every code a division by zero; with this floor it maps to one code and comes back exactly.
MIN_RANGE = 1e-8


class QParams(NamedTuple):
    scale: jax.Array  # float32, broadcastable against the quantised tensor ([] or [out])
    zero: jax.Array  # float32, integer-valued zero point, same shape as scale
    bits: int  # static


def _check_bits(bits: int) -> None:
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ValueError(f"quantiser bits must be an int in 2..8, got {bits!r}")


def qparams(low, high, bits: int) -> QParams:
    """Scale and zero point of the b-bit quantiser of the range [low, high], widened to include
    0 (module docstring)."""
    _check_bits(bits)
    # With l > 0 the zero point clips to 0 and the grid s (q - z) would end at u - l < u, so
    # values near u would lose up to l; widening to 0 (as PyTorch's min-max observers do) keeps
    # every value of [l, u] within s / 2 of the grid and 0 exact.
    low = jnp.minimum(jnp.asarray(low, jnp.float32), 0.0)
    high = jnp.maximum(jnp.asarray(high, jnp.float32), 0.0)
    levels = 2**bits - 1
    scale = jnp.maximum(high - low, MIN_RANGE) / levels
    return QParams(scale, jnp.clip(jnp.round(-low / scale), 0, levels), bits)


def weight_qparams(kernel, bits: int) -> QParams:
    """Per output channel: one range per slice kernel[..., o]; scale and zero are [out]."""
    axes = tuple(range(kernel.ndim - 1))
    return qparams(jnp.min(kernel, axes), jnp.max(kernel, axes), bits)


def quantize(x, qp: QParams) -> jax.Array:
    """int32 codes in [0, 2^b - 1]."""
    q = jnp.round(x.astype(jnp.float32) / qp.scale) + qp.zero
    return jnp.clip(q, 0, 2**qp.bits - 1).astype(jnp.int32)


def dequantize(q, qp: QParams) -> jax.Array:
    return qp.scale * (q.astype(jnp.float32) - qp.zero)


def fake_quant(x, qp: QParams) -> jax.Array:
    """dequantize(quantize(x)) in x's dtype."""
    return dequantize(quantize(x, qp), qp).astype(x.dtype)


def fake_quant_dot_general(act: QParams | None, w_bits: int | None) -> Callable:
    """A dot_general whose lhs is fake-quantised per tensor with `act` and whose kernel per
    output channel with `w_bits` (None: that operand stays in float)."""

    def dot_general(lhs, rhs, dimension_numbers, **kwargs):
        if act is not None:
            lhs = fake_quant(lhs, act)
        if w_bits is not None:
            rhs = fake_quant(rhs, weight_qparams(rhs, w_bits))
        return layers.flat_dot_general(lhs, rhs, dimension_numbers, **kwargs)

    return dot_general


def _dense(lhs, rhs, dimension_numbers) -> None:
    (contract_lhs, contract_rhs), (batch_lhs, batch_rhs) = dimension_numbers
    if (
        batch_lhs
        or batch_rhs
        or tuple(contract_lhs) != (lhs.ndim - 1,)
        or tuple(contract_rhs) != (0,)
        or rhs.ndim != 2
    ):
        raise ValueError(
            f"int8_dot_general handles a dense layer only (x[..., D] @ W[D, F]), got "
            f"dimension_numbers={dimension_numbers} for shapes {lhs.shape}, {rhs.shape}"
        )


def int8_dot_general(act: QParams, w_bits: int) -> Callable:
    """The integer product (module docstring). With codes shifted by 2^(b-1) into int8,
    q' = q - 2^(b-1) and z' = z - 2^(b-1), per output channel o:

        y[o] = s_x s_w[o] (sum q'x q'w[:, o] - z'w[o] sum q'x - z'x sum q'w[:, o] + n z'x z'w[o])

    (n the contraction length): the first sum is the int8 x int8 -> int32 `dot_general`."""
    _check_bits(w_bits)

    def dot_general(lhs, rhs, dimension_numbers, **kwargs):
        del kwargs  # precision / preferred_element_type: the integer product fixes both
        _dense(lhs, rhs, dimension_numbers)
        w = weight_qparams(rhs, w_bits)
        shift_x, shift_w = 2 ** (act.bits - 1), 2 ** (w_bits - 1)
        qx_ND = (quantize(lhs, act) - shift_x).astype(jnp.int8).reshape(-1, lhs.shape[-1])
        qw_DF = (quantize(rhs, w) - shift_w).astype(jnp.int8)
        acc_NF = jax.lax.dot_general(
            qx_ND, qw_DF, (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32
        )
        zx, zw_F = act.zero - shift_x, w.zero - shift_w
        sum_x_N1 = jnp.sum(qx_ND, axis=1, keepdims=True, dtype=jnp.int32).astype(jnp.float32)
        sum_w_F = jnp.sum(qw_DF, axis=0, dtype=jnp.int32).astype(jnp.float32)
        n = lhs.shape[-1]
        y = acc_NF.astype(jnp.float32) - zw_F * sum_x_N1 - zx * sum_w_F + n * zx * zw_F
        y = act.scale * w.scale * y
        return y.reshape(*lhs.shape[:-1], rhs.shape[-1]).astype(lhs.dtype)

    return dot_general


def observe_dot_general(store: dict, name: str) -> Callable:
    """A float dot_general that records store[name] = {"min", "max": its lhs's range (traced
    scalars), "macs": multiply-accumulates (an int)}; a layer called again under the same name
    widens the range and adds its MACs."""

    def dot_general(lhs, rhs, dimension_numbers, **kwargs):
        low, high = jnp.min(lhs), jnp.max(lhs)
        macs = math.prod(lhs.shape[:-1]) * math.prod(rhs.shape)
        if name in store:
            seen = store[name]
            low, high = jnp.minimum(low, seen["min"]), jnp.maximum(high, seen["max"])
            macs += seen["macs"]
        store[name] = {"min": low, "max": high, "macs": macs}
        return layers.flat_dot_general(lhs, rhs, dimension_numbers, **kwargs)

    return dot_general


def _linears(module):
    for path, node in nnx.iter_graph(module):
        if isinstance(node, nnx.Linear):
            yield "/".join(str(p) for p in path), node


def linear_paths(module) -> list[str]:
    """ "/"-joined paths of every nnx.Linear in the module ("encoder/blocks/0/attn/q", ...)."""
    return [path for path, _ in _linears(module)]


def patch_linears(module, choose: Callable[[str], Callable | None]):
    """Every nnx.Linear at path p gets dot_general = choose(p) unless that is None. In place:
    pass a freshly bound module (e.g. through `core.nn.dit.model(..., patch=)`), never a
    shared one. Returns the module."""
    for path, linear in _linears(module):
        product = choose(path)
        if product is not None:
            linear.dot_general = product
    return module


def bops(macs: int, w_bits: int, a_bits: int) -> int:
    """Bit operations of `macs` multiply-accumulates (float32 counts as 32 bits)."""
    return macs * w_bits * a_bits
