"""core.nn.vlm: image tokens precede text, a patch reaches the logits only through the encoder
(gradient check), the gate captures against a forward by hand, the unit lesion masks units (not
positions) at every position and every cached step, one compiled function for every mask and
vmap over masks equal to a loop; the sampler's policy (image placeholders in a left-padded
prompt) gives apply's logits and its greedy decoding."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from core.errors import ConfigError
from core.nn import attention, sampler, transformer, vit, vlm

CFG = vlm.VLMConfig(
    vit=vit.ViTConfig(
        image_height=8,
        image_width=16,
        channels=1,
        patch_size=4,
        d_model=16,
        num_heads=2,
        d_ff=32,
        num_layers=2,
    ),
    decoder=transformer.TransformerConfig(
        vocab_size=13, num_layers=2, d_model=24, num_heads=2, d_ff=40, max_len=32
    ),
)
N, L, F = CFG.num_image_tokens, CFG.decoder.num_layers, CFG.decoder.d_ff
apply = jax.jit(vlm.apply, static_argnums=0, static_argnames="capture")
step = jax.jit(vlm.step, static_argnums=0, static_argnames="capture")
GATES = vlm.gate_names(CFG)


@functools.lru_cache
def params():
    return vlm.init_params(CFG, jax.random.key(0))


def images(batch=2, seed=1):
    return jax.random.normal(jax.random.key(seed), (batch, 8, 16, 1))


def tokens(batch=2, length=5, seed=2):
    return jax.random.randint(jax.random.key(seed), (batch, length), 0, CFG.decoder.vocab_size)


def test_image_tokens_precede_text_and_never_see_it():
    x, t = images(), tokens()
    out = apply(CFG, params(), x, t, capture=("decoder/embed", "merger"))
    assert out.logits_BTV.shape == (2, N + 5, CFG.decoder.vocab_size)
    embed = out.captured["decoder/embed"]
    np.testing.assert_array_equal(embed[:, :N], out.captured["merger"])
    image_tokens, _ = vlm.image_embeddings(CFG, params(), x)
    np.testing.assert_allclose(embed[:, :N], image_tokens, rtol=1e-5, atol=1e-6)  # jit/eager
    np.testing.assert_array_equal(
        embed[:, N:], transformer.embed(CFG.decoder, params()["decoder"], t)
    )
    # Causal over [image; text]: the image positions' logits ignore the text (exactly: masked
    # probabilities are 0), while every text position reads the image.
    other = apply(CFG, params(), x, (t + 1) % CFG.decoder.vocab_size)
    np.testing.assert_array_equal(other.logits_BTV[:, :N], out.logits_BTV[:, :N])
    moved = apply(CFG, params(), images(seed=3), t)
    assert np.min(np.max(np.abs(moved.logits_BTV[:, N:] - out.logits_BTV[:, N:]), -1)) > 1e-4


def test_a_patch_reaches_the_text_logits_only_through_the_encoder():
    """Two checks. (1) Changing one patch leaves the decoder's text-position inputs bitwise
    unchanged. (2) The gradient of a text position's logits with respect to the pixels equals
    the chain rule through the encoder's output e = merger(vit(images)) alone:
    d f / d pixels == (d e / d pixels)^T (d f / d e). Any other path from pixels to the
    logits (pixels leaking into the text embeddings, positions, masks) adds a term that
    breaks the equality; an empty check would be a patch that reaches nothing, so (3) the
    gradient of that patch is non-zero."""
    p, x, t = params(), images(), tokens()
    probe = jax.random.normal(jax.random.key(4), (CFG.decoder.vocab_size,))

    def text_logit(logits_BTV):  # one text position's logits, projected to a scalar
        return jnp.sum(logits_BTV[:, N + 2] @ probe)

    @jax.jit
    def total_and_chain(x):
        g_total = jax.grad(lambda im: text_logit(vlm.apply(CFG, p, im, t).logits_BTV))(x)
        image_BND, encoder_vjp = jax.vjp(lambda im: vlm.image_embeddings(CFG, p, im)[0], x)
        text_BTD = transformer.embed(CFG.decoder, p["decoder"], t)

        def from_image_tokens(e_BND):
            seq = jnp.concatenate([e_BND, text_BTD], axis=1)
            logits_BTV, _ = transformer.apply(CFG.decoder, p["decoder"], embeddings_BTD=seq)
            return text_logit(logits_BTV)

        (g_chain,) = encoder_vjp(jax.grad(from_image_tokens)(image_BND))
        return g_total, g_chain

    g_total, g_chain = total_and_chain(x)
    # The same float32 ops in a different association (one grad against vjp of a grad).
    np.testing.assert_allclose(g_total, g_chain, rtol=1e-4, atol=1e-6)
    assert np.max(np.abs(g_total[:, :4, 4:8])) > 1e-6  # the patch (row 0, col 1) matters

    changed = x.at[:, :4, 4:8].add(0.5)
    names = ("decoder/embed",)
    before = apply(CFG, p, x, t, capture=names).captured["decoder/embed"]
    after = apply(CFG, p, changed, t, capture=names).captured["decoder/embed"]
    np.testing.assert_array_equal(after[:, N:], before[:, N:])
    assert np.max(np.abs(after[:, 1] - before[:, 1])) > 1e-4  # that patch's own token moved


def test_gate_captures_equal_a_decoder_forward_by_hand():
    p, x, t = params(), images(), tokens()
    out = apply(CFG, p, x, t, capture=(*GATES, "decoder/embed"))
    h = out.captured["decoder/embed"]
    B, S, _ = h.shape
    net = nnx.merge(transformer._graphdef(CFG.decoder), p["decoder"])
    mask = attention.make_mask("causal", jnp.ones((B, S), bool))
    positions = jnp.broadcast_to(jnp.arange(S), (B, S))
    for i, block in enumerate(net.blocks):
        h = h + block.attn(block.attn_norm(h), positions, mask)[0]
        mlp = p["decoder"]["blocks"][i]["mlp"]
        u = block.mlp_norm(h)
        gate = u @ mlp["gate"]["kernel"]
        # Equal up to float32 rounding of the same ops fused differently (jit against eager).
        np.testing.assert_allclose(out.captured[GATES[i]], gate, rtol=1e-4, atol=1e-5)
        h = h + (jax.nn.silu(gate) * (u @ mlp["up"]["kernel"])) @ mlp["down"]["kernel"]
    logits = net.lm_head(net.final_norm(h))
    np.testing.assert_allclose(out.logits_BTV, logits, rtol=1e-4, atol=1e-5)


def unit_mask(units_per_layer, value=0.0):
    mask = np.ones((L, F), np.float32)
    for layer, unit in enumerate(units_per_layer):
        mask[layer, unit] = value
    return jnp.asarray(mask)


def test_lesion_masks_units_at_every_position_and_every_cached_step():
    """A mask on unit j (j = 7 in layer 0, 3 in layer 1): in each layer exactly that unit's
    gate is 0 at all N + T prefill positions and at every one-token cached step, every other
    unit is not. The official code's bug (the unit mask sliced to T and applied along the token
    axis) zeroes whole positions in the prefill and the whole layer or nothing at T = 1."""
    p, x, t = params(), images(batch=1), tokens(batch=1)
    units = (7, 3)
    mask = unit_mask(units)
    cache = vlm.init_cache(CFG, 1, N + 5 + 3)
    out = apply(CFG, p, x, t, capture=GATES, gate_mask_LF=mask, cache=cache)
    gates = [out.captured]
    next_B1 = jnp.argmax(out.logits_BTV[:, -1:], -1)
    for _ in range(3):
        out = step(CFG, p, next_B1, out.cache, capture=GATES, gate_mask_LF=mask)
        gates.append(out.captured)
        next_B1 = jnp.argmax(out.logits_BTV[:, -1:], -1)
    for call, captured in enumerate(gates):
        for layer, unit in enumerate(units):
            gate = np.asarray(captured[GATES[layer]])
            assert gate.shape[1] == (N + 5 if call == 0 else 1)
            np.testing.assert_array_equal(gate[..., unit], 0.0)
            others = np.delete(gate, unit, axis=-1)
            assert np.all(others != 0.0), (call, layer)


def test_lesion_leaves_other_units_of_the_first_layer_and_scales_by_its_value():
    p, x, t = params(), images(), tokens()
    plain = apply(CFG, p, x, t, capture=GATES)
    scaled = apply(CFG, p, x, t, capture=GATES, gate_mask_LF=unit_mask((7, 3), value=-2.0))
    g0, s0 = plain.captured[GATES[0]], scaled.captured[GATES[0]]
    # Layer 0's input does not depend on the mask: its gate is the unmasked one times the mask.
    np.testing.assert_array_equal(np.delete(s0, 7, -1), np.delete(g0, 7, -1))
    np.testing.assert_allclose(s0[..., 7], -2.0 * g0[..., 7], rtol=1e-6)  # one float32 product
    ones = apply(CFG, p, x, t, gate_mask_LF=jnp.ones((L, F)))
    np.testing.assert_array_equal(ones.logits_BTV, plain.logits_BTV)  # x * 1.0 is exact
    assert np.max(np.abs(scaled.logits_BTV - plain.logits_BTV)) > 1e-5


def test_cached_decoding_equals_the_full_forward_under_a_lesion():
    p, x, t = params(), images(), tokens(length=6)
    mask = unit_mask((1, 2))
    full = apply(CFG, p, x, t, gate_mask_LF=mask).logits_BTV
    out = apply(CFG, p, x, t[:, :3], gate_mask_LF=mask, cache=vlm.init_cache(CFG, 2, N + 6))
    logits = [out.logits_BTV]
    for k in range(3, 6):
        out = step(CFG, p, t[:, k : k + 1], out.cache, gate_mask_LF=mask)
        logits.append(out.logits_BTV)
    # The same math over a cache of a different length: float32 rounding only.
    np.testing.assert_allclose(jnp.concatenate(logits, 1), full, rtol=1e-4, atol=1e-5)


def test_one_compiled_function_serves_every_mask_and_vmap_equals_a_loop():
    p, x, t = params(), images(), tokens()
    masks = jax.random.bernoulli(jax.random.key(5), 0.8, (4, L, F)).astype(jnp.float32)

    @jax.jit
    def logits(mask_LF):
        return vlm.apply(CFG, p, x, t, gate_mask_LF=mask_LF).logits_BTV

    looped = np.stack([logits(m) for m in masks])
    assert logits._cache_size() == 1
    vmapped = jax.jit(jax.vmap(logits))(masks)
    # Batched over masks XLA may order a contraction differently: float32 rounding only.
    np.testing.assert_allclose(vmapped, looped, rtol=1e-5, atol=1e-5)
    assert np.max(np.abs(looped[0] - looped[1])) > 1e-5  # the masks differ in effect


def test_config_and_input_errors():
    with pytest.raises(ConfigError, match="must be 'causal'"):
        vlm.VLMConfig(
            CFG.vit,
            transformer.TransformerConfig(13, 2, 24, 2, 40, 32, attention_mask="bidirectional"),
        )
    with pytest.raises(ConfigError, match="no room for text"):
        vlm.VLMConfig(CFG.vit, transformer.TransformerConfig(13, 2, 24, 2, 40, N))
    with pytest.raises(ValueError, match=r"gate_mask_LF has shape \(2, 39\)"):
        vlm.apply(CFG, params(), images(), tokens(), gate_mask_LF=jnp.ones((2, 39)))
    with pytest.raises(ValueError, match="unknown capture name"):
        vlm.apply(CFG, params(), images(), tokens(), capture=("decoder/blocks/5/mlp/gate",))
    with pytest.raises(ConfigError, match="must be a positive int dividing"):
        vlm.VLMConfig(CFG.vit, CFG.decoder, merge=3)  # the grid is 2 x 4


def test_the_merger_concatenates_each_2x2_block_of_neighbouring_vit_tokens():
    cfg = vlm.VLMConfig(CFG.vit, CFG.decoder, merge=2)
    p = vlm.init_params(cfg, jax.random.key(0))
    assert cfg.num_image_tokens == 2 and p["merger"]["kernel"].shape == (4 * 16, 24)
    x = images()
    tokens_BND = vit.apply(cfg.vit, p["vit"], x)  # the 2 x 4 grid, row-major
    block = lambda r, c: tokens_BND[:, r * 4 + c]  # noqa: E731
    # Decoder token j reads grid rows 0-1 and columns 2j, 2j+1: its block, row-major inside.
    want_BNM = jnp.stack(
        [
            jnp.concatenate([block(0, c), block(0, c + 1), block(1, c), block(1, c + 1)], -1)
            for c in (0, 2)
        ],
        axis=1,
    )
    merged, _ = vlm.image_embeddings(cfg, p, x)
    # float32 matmuls of the same numbers in another order
    np.testing.assert_allclose(merged, want_BNM @ p["merger"]["kernel"], rtol=1e-5, atol=1e-5)
    out = apply(cfg, p, x, tokens())
    assert out.logits_BTV.shape == (2, 2 + 5, CFG.decoder.vocab_size)


def test_precomputed_image_embeddings_tiled_over_rows_equal_encoding_each_row():
    # Fetal-Gauge scores K options of one image by tiling its embeddings over K text rows; the
    # logits must equal encoding the image again for every row (a tiling-order bug, repeat vs
    # tile, would pair one image's tokens with another's options).
    rng = np.random.default_rng(3)
    images = rng.uniform(size=(2, 8, 16, 1)).astype(np.float32)
    tokens = rng.integers(0, 13, size=(6, 5))  # image 0 -> rows 0-2, image 1 -> rows 3-5
    embedded, _ = vlm.image_embeddings(CFG, params(), images)
    tiled = apply(CFG, params(), None, tokens, image_BND=jnp.repeat(embedded, 3, axis=0))
    direct = apply(CFG, params(), np.repeat(images, 3, axis=0), tokens)
    # the same ops on the same numbers: equal up to float32 reassociation across programs
    np.testing.assert_allclose(tiled.logits_BTV, direct.logits_BTV, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="not both"):
        vlm.apply(CFG, params(), images, tokens[:2], image_BND=embedded)


def placeholder_prompts(text_rows, image_token):
    """Left-padded (pad id 0) [pad, image_token x N, text] prompts [B, P] and their mask."""
    width = N + max(len(t) for t in text_rows)
    pads = [width - N - len(t) for t in text_rows]
    rows = [[0] * p + [image_token] * N + t for p, t in zip(pads, text_rows, strict=True)]
    mask = [[False] * p + [True] * (width - p) for p in pads]
    return jnp.asarray(rows, jnp.int32), jnp.asarray(mask)


def policy_case():
    """Images [3, ...], text rows of 4, 2 and 3 ids in [1, 12) (neither placeholder id used
    below) and the policy's params."""
    rng = np.random.default_rng(7)
    text_rows = [rng.integers(1, 12, size=n).tolist() for n in (4, 2, 3)]
    x = images(batch=3)
    image_BND, _ = vlm.image_embeddings(CFG, params(), x)
    return x, text_rows, {"model": params(), "image_BND": image_BND}


@pytest.mark.parametrize("image_token", [12, 0])  # 0: the placeholder id is the pad id too
def test_policy_prefill_gives_applys_last_logits_for_every_padding(image_token):
    x, text_rows, pp = policy_case()
    prompt_BP, mask_BP = placeholder_prompts(text_rows, image_token)
    pol = vlm.policy(CFG, image_token)
    assert pol is vlm.policy(CFG, image_token)  # cached: jit sees one static policy
    positions_BP = jnp.maximum(jnp.cumsum(mask_BP, axis=1) - 1, 0)  # as the sampler's
    cache = pol.init_cache(3, prompt_BP.shape[1])
    logits_BPV, _ = jax.jit(pol.apply)(
        pp, prompt_BP, positions_BT=positions_BP, key_mask_BT=mask_BP, cache=cache
    )
    for i, text in enumerate(text_rows):
        want_V = apply(CFG, params(), x[i : i + 1], jnp.asarray([text])).logits_BTV[0, -1]
        # The same float32 math; padding keys add exact zeros to the softmax, so only rounding
        # (another program, another cache length) separates the two.
        np.testing.assert_allclose(logits_BPV[i, -1], want_V, rtol=1e-5, atol=1e-5)


def test_policy_greedy_sampling_equals_argmax_over_applys_full_sequence():
    x, text_rows, pp = policy_case()
    image_token = 0  # = the pad id; the model below never emits it (asserted)
    prompt_BP, mask_BP = placeholder_prompts(text_rows, image_token)
    out = sampler.sample_jit(
        vlm.policy(CFG, image_token),
        pp,
        prompt_BP,
        rng=jax.random.key(0),
        max_new_tokens=5,
        prompt_mask_BP=mask_BP,
        temperature=0.0,
    )
    for i, text in enumerate(text_rows):
        seq = list(text)
        for _ in range(5):  # no cache: the whole growing sequence each step
            logits_TV = apply(CFG, params(), x[i : i + 1], jnp.asarray([seq])).logits_BTV[0]
            seq.append(int(jnp.argmax(logits_TV[-1])))
        # A generated placeholder id would be read as an image token: the comparison needs none.
        assert image_token not in seq[len(text) :]
        np.testing.assert_array_equal(out.tokens_BN[i], seq[len(text) :])


@pytest.mark.parametrize("image_token", [13, -1, 1.0, True, "12"])
def test_policy_rejects_an_image_token_outside_the_vocabulary(image_token):
    with pytest.raises(ValueError, match=r"image_token=.* must be an int in \[0, 13\)"):
        vlm.policy(CFG, image_token)
