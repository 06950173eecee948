"""core.nn.dit: patchify, adaLN-Zero at init, captured intermediates against a forward by hand,
the encode/decode split (and encoder sharing through core.diffusion), config errors."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core import diffusion
from core.errors import ConfigError
from core.nn import attention, dit

DDT = dit.DiTConfig(
    image_size=4,
    channels=2,
    patch_size=2,
    d_model=16,
    num_heads=2,
    d_ff=32,
    encoder_blocks=2,
    decoder_blocks=2,
    num_classes=3,
)
PLAIN = dataclasses.replace(DDT, decoder_blocks=0, position="learned")
init_params = jax.jit(dit.init_params, static_argnums=0)
apply = jax.jit(dit.apply, static_argnums=0, static_argnames="capture")


@functools.lru_cache
def trained_like(cfg):
    """Params with every leaf perturbed, so no block is the identity (as at init)."""
    params = init_params(cfg, jax.random.key(0))
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    noisy = [
        p + 0.2 * jax.random.normal(k, p.shape, p.dtype) for p, k in zip(leaves, keys, strict=True)
    ]
    return jax.tree.unflatten(tree, noisy)


def assert_close(actual, expected):
    """Equal up to float32 rounding of the same ops fused differently (jit against eager, or
    inside lax.cond): 5e-5 of the array's scale. Measured up to 9e-6 of it, on the output,
    which a modulated norm computes from decoder activations ~100x its size."""
    np.testing.assert_allclose(actual, expected, atol=5e-5 * float(np.max(np.abs(expected))))


def inputs(cfg, batch=3):
    x = jax.random.normal(jax.random.key(2), (batch, cfg.image_size, cfg.image_size, cfg.channels))
    t = jnp.linspace(0.1, 0.9, batch)
    y = jnp.arange(batch) % (cfg.num_classes + 1)  # includes the null class
    return x, t, y


def test_patchify_then_unpatchify_is_the_identity_and_patches_are_row_major():
    x = jnp.arange(2 * 6 * 4 * 3, dtype=jnp.float32).reshape(2, 6, 4, 3)
    tokens = dit.patchify(x, 2)
    assert tokens.shape == (2, 6, 12)
    np.testing.assert_array_equal(tokens[:, 1], x[:, 0:2, 2:4].reshape(2, 12))  # row 0, col 1
    np.testing.assert_array_equal(dit.unpatchify(tokens, 2, 6, 4), x)


@pytest.mark.parametrize("cfg", [DDT, PLAIN], ids=["ddt", "plain"])
def test_adaln_zero_outputs_exactly_zero_at_init(cfg):
    params = init_params(cfg, jax.random.key(0))
    v, _ = apply(cfg, params, *inputs(cfg))
    assert v.shape == (3, 4, 4, 2) and v.dtype == jnp.float32
    np.testing.assert_array_equal(v, 0.0)
    # ... and the zeros are the modulation / output layers', not a dead network:
    v, _ = apply(cfg, trained_like(cfg), *inputs(cfg))
    assert np.min(np.abs(v)) > 0


def block_by_hand(block, h, cond):
    """adaLN-Zero written out: x += gate * attn(norm(x)(1 + scale) + shift); same for the MLP."""
    mods = cond @ block.modulation.kernel[...] + block.modulation.bias[...]
    sa, ca, ga, sm, cm, gm = jnp.split(mods, 6, axis=-1)
    mask = attention.make_mask("bidirectional", jnp.ones(h.shape[:2], bool))
    a, _ = block.attn(block.attn_norm(h) * (1 + ca) + sa, None, mask)
    h = h + ga * a
    return h + gm * block.mlp(block.mlp_norm(h) * (1 + cm) + sm)


@pytest.mark.parametrize("cfg", [DDT, PLAIN], ids=["ddt", "plain"])
def test_captured_blocks_equal_a_forward_by_hand(cfg):
    params = trained_like(cfg)
    x, t, y = inputs(cfg)
    v, captured = apply(cfg, params, x, t, y, capture=dit.capture_names(cfg))
    net = dit.model(cfg, params)
    t_emb = net.t_embed(t)[:, None]
    c = jax.nn.silu(t_emb + net.y_embed(y)[:, None])
    h = net.encoder.tokens(x)
    for k, block in enumerate(net.encoder.blocks):
        h = block_by_hand(block, h, c)
        assert_close(captured[f"encoder/blocks/{k}"], h)
    assert_close(captured["condition"], h)
    if cfg.decoder_blocks:
        cond = jax.nn.silu(t_emb + h)  # per token
        h = net.decoder.tokens(x)
        for k, block in enumerate(net.decoder.blocks):
            h = block_by_hand(block, h, cond)
            assert_close(captured[f"decoder/blocks/{k}"], h)
    else:
        cond = c
    final = net.final
    mods = cond @ final.modulation.kernel[...] + final.modulation.bias[...]
    shift, scale = jnp.split(mods, 2, axis=-1)
    out = (final.norm(h) * (1 + scale) + shift) @ final.out.kernel[...] + final.out.bias[...]
    assert_close(v, dit.unpatchify(out, 2, 4, 4))


def test_encode_decode_split_and_label_conditioning():
    params = trained_like(DDT)
    x, t, y = inputs(DDT)
    v, _ = apply(DDT, params, x, t, y)
    s, _ = dit.encode(DDT, params, x, t, y)
    assert s.shape == (3, DDT.num_tokens, DDT.d_model)
    assert_close(dit.decode(DDT, params, x, t, y, s)[0], v)
    # The label reaches the output only through the encoder's s in DDT.
    v_null, _ = apply(DDT, params, x, t, jnp.full_like(y, dit.null_label(DDT)))
    assert np.max(np.abs(v_null - v)) > 1e-3
    assert dit.drop_labels(DDT, jax.random.key(0), y, 1.0).tolist() == [3, 3, 3]


def test_dit_encoder_sharing_r1_equals_sampling_without_the_split():
    params = trained_like(DDT)
    x, _, y = inputs(DDT)
    enc, dec = dit.sampler_fns(DDT, params)
    whole = diffusion.unsplit(lambda x, t, y: dit.apply(DDT, params, x, t, y)[0])
    run = jax.jit(lambda enc, dec: diffusion.euler(enc, dec, x, y, steps=3), static_argnums=(0, 1))
    assert_close(run(enc, dec), run(*whole))


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(image_size=5), "image_size"),
        (dict(num_heads=3), "d_model"),
        (dict(position="rope"), "position"),
        (dict(decoder_blocks=-1), "decoder_blocks"),
        (dict(attention_impl="flash"), "attention_impl"),
    ],
)
def test_bad_config_is_a_one_line_error_naming_the_field(change, field):
    with pytest.raises(ConfigError, match=f"DiTConfig.{field}") as info:
        dataclasses.replace(DDT, **change)
    assert "\n" not in str(info.value)


def test_bad_inputs_and_capture_names():
    params = init_params(DDT, jax.random.key(0))
    x, t, y = inputs(DDT)
    with pytest.raises(ValueError, match="x has shape"):
        dit.apply(DDT, params, x[:, :2], t, y)
    with pytest.raises(ValueError, match="unknown capture"):
        dit.apply(DDT, params, x, t, y, capture=("decoder/blocks/5",))
