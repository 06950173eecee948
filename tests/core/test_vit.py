"""core.nn.vit: output shape and parameter paths, captures against a forward by hand (non-square
sin-cos positions included), bidirectional attention (patch permutation equivariance without
positions), config errors."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core.errors import ConfigError
from core.nn import attention, dit, vit

CFG = vit.ViTConfig(
    image_height=8,
    image_width=16,
    channels=2,
    patch_size=4,
    d_model=16,
    num_heads=2,
    d_ff=32,
    num_layers=2,
)
forward = jax.jit(vit.forward, static_argnums=0, static_argnames="capture")


@functools.lru_cache
def params_for(cfg=CFG):
    return vit.init_params(cfg, jax.random.key(0))


def images(cfg=CFG, batch=2, seed=1):
    shape = (batch, cfg.image_height, cfg.image_width, cfg.channels)
    return jax.random.normal(jax.random.key(seed), shape)


def test_tokens_shape_params_and_eval_shape():
    params = params_for()
    abstract = jax.eval_shape(functools.partial(vit.init_params, CFG), jax.random.key(0))
    assert jax.tree.structure(abstract) == jax.tree.structure(params)
    assert params["embed"]["kernel"].shape == (CFG.patch_dim, CFG.d_model)
    assert params["blocks"][1]["mlp"]["gate"]["kernel"].shape == (CFG.d_model, CFG.d_ff)
    assert CFG.grid == (2, 4) and CFG.num_tokens == 8
    tokens = vit.apply(CFG, params, images())
    assert tokens.shape == (2, 8, CFG.d_model) and tokens.dtype == jnp.float32


def test_sincos_table_on_a_rectangular_grid_encodes_row_then_column():
    rows, cols, dim = 2, 4, 8
    table = dit.sincos_positions(rows, dim, grid_cols=cols)
    assert table.shape == (rows * cols, dim)
    freqs = 1.0 / 10000.0 ** (np.arange(2) / 2)
    r, c = 1, 3  # token r * cols + c in patchify's row-major order
    expected = np.concatenate(
        [np.sin(r * freqs), np.cos(r * freqs), np.sin(c * freqs), np.cos(c * freqs)]
    )
    np.testing.assert_allclose(table[r * cols + c], expected, rtol=1e-6)  # float32 storage
    np.testing.assert_array_equal(dit.sincos_positions(3, dim), dit.sincos_positions(3, dim, 3))


def test_captures_equal_a_forward_by_hand():
    params, x = params_for(), images()
    names = vit.capture_names(CFG)
    out, captured = forward(CFG, params, x, capture=names)
    net = vit.model(CFG, params)
    rows, cols = CFG.grid
    h = dit.patchify(x, CFG.patch_size) @ params["embed"]["kernel"]
    h = h + dit.sincos_positions(rows, CFG.d_model, grid_cols=cols)
    # Equal up to float32 rounding of the same ops fused differently (jit against eager).
    close = functools.partial(np.testing.assert_allclose, rtol=2e-5, atol=2e-5)
    close(captured["embed"], h)
    B, N, _ = h.shape
    mask = attention.make_mask("bidirectional", jnp.ones((B, N), bool))
    for i, block in enumerate(net.blocks):
        attn, _ = block.attn(block.attn_norm(h), jnp.zeros((B, N), jnp.int32), mask)
        h = h + attn
        mlp_params = params["blocks"][i]["mlp"]
        gate = block.mlp_norm(h) @ mlp_params["gate"]["kernel"]
        up = block.mlp_norm(h) @ mlp_params["up"]["kernel"]
        mlp = (jax.nn.silu(gate) * up) @ mlp_params["down"]["kernel"]
        close(captured[f"blocks/{i}/attn"], attn)
        close(captured[f"blocks/{i}/mlp/gate"], gate)
        close(captured[f"blocks/{i}/mlp"], mlp)
        h = h + mlp
        close(captured[f"blocks/{i}"], h)
    close(captured["final_norm"], net.final_norm(h))
    np.testing.assert_array_equal(out, captured["final_norm"])


def test_attention_is_bidirectional_patches_permute_with_tokens_without_positions():
    cfg = dataclasses.replace(CFG, position="none")
    params, x = params_for(cfg), images(cfg)
    out, _ = forward(cfg, params, x)
    # Swap the first and the last patch: without positions the tokens swap and nothing else
    # changes (no causal mask, no hidden order); the first token did see the last patch.
    p = CFG.patch_size
    first, last = x[:, :p, :p], x[:, -p:, -p:]
    swapped = x.at[:, :p, :p].set(last).at[:, -p:, -p:].set(first)
    out_swapped, _ = forward(cfg, params, swapped)
    perm = np.arange(cfg.num_tokens)
    perm[[0, -1]] = perm[[-1, 0]]
    np.testing.assert_allclose(out_swapped, out[:, perm], rtol=1e-5, atol=1e-5)  # float32 sums
    changed = x.at[:, -p:, -p:].add(1.0)
    assert np.max(np.abs(forward(cfg, params, changed)[0][:, 0] - out[:, 0])) > 1e-3


def test_learned_positions_are_a_parameter_that_reaches_the_tokens():
    cfg = dataclasses.replace(CFG, position="learned")
    params = params_for(cfg)
    assert params["positions"].shape == (cfg.num_tokens, cfg.d_model)
    moved = jax.tree.map(lambda a: a, params)
    moved["positions"] = params["positions"].at[3].add(1.0)
    x = images(cfg)
    assert np.max(np.abs(forward(cfg, moved, x)[0] - forward(cfg, params, x)[0])) > 1e-3


@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("image_width", 18, "image_width=18 must be divisible by patch_size=4"),
        ("position", "rope", "ViTConfig.position: unknown 'rope'"),
        ("num_heads", 3, "divisible by num_heads=3"),
        ("num_layers", 0, "ViTConfig.num_layers must be a positive int"),
    ],
)
def test_config_errors_are_one_line(field, value, needle):
    with pytest.raises(ConfigError, match=needle):
        dataclasses.replace(CFG, **{field: value})


def test_wrong_image_shape_and_unknown_capture_raise():
    with pytest.raises(ValueError, match=r"expected \[B, 8, 16, 2\]"):
        vit.apply(CFG, params_for(), jnp.zeros((1, 16, 8, 2)))
    with pytest.raises(ValueError, match="unknown capture name"):
        vit.forward(CFG, params_for(), images(), capture=("blocks/9",))
