"""core.nn.layers.flat_dot_general: the same dense product and gradient as lax.dot_general."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from core.nn import layers

DENSE = (((2,), (0,)), ((), ()))  # x[B, T, D] @ W[D, F]


def _inputs():
    rng = np.random.default_rng(0)
    x_BTD = jnp.asarray(rng.standard_normal((3, 5, 8)), jnp.float32)
    w_DF = jnp.asarray(rng.standard_normal((8, 6)), jnp.float32)
    return x_BTD, w_DF


def test_flat_dense_product_and_gradients_equal_the_3d_form():
    x_BTD, w_DF = _inputs()
    flat = layers.flat_dot_general(x_BTD, w_DF, DENSE)
    np.testing.assert_array_equal(flat, lax.dot_general(x_BTD, w_DF, DENSE))

    def loss(dot):
        return lambda x, w: jnp.sum(jnp.sin(dot(x, w, DENSE)))

    grads_flat = jax.grad(loss(layers.flat_dot_general), argnums=(0, 1))(x_BTD, w_DF)
    grads_3d = jax.grad(loss(lax.dot_general), argnums=(0, 1))(x_BTD, w_DF)
    for g_flat, g_3d in zip(grads_flat, grads_3d, strict=True):
        # The weight gradient sums the B*T rows in another order: float32 rounding of a
        # 15-term sum of O(1) products, ~1e-6 relative; a wrong reshape is O(1) off.
        np.testing.assert_allclose(g_flat, g_3d, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "dims, rhs_shape",
    [
        ((((1,), (0,)), ((), ())), (5, 4)),  # contracts a middle dim: not a dense layer
        ((((2,), (1,)), ((0,), (0,))), (3, 8, 4)),  # batched matmul
    ],
    ids=["middle-contraction", "batched"],
)
def test_other_contractions_are_passed_through_unchanged(dims, rhs_shape):
    x_BTD, _ = _inputs()
    rhs = jnp.ones(rhs_shape, jnp.float32)
    np.testing.assert_array_equal(
        layers.flat_dot_general(x_BTD, rhs, dims), lax.dot_general(x_BTD, rhs, dims)
    )


def test_transformer_dense_layers_use_the_flat_form():
    """Every dense layer of the LM (q/k/v/o, the MLP, the head) is built with it, so a layer
    added with Flax's default dot would show here."""
    from flax import nnx

    from core.nn import transformer

    cfg = transformer.TransformerConfig(
        vocab_size=11, num_layers=1, d_model=8, num_heads=2, d_ff=16, max_len=4
    )
    model = transformer.Transformer(cfg, nnx.Rngs(0))
    linears = [m for _, m in nnx.iter_graph(model) if isinstance(m, nnx.Linear)]
    assert len(linears) == 8  # q, k, v, o, gate, up, down, lm_head
    assert all(m.dot_general is layers.flat_dot_general for m in linears)
