"""TTE_u's embedding heads (methods/tte/heads.py): the mhsa head copied from the backbone
reproduces it, both heads ignore padding, and bad configs raise one-line ConfigErrors."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core.contrastive import last_valid
from core.errors import ConfigError
from core.nn import transformer
from methods.tte import heads
from methods.tte.heads import HeadConfig

DECODER = transformer.TransformerConfig(
    vocab_size=32, num_layers=4, d_model=32, num_heads=2, d_ff=64, max_len=16
)
L = DECODER.num_layers
HEADS = {
    "top": HeadConfig(kind="mhsa", layer=L - 2, num_blocks=1),  # copies the backbone's last block
    "mhsa": HeadConfig(kind="mhsa", layer=0, num_blocks=2),
    "pooler": HeadConfig(kind="pooler", num_queries=3),
}
# float32 on CPU: the copied head recomputes the backbone's last block with the same ops (0.0
# apart, observed); a padded row and the row alone sum over different lengths (~5e-7 apart).
# 1e-5 leaves room and still catches a wrong block or a mask leak, which differ by O(1).
TOL = dict(rtol=1e-5, atol=1e-5)


@functools.cache
def backbone():
    """A random reasoner, drawn in numpy (eager jax init compiles op by op: ~2 s). Norm scales
    are not 1 (as after pretraining) so the tests also check that the final norm is copied."""
    shapes = jax.eval_shape(functools.partial(transformer.init_params, DECODER), jax.random.key(0))
    rng = np.random.default_rng(0)

    def draw(path, leaf):
        if jax.tree_util.keystr(path).endswith("['scale']"):
            return jnp.asarray(1.0 + 0.5 * rng.standard_normal(leaf.shape), jnp.float32)
        return jnp.asarray(rng.standard_normal(leaf.shape) / np.sqrt(leaf.shape[0]), jnp.float32)

    return jax.tree_util.tree_map_with_path(draw, shapes)


@functools.cache
def head_params():
    init = jax.jit(heads.init_head, static_argnums=(0, 1))  # one compile, not one per op
    return {k: init(cfg, DECODER, backbone(), jax.random.key(3)) for k, cfg in HEADS.items()}


def tokens_and_mask(side="right"):
    """Two padded rows of lengths 7 and 4 (padding ids are arbitrary: masked out)."""
    tokens_BT = np.random.default_rng(2).integers(0, DECODER.vocab_size, (2, 10), np.int32)
    mask_BT = np.arange(10)[None, :] < np.array([[7], [4]])
    return jnp.asarray(tokens_BT), jnp.asarray(mask_BT if side == "right" else mask_BT[:, ::-1])


# One jit for the backbone and every head: a compile per input shape (op-by-op dispatch took
# ~12 s for this file).
@jax.jit
def embed_all(params, head_params, tokens_BT, mask_BT):
    """Each head's embedding, through the frozen reasoner's captured states, and "backbone":
    the reasoner's own last valid final-norm state."""
    names = [heads.reasoner_states(DECODER, cfg) for cfg in HEADS.values()]
    captured = transformer.forward(
        DECODER, params, tokens_BT, key_mask_BT=mask_BT, capture=(*names, "final_norm"), head=False
    ).captured
    out = {"backbone": last_valid(captured["final_norm"], mask_BT)}
    for (key, cfg), name in zip(HEADS.items(), names, strict=True):
        out[key] = heads.head_embed(cfg, DECODER, head_params[key], captured[name], mask_BT)
    return out


# Left padding too: there the head must mask the padded keys as the backbone did (right
# padding alone cannot tell, causal attention never reaches past the last valid token).
@pytest.mark.parametrize("side", ["right", "left"])
def test_mhsa_head_copied_from_backbone_reproduces_it(side):
    assert heads.reasoner_states(DECODER, HEADS["top"]) == f"blocks/{L - 2}"
    out = embed_all(backbone(), head_params(), *tokens_and_mask(side))
    np.testing.assert_allclose(out["top"], out["backbone"], **TOL)


def test_mhsa_head_from_a_wrong_block_does_not_reproduce_the_backbone():
    # The planted bug of the test above: block L-2 copied in place of block L-1.
    wrong = dict(head_params())
    wrong["top"] = {**wrong["top"], "blocks": {0: backbone()["blocks"][L - 2]}}
    out = embed_all(backbone(), wrong, *tokens_and_mask())
    assert np.abs(np.asarray(out["top"] - out["backbone"])).max() > 1e-2


def test_padded_rows_embed_as_the_rows_alone():
    tokens_BT, mask_BT = tokens_and_mask()
    padded = embed_all(backbone(), head_params(), tokens_BT, mask_BT)
    for b, n in enumerate(np.asarray(mask_BT).sum(1)):
        alone_1T = tokens_BT[b : b + 1, :n]
        alone = embed_all(backbone(), head_params(), alone_1T, jnp.ones_like(alone_1T, bool))
        for key in HEADS:
            np.testing.assert_allclose(padded[key][b : b + 1], alone[key], **TOL, err_msg=key)


def test_pooler_ignores_the_states_at_padded_positions():
    tokens_BT, mask_BT = tokens_and_mask()
    h_BTD = transformer.features(DECODER, backbone(), tokens_BT, key_mask_BT=mask_BT)
    noise_BTD = 1e4 * jax.random.normal(jax.random.key(4), h_BTD.shape)
    garbage_BTD = jnp.where(mask_BT[..., None], h_BTD, noise_BTD)
    embed = jax.jit(functools.partial(heads.head_embed, HEADS["pooler"], DECODER))
    e_BD = embed(head_params()["pooler"], h_BTD, mask_BT)
    # Masked probabilities are exactly 0, so the padded values never enter the sum.
    np.testing.assert_array_equal(e_BD, embed(head_params()["pooler"], garbage_BTD, mask_BT))


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(kind="mean"), "kind"),
        (dict(layer=-1), "layer"),
        (dict(layer=True), "layer"),
        (dict(num_blocks=0), "num_blocks"),
        (dict(num_queries=0), "num_queries"),
    ],
)
def test_bad_head_configs_raise(fields, match):
    with pytest.raises(ConfigError, match=match):
        HeadConfig(**fields)


@pytest.mark.parametrize("layer, num_blocks", [(L - 1, 1), (L - 3, 3), (L, 1)])
def test_mhsa_blocks_past_the_top_raise(layer, num_blocks):
    head_cfg = HeadConfig(kind="mhsa", layer=layer, num_blocks=num_blocks)
    with pytest.raises(ConfigError, match="num_layers"):
        heads.init_head(head_cfg, DECODER, backbone(), jax.random.key(3))
    with pytest.raises(ConfigError, match="num_layers"):
        heads.reasoner_states(DECODER, head_cfg)


def test_states_of_the_wrong_width_raise():
    h_BTD, mask_BT = jnp.zeros((2, 5, 8)), jnp.ones((2, 5), bool)
    with pytest.raises(ConfigError, match="h_BTD"):
        heads.head_embed(HEADS["pooler"], DECODER, head_params()["pooler"], h_BTD, mask_BT)
