"""core.nn.attention and the transformer's new paths: mask kinds against dense loops, the
dot_product implementation against xla, position functions, embeddings in, captured
intermediates against a forward written out from the layers, block-mask decoding."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core.nn import attention, positions, transformer
from tests.core.test_transformer import CFG, apply_jit, params_for


def dense_mask(kind, key_mask_BS, index, block_ids_BT):
    """The mask by explicit loops over (row, query, key slot), as the docstring states it."""
    B, S = key_mask_BS.shape
    T = block_ids_BT.shape[1]
    out = np.zeros((B, T, S), bool)
    for b in range(B):
        for t in range(T):
            q_slot = index + t
            for s in range(S):
                if not key_mask_BS[b, s] or s >= index + T:
                    continue
                if kind == "causal":
                    out[b, t, s] = s <= q_slot
                elif kind == "bidirectional" or s < index:  # a cached key: always visible
                    out[b, t, s] = True
                else:
                    k_id, q_id = block_ids_BT[b, s - index], block_ids_BT[b, t]
                    out[b, t, s] = k_id <= q_id if kind == "block" else k_id == q_id
    return out


@pytest.mark.parametrize("kind", attention.MASKS)
@pytest.mark.parametrize("index", [0, 3])
def test_masks_equal_explicit_dense_loops(kind, index):
    if kind == "segment" and index:
        with pytest.raises(ValueError, match="no cached form"):
            attention.make_mask(
                kind,
                jnp.ones((2, 9), bool),
                num_queries=4,
                index=3,
                block_ids_BT=jnp.zeros((2, 4), jnp.int32),
            )
        return
    rng = np.random.default_rng(0)
    T = 6
    S = index + T + 2  # two unfilled slots after the new tokens
    key_mask_BS = rng.random((3, S)) < 0.8
    key_mask_BS[:, index + T :] = False  # unfilled, as a cache keeps them
    # Prefix-LM ids (0 on a 3-token prefix, then 1, 2, ...), block-diffusion ids, and a
    # packed row whose ids restart: "block" must compare ids, not positions.
    block_ids_BT = np.array([[0, 0, 0, 1, 2, 3], [0, 0, 1, 1, 2, 2], [0, 1, 1, 0, 0, 2]])
    got = attention.make_mask(
        kind,
        jnp.asarray(key_mask_BS),
        num_queries=T,
        index=index,
        block_ids_BT=jnp.asarray(block_ids_BT),
    )
    np.testing.assert_array_equal(got, dense_mask(kind, key_mask_BS, index, block_ids_BT))


def test_dot_product_impl_matches_xla_within_float32_rounding():
    B, T, S, H, K = 3, 7, 9, 4, 16
    q, k, v = (jax.random.normal(jax.random.key(i), (B, n, H, K)) for i, n in enumerate((T, S, S)))
    mask_BTS = jax.random.uniform(jax.random.key(9), (B, T, S)) < 0.6
    mask_BTS = mask_BTS.at[0, 2].set(False)  # a query with no visible key: output exactly 0
    xla = attention.attend(q, k, v, mask_BTS, impl="xla")
    dot = attention.attend(q, k, v, mask_BTS, impl="dot_product")
    np.testing.assert_array_equal(dot[0, 2], 0.0)
    # Same float32 products and softmax; the two sum in different orders and mask with a
    # different large negative: a few ulps of outputs of magnitude ~1 (measured 2.4e-7).
    np.testing.assert_allclose(dot, xla, atol=2e-6, rtol=2e-6)
    cfg = dataclasses.replace(CFG, attention_impl="dot_product")
    tokens_BT = jax.random.randint(jax.random.key(1), (2, 12), 0, CFG.vocab_size)
    mask_BT = jnp.ones((2, 12), bool).at[1, :4].set(False)
    pos_BT = jnp.maximum(jnp.cumsum(mask_BT, axis=1) - 1, 0)
    kw = dict(positions_BT=pos_BT, key_mask_BT=mask_BT)
    # Through two layers and the head: logits of magnitude ~3, a few ulps each (measured 0:
    # jax 0.10.2 on CPU computes the same float32 operations for these shapes).
    np.testing.assert_allclose(
        apply_jit(cfg, params_for(), tokens_BT, **kw)[0],
        apply_jit(CFG, params_for(), tokens_BT, **kw)[0],
        atol=1e-5,
    )
    assert attention.resolve_impl("auto") == "xla"  # CPU: the exact formulation


@pytest.mark.parametrize("impl", ["xla", "dot_product"])
def test_grouped_query_attention_equals_kv_heads_repeated_per_group(impl):
    B, T, S, H, G, K = 2, 5, 7, 6, 2, 8
    q = jax.random.normal(jax.random.key(0), (B, T, H, K))
    k, v = (jax.random.normal(jax.random.key(i), (B, S, G, K)) for i in (1, 2))
    mask_BTS = jax.random.uniform(jax.random.key(3), (B, T, S)) < 0.7
    mask_BTS = mask_BTS.at[1, 0].set(False)  # a query with no visible key: output exactly 0
    grouped = attention.attend(q, k, v, mask_BTS, impl=impl)
    # Query head h reads kv head h // (H // G): heads 0-2 kv head 0, heads 3-5 kv head 1.
    repeated = attention.attend(
        q, jnp.repeat(k, H // G, axis=2), jnp.repeat(v, H // G, axis=2), mask_BTS, impl=impl
    )
    np.testing.assert_array_equal(grouped[1, 0], 0.0)
    # The same products and softmax per query head; only XLA's summation order may differ.
    np.testing.assert_allclose(grouped, repeated, atol=1e-6)
    with pytest.raises(ValueError, match="kv head count dividing"):
        attention.attend(q, k[:, :, :1].repeat(4, axis=2), v, mask_BTS, impl=impl)


def _rope_fn(q_BTHK, k_BTHK, *, positions_BT, x_BTD, key_mask_BT, state):
    """RoPE written as a method's position function (x and the key mask unused)."""
    assert x_BTD.shape[:2] == positions_BT.shape and state is None
    return positions.rope(q_BTHK, positions_BT), positions.rope(k_BTHK, positions_BT), state


def test_a_position_function_plugs_in_like_a_kind():
    tokens_BT = jax.random.randint(jax.random.key(2), (2, 10), 0, CFG.vocab_size)
    as_fn = dataclasses.replace(CFG, position=_rope_fn)
    # The same operations as position="rope": bit-identical logits.
    np.testing.assert_array_equal(
        apply_jit(as_fn, params_for(), tokens_BT)[0], apply_jit(CFG, params_for(), tokens_BT)[0]
    )
    with pytest.raises(ValueError, match="TransformerConfig.position"):
        dataclasses.replace(CFG, position="alibi")
    with pytest.raises(ValueError, match="TransformerConfig.attention_mask"):
        dataclasses.replace(CFG, attention_mask="sliding")


def test_embeddings_in_equal_tokens_in():
    params = params_for()
    tokens_BT = jax.random.randint(jax.random.key(3), (2, 9), 0, CFG.vocab_size)
    x_BTD = transformer.embed(CFG, params, tokens_BT)
    np.testing.assert_array_equal(x_BTD, params["embed"]["embedding"][tokens_BT])
    from_embeddings, _ = transformer.apply(CFG, params, embeddings_BTD=x_BTD)
    np.testing.assert_array_equal(from_embeddings, transformer.apply(CFG, params, tokens_BT)[0])
    # A soft token (probability-weighted embedding) is a different input: different logits.
    probs_BTV = jax.nn.softmax(jax.random.normal(jax.random.key(4), (2, 9, CFG.vocab_size)))
    soft_BTD = probs_BTV @ params["embed"]["embedding"]
    assert not np.allclose(
        transformer.apply(CFG, params, embeddings_BTD=soft_BTD)[0], from_embeddings
    )
    with pytest.raises(ValueError, match="exactly one"):
        transformer.apply(CFG, params, tokens_BT, embeddings_BTD=x_BTD)


def _rms(x, scale):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def manual_forward(params, tokens_BT):
    """The LM written out with jnp from the parameters and the attention functions."""
    B, T = tokens_BT.shape
    H, K = CFG.num_heads, CFG.head_dim
    out = {"embed": params["embed"]["embedding"][tokens_BT]}
    x = out["embed"]
    pos_BT = jnp.broadcast_to(jnp.arange(T), (B, T))
    mask_BTS = attention.make_mask("causal", jnp.ones((B, T), bool))
    for i in range(CFG.num_layers):
        p = params["blocks"][i]
        a = p["attn"]
        h = _rms(x, p["attn_norm"]["scale"])
        q, k, v = ((h @ a[n]["kernel"]).reshape(B, T, H, K) for n in "qkv")
        q, k = positions.rope(q, pos_BT), positions.rope(k, pos_BT)
        y = attention.attend(q, k, v, mask_BTS).reshape(B, T, H * K) @ a["o"]["kernel"]
        x = x + y
        m = p["mlp"]
        h = _rms(x, p["mlp_norm"]["scale"])
        gate = h @ m["gate"]["kernel"]  # before SiLU: the unit lesions' capture
        mlp = (jax.nn.silu(gate) * (h @ m["up"]["kernel"])) @ m["down"]["kernel"]
        x = x + mlp
        out |= {f"blocks/{i}/attn": y, f"blocks/{i}/mlp": mlp, f"blocks/{i}/mlp/gate": gate}
        out[f"blocks/{i}"] = x
    out["final_norm"] = _rms(x, params["final_norm"]["scale"])
    return out, out["final_norm"] @ params["lm_head"]["kernel"]


def test_captured_intermediates_equal_a_manual_forward():
    params = params_for()
    tokens_BT = jax.random.randint(jax.random.key(5), (2, 8), 0, CFG.vocab_size)
    names = transformer.capture_names(CFG)
    assert names[0] == "embed" and names[-1] == "final_norm" and "blocks/1/attn" in names
    got = transformer.forward(CFG, params, tokens_BT, capture=names)
    expected, logits = manual_forward(params, tokens_BT)
    assert set(got.captured) == set(names)
    for name in names:
        # float32: the same products, matmuls through nnx.Linear vs `@` (activations ~1-10);
        # measured bit-identical on CPU, the bound allows a different XLA fusion's rounding.
        np.testing.assert_allclose(got.captured[name], expected[name], atol=2e-5, err_msg=name)
    np.testing.assert_allclose(got.logits_BTV, logits, atol=2e-5)
    only = transformer.forward(CFG, params, tokens_BT, capture=("blocks/0",))
    assert list(only.captured) == ["blocks/0"]  # only what was asked for
    with pytest.raises(ValueError, match="blocks/7"):
        transformer.forward(CFG, params, tokens_BT, capture=("blocks/7",))


def test_block_mask_prefix_lm_sees_the_whole_prefix_and_decodes_like_a_full_forward():
    cfg = dataclasses.replace(CFG, attention_mask="block")
    params = params_for()
    P, N = 5, 4
    tokens_BT = jax.random.randint(jax.random.key(6), (2, P + N), 0, CFG.vocab_size)
    ids_BT = jnp.broadcast_to(jnp.maximum(jnp.arange(P + N) - P + 1, 0), (2, P + N))
    full, _ = transformer.apply(cfg, params, tokens_BT, block_ids_BT=ids_BT)
    changed = tokens_BT.at[:, P - 1].set((tokens_BT[:, P - 1] + 1) % CFG.vocab_size)
    full_changed, _ = transformer.apply(cfg, params, changed, block_ids_BT=ids_BT)
    # The last prefix token is visible to the first (bidirectional prefix), as a causal LM's
    # is not; masked probabilities are exactly 0, so nothing else leaks.
    assert np.abs(full[:, 0] - full_changed[:, 0]).max() > 1e-3
    causal, _ = transformer.apply(CFG, params, tokens_BT)
    causal_changed, _ = transformer.apply(CFG, params, changed)
    np.testing.assert_array_equal(causal[:, : P - 1], causal_changed[:, : P - 1])
    # Decoding: the prefix in one call (its block whole), then one token per call.
    cache = transformer.init_cache(cfg, 2, P + N)
    logits, cache = transformer.apply(
        cfg, params, tokens_BT[:, :P], block_ids_BT=ids_BT[:, :P], cache=cache
    )
    steps = [logits]
    for t in range(P, P + N):
        logits, cache = transformer.apply(
            cfg, params, tokens_BT[:, t : t + 1], block_ids_BT=ids_BT[:, t : t + 1], cache=cache
        )
        steps.append(logits)
    # float32: the same products summed over P + N cache slots instead of T keys.
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=1e-5)


def test_bidirectional_attention_reads_later_tokens():
    cfg = dataclasses.replace(CFG, attention_mask="bidirectional")
    tokens_BT = jax.random.randint(jax.random.key(7), (2, 8), 0, CFG.vocab_size)
    changed = tokens_BT.at[:, -1].set((tokens_BT[:, -1] + 1) % CFG.vocab_size)
    a, _ = apply_jit(cfg, params_for(), tokens_BT)
    b, _ = apply_jit(cfg, params_for(), changed)
    assert np.abs(a[:, 0] - b[:, 0]).min(axis=-1).min() > 1e-4  # every row, every position


def test_precision_reaches_both_products():
    # The option a float32 port (methods/tpc's MiniLM) needs on accelerators: both einsums
    # (scores and the weighted sum) carry it; without it, jax's default as before.
    q_BTHK = jax.random.normal(jax.random.key(0), (1, 3, 2, 4))
    mask_BTS = attention.make_mask("bidirectional", jnp.array([[True, True, False]]))

    def dots(**kw):
        fn = jax.jit(lambda q: attention.attend(q, q, q, mask_BTS, **kw))
        return [line for line in fn.lower(q_BTHK).as_text().splitlines() if "dot_general" in line]

    highest = dots(precision=jax.lax.Precision.HIGHEST)
    assert len(highest) == 2 and all("precision = [HIGHEST, HIGHEST]" in d for d in highest)
    assert all("HIGHEST" not in d for d in dots())
    with pytest.raises(ValueError, match="needs impl='xla'"):
        attention.attend(q_BTHK, q_BTHK, q_BTHK, mask_BTS, impl="dot_product", precision="highest")
