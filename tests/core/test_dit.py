"""core.nn.dit: patchify, adaLN-Zero at init, captured intermediates against a forward by hand,
the encode/decode split (and encoder sharing through core.diffusion), config errors; the 2-D
RoPE (scores see only 2-D offsets) and QK-norm (bounded scores) options."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core import diffusion
from core.errors import ConfigError
from core.nn import attention, dit, positions

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
# DDT's own backbone: 2-D RoPE (head dim 8: a row half and a column half of 4) and QK-norm.
ROPE = dataclasses.replace(DDT, position="rope2d", qk_norm=True)
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


def block_by_hand(block, h, cond, pos=None):
    """adaLN-Zero written out: x += gate * attn(norm(x)(1 + scale) + shift); same for the MLP."""
    mods = cond @ block.modulation.kernel[...] + block.modulation.bias[...]
    sa, ca, ga, sm, cm, gm = jnp.split(mods, 6, axis=-1)
    mask = attention.make_mask("bidirectional", jnp.ones(h.shape[:2], bool))
    a, _ = block.attn(block.attn_norm(h) * (1 + ca) + sa, pos, mask)
    h = h + ga * a
    return h + gm * block.mlp(block.mlp_norm(h) * (1 + cm) + sm)


@pytest.mark.parametrize("cfg", [DDT, PLAIN, ROPE], ids=["ddt", "plain", "rope"])
def test_captured_blocks_equal_a_forward_by_hand(cfg):
    params = trained_like(cfg)
    x, t, y = inputs(cfg)
    v, captured = apply(cfg, params, x, t, y, capture=dit.capture_names(cfg))
    net = dit.model(cfg, params)
    t_emb = net.t_embed(t)[:, None]
    c = jax.nn.silu(t_emb + net.y_embed(y)[:, None])
    h = net.encoder.tokens(x)
    pos = None
    if cfg.position == "rope2d":
        # No additive positions: the embedded patches alone; the grid goes to attention.
        np.testing.assert_array_equal(h, net.encoder.embed(dit.patchify(x, cfg.patch_size)))
        pos = jnp.broadcast_to(dit.grid_positions(cfg.grid), (*h.shape[:2], 2))
    for k, block in enumerate(net.encoder.blocks):
        h = block_by_hand(block, h, c, pos)
        assert_close(captured[f"encoder/blocks/{k}"], h)
    assert_close(captured["condition"], h)
    if cfg.decoder_blocks:
        cond = jax.nn.silu(t_emb + h)  # per token
        h = net.decoder.tokens(x)
        for k, block in enumerate(net.decoder.blocks):
            h = block_by_hand(block, h, cond, pos)
            assert_close(captured[f"decoder/blocks/{k}"], h)
    else:
        cond = c
    final = net.final
    mods = cond @ final.modulation.kernel[...] + final.modulation.bias[...]
    shift, scale = jnp.split(mods, 2, axis=-1)
    out = (final.norm(h) * (1 + scale) + shift) @ final.out.kernel[...] + final.out.bias[...]
    assert_close(v, dit.unpatchify(out, 2, cfg.image_size, cfg.image_size))


def rope2d_scores(q_K, k_K, q_pos, k_pos):
    """The score of query vector q at grid position q_pos against key k at k_pos, rope2d."""
    q = positions.rope2d(q_K[None, None, None], jnp.array([[q_pos]]))
    k = positions.rope2d(k_K[None, None, None], jnp.array([[k_pos]]))
    return float(jnp.sum(q * k))


def test_rope2d_scores_depend_only_on_the_2d_offset_and_on_both_axes():
    q, k = jax.random.normal(jax.random.key(0), (2, 16))
    base = rope2d_scores(q, k, (1, 2), (3, 0))
    # float32 rotations by angles up to ~10 rad: the dot product moves by ~1e-6 of |q||k| ~ 16.
    for shift in [(1, 0), (0, 5), (-4, 3), (7, 7)]:
        shifted = rope2d_scores(q, k, (1 + shift[0], 2 + shift[1]), (3 + shift[0], shift[1]))
        assert shifted == pytest.approx(base, abs=1e-4)
    # The offset itself matters, along the rows and along the columns separately, and the two
    # axes are not interchangeable (rows rotating both halves would fail each of these).
    by_row = rope2d_scores(q, k, (1, 2), (4, 0))
    by_col = rope2d_scores(q, k, (1, 2), (3, 1))
    assert abs(by_row - base) > 1e-2 and abs(by_col - base) > 1e-2
    assert abs(rope2d_scores(q, k, (0, 0), (2, 1)) - rope2d_scores(q, k, (0, 0), (1, 2))) > 1e-2


def test_qk_norm_bounds_every_score_whatever_the_input_size():
    attn = dit.model(ROPE, trained_like(ROPE)).encoder.blocks[0].attn
    B, N, H, K = 2, ROPE.num_tokens, ROPE.num_heads, ROPE.d_model // ROPE.num_heads
    x = 1e3 * jax.random.normal(jax.random.key(1), (B, N, ROPE.d_model))
    q_raw, k_raw = attn.q(x).reshape(B, N, H, K), attn.k(x).reshape(B, N, H, K)
    score = lambda q, k: jnp.max(jnp.abs(jnp.einsum("bthk,bshk->bhts", q, k))) / K**0.5  # noqa: E731
    # RMS 1 per head before the scales: |q| <= sqrt(K) max|scale_q|, the same for k, so a
    # score is at most sqrt(K) max|scale_q| max|scale_k| (float32 rounding: 1e-5 relative).
    bound = (
        K**0.5 * jnp.max(jnp.abs(attn.q_norm.scale[...])) * jnp.max(jnp.abs(attn.k_norm.scale[...]))
    )
    normed = score(attn.q_norm(q_raw), attn.k_norm(k_raw))
    assert float(normed) <= float(bound) * (1 + 1e-5)
    assert float(normed) > 0.1 * float(bound)  # not trivially small
    assert float(score(q_raw, k_raw)) > 100 * float(bound)  # without the norm: unbounded


def test_default_backbone_has_no_qk_norm_parameters():
    """The options are off by default: the parameter tree (checkpoints, sharding rules) of a
    default DiT is the one it had before they existed."""
    attn = init_params(DDT, jax.random.key(0))["encoder"]["blocks"][0]["attn"]
    assert sorted(attn) == ["k", "o", "q", "v"]
    attn = init_params(ROPE, jax.random.key(0))["encoder"]["blocks"][0]["attn"]
    assert sorted(attn) == ["k", "k_norm", "o", "q", "q_norm", "v"]


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
        (dict(position="rope2d", d_model=12, num_heads=2), "position='rope2d'"),
        (dict(qk_norm=1), "qk_norm"),
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
