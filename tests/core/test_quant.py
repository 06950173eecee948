"""core.quant: the uniform asymmetric quantiser, its two linear-layer products, the range
observer and the linear-layer patching."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from core import quant
from core.nn import layers

DENSE = (((2,), (0,)), ((), ()))  # x[B, T, D] @ W[D, F], as nnx.Linear calls it


def test_values_on_the_grid_come_back_exactly():
    for bits in (4, 8):
        qp = quant.qparams(-1.3, 2.1, bits)
        grid = qp.scale * (jnp.arange(2**bits, dtype=jnp.float32) - qp.zero)
        np.testing.assert_array_equal(np.asarray(quant.fake_quant(grid, qp)), np.asarray(grid))


@pytest.mark.parametrize("bits", [4, 8])
def test_error_is_at_most_half_a_step_inside_the_range(bits):
    low, high = -0.7, 1.9
    qp = quant.qparams(low, high, bits)
    x = jnp.linspace(low, high, 10_001)
    err = jnp.abs(quant.fake_quant(x, qp) - x)
    # s / 2 plus float32 rounding of x / s and s (q - z) on values ~2: ~1e-6.
    assert float(err.max()) <= float(qp.scale) / 2 + 1e-6
    assert float(err.max()) > float(qp.scale) / 4  # the bound is tight: a real quantiser ran


@pytest.mark.parametrize("low, high, zero", [(0.5, 3.0, 0.0), (-3.0, -0.5, 255.0)])
def test_one_signed_data_keeps_the_zero_point_in_range_and_the_error_bound(low, high, zero):
    qp = quant.qparams(low, high, 8)
    assert float(qp.zero) == zero
    x = jnp.linspace(low, high, 1001)
    # The top of [0.5, 3] is within s / 2 (+ float rounding), not clipped to u - l = 2.5.
    assert float(jnp.abs(quant.fake_quant(x, qp) - x).max()) <= float(qp.scale) / 2 + 1e-6
    codes = quant.quantize(jnp.array([-10.0, 0.0, 1.0, 10.0]), qp)
    assert int(codes.min()) >= 0 and int(codes.max()) <= 255
    with pytest.raises(ValueError, match="bits"):
        quant.qparams(0.0, 1.0, 9)


def test_a_constant_tensor_quantises_without_dividing_by_zero():
    qp = quant.qparams(0.25, 0.25, 8)
    np.testing.assert_allclose(np.asarray(quant.fake_quant(jnp.full(3, 0.25), qp)), 0.25)


def test_weight_scales_are_per_output_channel():
    kernel = jax.random.normal(jax.random.key(0), (16, 3)) * jnp.array([0.01, 1.0, 100.0])
    qp = quant.weight_qparams(kernel, 4)
    assert qp.scale.shape == (3,)
    for o in range(3):
        alone = quant.qparams(kernel[:, o].min(), kernel[:, o].max(), 4)
        np.testing.assert_allclose(float(qp.scale[o]), float(alone.scale), rtol=1e-6)
    # The small column keeps its precision: its error is far below the big column's step.
    err = jnp.abs(quant.fake_quant(kernel, qp) - kernel)
    assert float(err[:, 0].max()) < 1e-3 * float(qp.scale[2])


@pytest.mark.parametrize("w_bits", [8, 4])
def test_int8_path_matches_fake_quant_and_runs_in_integers(w_bits):
    x = jax.random.normal(jax.random.key(1), (2, 5, 32)) + 0.3
    w = jax.random.normal(jax.random.key(2), (32, 8)) * jnp.linspace(0.1, 2.0, 8)
    act = quant.qparams(x.min(), x.max(), 8)
    fake = quant.fake_quant_dot_general(act, w_bits)(x, w, DENSE)
    exact = quant.int8_dot_general(act, w_bits)(x, w, DENSE)
    assert exact.shape == fake.shape == (2, 5, 8)
    # Same codes; float32 sums of 32 dequantised products (~|y| 1e-6 each) vs exact int32 sums.
    np.testing.assert_allclose(np.asarray(exact), np.asarray(fake), rtol=0, atol=1e-4)
    assert float(jnp.abs(fake - x @ w).max()) > 1e-3  # both really quantised
    jaxpr = jax.make_jaxpr(lambda x: quant.int8_dot_general(act, w_bits)(x, w, DENSE))(x)
    dots = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]
    assert len(dots) == 1  # no float product beside the integer one
    assert [str(v.aval.dtype) for v in dots[0].invars] == ["int8", "int8"]
    assert str(dots[0].outvars[0].aval.dtype) == "int32"


def test_int8_path_refuses_a_non_dense_product():
    act = quant.qparams(-1.0, 1.0, 8)
    with pytest.raises(ValueError, match="dense layer only"):
        quant.int8_dot_general(act, 8)(jnp.ones((2, 3)), jnp.ones((2, 4)), (((0,), (0,)), ((), ())))


def test_observer_records_range_and_macs_and_combines_on_reuse():
    store = {}
    observe = quant.observe_dot_general(store, "layer")
    x = jnp.array([[[-2.0, 0.5], [1.0, 3.0]]])  # [1, 2, 2]
    w = jnp.ones((2, 5))
    np.testing.assert_allclose(np.asarray(observe(x, w, DENSE)), np.asarray(x @ w))
    assert (float(store["layer"]["min"]), float(store["layer"]["max"])) == (-2.0, 3.0)
    assert store["layer"]["macs"] == 1 * 2 * 2 * 5
    observe(x * 2, w, DENSE)
    assert (float(store["layer"]["min"]), float(store["layer"]["max"])) == (-4.0, 6.0)
    assert store["layer"]["macs"] == 2 * 20


class _TwoLayers(nnx.Module):
    def __init__(self, rngs):
        dense = functools.partial(nnx.Linear, dot_general=layers.flat_dot_general, rngs=rngs)
        self.first, self.second = dense(4, 4), dense(4, 2)

    def __call__(self, x):
        return self.second(jax.nn.relu(self.first(x)))


def test_patch_linears_changes_only_the_chosen_layer():
    module = _TwoLayers(nnx.Rngs(0))
    assert quant.linear_paths(module) == ["first", "second"]
    x = jax.random.normal(jax.random.key(3), (3, 4))
    first_before, out_before = module.first(x), module(x)
    w4 = quant.fake_quant_dot_general(None, 2)  # 2-bit weights: a visible change
    quant.patch_linears(module, lambda path: w4 if path == "second" else None)
    np.testing.assert_array_equal(np.asarray(module.first(x)), np.asarray(first_before))
    assert float(jnp.abs(module(x) - out_before).max()) > 1e-3


def test_bops():
    assert quant.bops(10, 4, 8) == 320
