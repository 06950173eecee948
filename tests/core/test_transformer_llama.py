"""The transformer's Llama options (issue 39): grouped-query attention (num_kv_heads), tied
embeddings, the interleaved rotary layout and norm_eps, against a float64 NumPy Llama written
out here, and against the relations a checkpoint loader relies on (GQA = MHA with k/v repeated
per group; interleaved = half with permuted q/k columns; tied = untied with lm_head = E^T)."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from core.nn import layers, positions, transformer
from core.sharding import path_str
from tests.core.test_transformer import first_rule, flat_paths
from tests.fixtures.record_lm_reference import synthetic_params

BASE = transformer.TransformerConfig(
    vocab_size=32, num_layers=2, d_model=32, num_heads=4, d_ff=64, max_len=64
)
LLAMA = dataclasses.replace(
    BASE, num_kv_heads=2, tie_embeddings=True, rope_layout="interleaved", norm_eps=0.3
)
apply_jit = jax.jit(transformer.apply, static_argnums=0)


@functools.lru_cache
def params_for(cfg):
    """Parameters with every leaf random (norm scales too, so a misused scale shows)."""
    init = functools.partial(transformer.init_params, cfg)
    return synthetic_params(jax.eval_shape(init, jax.random.key(0)))


def tokens(seed, shape=(2, 11)):
    return jax.random.randint(jax.random.key(seed), shape, 0, BASE.vocab_size)


def numpy_rope(x_BTHK, pos_BT, base, layout):
    """Pair j = features (first[j], second[j]) turned by pos * base^(-2j/K), in float64."""
    K = x_BTHK.shape[-1]
    j = np.arange(K // 2)
    first, second = (j, j + K // 2) if layout == "half" else (2 * j, 2 * j + 1)
    angle_BT1J = (pos_BT[..., None] * base ** (-2.0 * j / K))[:, :, None, :]
    cos, sin = np.cos(angle_BT1J), np.sin(angle_BT1J)
    out = x_BTHK.copy()
    out[..., first] = x_BTHK[..., first] * cos - x_BTHK[..., second] * sin
    out[..., second] = x_BTHK[..., second] * cos + x_BTHK[..., first] * sin
    return out


def numpy_llama(cfg, params, tokens_BT):
    """Causal Llama logits in float64 from the parameter tree: k/v repeated per group with
    np.repeat (query head h reads kv head h // (H // G)), no code shared with the model."""
    p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    B, T = tokens_BT.shape
    H, G, K, eps = cfg.num_heads, cfg.kv_heads, cfg.head_dim, cfg.norm_eps

    def rms(x, scale):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * scale

    pos_BT = np.broadcast_to(np.arange(T, dtype=np.float64), (B, T))
    causal_TS = np.tril(np.ones((T, T), bool))
    x = p["embed"]["embedding"][np.asarray(tokens_BT)]
    for i in range(cfg.num_layers):
        a, m = p["blocks"][i]["attn"], p["blocks"][i]["mlp"]
        h = rms(x, p["blocks"][i]["attn_norm"]["scale"])
        q = numpy_rope(
            (h @ a["q"]["kernel"]).reshape(B, T, H, K), pos_BT, cfg.rope_base, cfg.rope_layout
        )
        k = numpy_rope(
            (h @ a["k"]["kernel"]).reshape(B, T, G, K), pos_BT, cfg.rope_base, cfg.rope_layout
        )
        k = np.repeat(k, H // G, axis=2)
        v = np.repeat((h @ a["v"]["kernel"]).reshape(B, T, G, K), H // G, axis=2)
        scores = np.einsum("bthk,bshk->bhts", q, k) / np.sqrt(K)
        scores = np.where(causal_TS, scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        x = x + np.einsum("bhts,bshk->bthk", probs, v).reshape(B, T, H * K) @ a["o"]["kernel"]
        h = rms(x, p["blocks"][i]["mlp_norm"]["scale"])
        gate = h @ m["gate"]["kernel"]
        x = x + (gate / (1 + np.exp(-gate)) * (h @ m["up"]["kernel"])) @ m["down"]["kernel"]
    h = rms(x, p["final_norm"]["scale"])
    return h @ (p["embed"]["embedding"].T if cfg.tie_embeddings else p["lm_head"]["kernel"])


@pytest.mark.parametrize(
    "fields",
    [
        {},  # today's model
        dict(num_kv_heads=2, tie_embeddings=True, rope_layout="interleaved", norm_eps=0.3),
        dict(num_kv_heads=1, rope_layout="half", norm_eps=1e-5),  # multi-query attention
        dict(num_kv_heads=2, rope_layout="interleaved", norm_eps=0.05, tie_embeddings=False),
    ],
    ids=["default", "gqa2_tied_interleaved", "mqa", "gqa2_untied_interleaved"],
)
def test_llama_options_match_a_numpy_llama(fields):
    cfg = dataclasses.replace(BASE, **fields)
    params, tokens_BT = params_for(cfg), tokens(1)
    logits_BTV, _ = apply_jit(cfg, params, tokens_BT)
    # float32 model vs float64 reference: logits of size ~10 after two layers with unit-scale
    # random weights carry ~1e-5 of float32 rounding; a wrong kv group, pair layout or epsilon
    # (0.3 vs 1e-6 in one norm) moves them by > 1e-2.
    np.testing.assert_allclose(logits_BTV, numpy_llama(cfg, params, tokens_BT), atol=2e-4)


def test_gqa_equals_mha_with_kv_kernels_repeated_per_group():
    gqa = dataclasses.replace(BASE, num_kv_heads=2)
    params = params_for(gqa)
    K, R = BASE.head_dim, BASE.num_heads // 2
    attn = params["blocks"][0]["attn"]
    assert attn["k"]["kernel"].shape == attn["v"]["kernel"].shape == (BASE.d_model, 2 * K)

    def repeat_heads(kernel_DGK):  # query head h = g * R + r reads kv head g
        D = kernel_DGK.shape[0]
        return np.repeat(np.asarray(kernel_DGK).reshape(D, -1, K), R, axis=1).reshape(D, -1)

    mha_params = jax.tree_util.tree_map_with_path(
        lambda path, x: repeat_heads(x) if path_str(path).endswith(("k/kernel", "v/kernel")) else x,
        params,
    )
    tokens_BT = tokens(2)
    # Same products; the grouped einsum may sum in another order (measured bit-equal on CPU).
    np.testing.assert_allclose(
        apply_jit(gqa, params, tokens_BT)[0], apply_jit(BASE, mha_params, tokens_BT)[0], atol=1e-5
    )


@pytest.mark.parametrize(
    "cfg", [dataclasses.replace(LLAMA, norm_eps=1e-5), BASE], ids=["gqa", "mha"]
)
def test_cached_decoding_equals_the_uncached_forward(cfg):
    params, tokens_BT = params_for(cfg), tokens(3, (2, 10))
    mask_BT = jnp.ones((2, 10), bool).at[1, :3].set(False)  # row 1 left-padded
    pos_BT = jnp.maximum(jnp.cumsum(mask_BT, axis=1) - 1, 0)
    full, _ = apply_jit(cfg, params, tokens_BT, positions_BT=pos_BT, key_mask_BT=mask_BT)
    cache = transformer.init_cache(cfg, 2, 10)
    assert cache.k.shape == cache.v.shape == (cfg.num_layers, 2, 10, cfg.kv_heads, cfg.head_dim)
    P_ = 6
    logits, cache = apply_jit(
        cfg,
        params,
        tokens_BT[:, :P_],
        positions_BT=pos_BT[:, :P_],
        key_mask_BT=mask_BT[:, :P_],
        cache=cache,
    )
    steps = [logits]
    for t in range(P_, 10):
        s = slice(t, t + 1)
        logits, cache = apply_jit(
            cfg,
            params,
            tokens_BT[:, s],
            positions_BT=pos_BT[:, s],
            key_mask_BT=mask_BT[:, s],
            cache=cache,
        )
        steps.append(logits)
    # float32: the same products summed over 10 cache slots instead of T keys.
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=1e-5)


def test_rope_interleaved_pairs_and_frequencies():
    K, base, pos = 8, 100.0, 3.0
    eye_KK = jnp.eye(K)
    out = positions.rope(eye_KK[None, None], jnp.full((1, 1), pos), base=base, layout="interleaved")
    # Feature 2j pairs with 2j + 1 and turns by pos * base^(-2j/K).
    for j in range(K // 2):
        angle = pos * base ** (-2 * j / K)
        expected = np.zeros(K)
        expected[2 * j], expected[2 * j + 1] = np.cos(angle), np.sin(angle)
        np.testing.assert_allclose(out[0, 0, 2 * j], expected, atol=1e-6)
    with pytest.raises(ValueError, match="unknown rope layout 'gptj'"):
        positions.rope(eye_KK[None, None], jnp.zeros((1, 1)), layout="gptj")


def test_interleaved_model_with_permuted_qk_columns_equals_the_half_model():
    """The GGUF-vs-Hugging-Face relation: q/k output columns reordered per head by
    `half_to_interleaved_columns` (k over the kv heads) turn a "half" model into the same
    "interleaved" one."""
    half = dataclasses.replace(LLAMA, rope_layout="half")
    params = params_for(half)
    heads = {"q": half.num_heads, "k": half.kv_heads}

    def permute(path, x):
        name = path_str(path)
        for proj, num_heads in heads.items():
            if name.endswith(f"attn/{proj}/kernel"):
                return positions.half_to_interleaved_columns(x, num_heads)
        return x

    interleaved_params = jax.tree_util.tree_map_with_path(permute, params)
    tokens_BT = tokens(4)
    got, _ = apply_jit(LLAMA, interleaved_params, tokens_BT)
    want, _ = apply_jit(dataclasses.replace(LLAMA, rope_layout="half"), params, tokens_BT)
    # Each score sums the same products in another order of features: float32 rounding only.
    np.testing.assert_allclose(got, want, atol=1e-5)
    mismatched, _ = apply_jit(LLAMA, params, tokens_BT)  # layout changed, columns not
    assert np.abs(mismatched - want).max() > 1e-2
    w = np.arange(2 * 3 * 8, dtype=np.float32).reshape(2, 24)
    back = positions.interleaved_to_half_columns(positions.half_to_interleaved_columns(w, 3), 3)
    np.testing.assert_array_equal(back, w)
    # Head 0 of K = 8: new column order 0, 4, 1, 5, 2, 6, 3, 7.
    np.testing.assert_array_equal(
        positions.half_to_interleaved_columns(w, 3)[0, :8], [0, 4, 1, 5, 2, 6, 3, 7]
    )


def test_tied_embeddings_have_no_lm_head_and_project_with_the_embedding():
    untied = dataclasses.replace(LLAMA, tie_embeddings=False)
    params = params_for(LLAMA)
    assert "lm_head" not in params and "lm_head" in params_for(untied)
    V, D = LLAMA.vocab_size, LLAMA.d_model
    assert transformer.num_params(params) == transformer.num_params(params_for(untied)) - V * D
    assert transformer.flops_per_token(LLAMA, 16) == transformer.flops_per_token(untied, 16)
    tokens_BT = tokens(5)
    last = f"blocks/{LLAMA.num_layers - 1}"
    out = transformer.forward(LLAMA, params, tokens_BT, capture=("final_norm", last))
    E_VD = params["embed"]["embedding"]
    # The same float32 matmul; only the summation order may differ (logits ~5).
    np.testing.assert_allclose(out.logits_BTV, out.captured["final_norm"] @ E_VD.T, atol=1e-5)
    assert out.logits_BTV.dtype == jnp.float32
    # The logit lens on the last block is the model's head; embed reads the same matrix.
    np.testing.assert_array_equal(
        transformer.head(LLAMA, params, out.captured[last]), out.logits_BTV
    )
    np.testing.assert_array_equal(transformer.embed(LLAMA, params, tokens_BT), E_VD[tokens_BT])
    # An untied model given lm_head = E^T computes the same logits.
    as_untied = {**params, "lm_head": {"kernel": E_VD.T}}
    np.testing.assert_allclose(
        apply_jit(untied, as_untied, tokens_BT)[0], out.logits_BTV, atol=1e-5
    )
    bf16 = dataclasses.replace(LLAMA, dtype="bfloat16")
    assert apply_jit(bf16, params, tokens_BT)[0].dtype == jnp.float32


def test_norm_eps_reaches_every_rmsnorm():
    cfg = dataclasses.replace(BASE, norm_eps=0.25)
    model = transformer.MODULE.bind(cfg, params_for(cfg))
    norms = {path: m for path, m in nnx.iter_graph(model) if isinstance(m, layers.RMSNorm)}
    assert len(norms) == 2 * cfg.num_layers + 1  # two per block and the final norm
    assert {m.eps for m in norms.values()} == {0.25}, {p: m.eps for p, m in norms.items()}
    default = transformer.MODULE.bind(BASE, params_for(BASE))
    assert {m.eps for _, m in nnx.iter_graph(default) if isinstance(m, layers.RMSNorm)} == {1e-6}


def test_flops_per_token_counts_gqa_kv_projections():
    V, L, D, F, T = BASE.vocab_size, BASE.num_layers, BASE.d_model, BASE.d_ff, 16
    kv_dim = 2 * BASE.head_dim  # num_kv_heads=2
    n_matmul = L * (2 * D * D + 2 * D * kv_dim + 3 * D * F) + D * V
    assert transformer.flops_per_token(LLAMA, T) == 6 * n_matmul + 12 * L * T * D
    # The count is the matmul parameters: every kernel except the embedding lookup's.
    params = params_for(dataclasses.replace(LLAMA, tie_embeddings=False))
    kernels = sum(x.size for p, x in flat_paths(params).items() if p.endswith("kernel"))
    assert n_matmul == kernels


# LLAMA's k [32, 2 kv heads x 8] puts one kv head per "model" device; SPLIT's k [48, 3 x 8]
# splits its middle kv head over the two (as SmolLM2's [576, 3 x 64] over 2, 4 or 8 devices).
SPLIT = dataclasses.replace(LLAMA, d_model=48, num_heads=6, num_kv_heads=3)


@pytest.mark.parametrize("cfg", [LLAMA, SPLIT], ids=["head_per_device", "head_split"])
def test_gqa_tied_tensor_parallel_apply_matches_single_device(cfg):
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    params = params_for(cfg)
    for path, leaf in flat_paths(params).items():
        assert (first_rule(path) is None) == (leaf.ndim < 2), path  # every kernel has a rule

    def place(path, x):
        spec = first_rule(path_str(path)) or P()
        return jax.device_put(x, NamedSharding(mesh, spec))

    sharded = jax.tree_util.tree_map_with_path(place, params)
    assert sharded["blocks"][0]["attn"]["k"]["kernel"].sharding.spec == P(None, "model")
    tokens_BT = tokens(6, (4, 12))
    expected, _ = apply_jit(cfg, params, tokens_BT)
    got, _ = apply_jit(cfg, sharded, jax.device_put(tokens_BT, NamedSharding(mesh, P("data"))))
    np.testing.assert_allclose(got, expected, atol=1e-5)  # float32 reduction order only
