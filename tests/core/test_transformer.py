"""Transformer and position encodings: causality, rope geometry, padding, dtypes, sharding."""

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from core.nn import positions, transformer
from core.sharding import path_str

CFG = transformer.TransformerConfig(
    vocab_size=32, num_layers=2, d_model=32, num_heads=4, d_ff=64, max_len=64
)
apply_jit = jax.jit(transformer.apply, static_argnums=0)


@functools.lru_cache
def params_for(cfg=CFG, seed=0):
    return transformer.init_params(cfg, jax.random.key(seed))


def random_tokens(seed, shape, vocab=CFG.vocab_size):
    return jax.random.randint(jax.random.key(seed), shape, 0, vocab)


def flat_paths(tree):
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {path_str(path): leaf for path, leaf in leaves}


def test_init_params_is_pure_dict_eval_shape_safe_and_counted():
    params = params_for()
    abstract = jax.eval_shape(functools.partial(transformer.init_params, CFG), jax.random.key(0))
    assert jax.tree_util.tree_structure(abstract) == jax.tree_util.tree_structure(params)
    assert jax.tree.map(lambda x: (x.shape, x.dtype), abstract) == jax.tree.map(
        lambda x: (x.shape, x.dtype), params
    )
    assert type(params) is dict and type(params["blocks"][0]["attn"]) is dict
    assert "blocks/1/attn/q/kernel" in flat_paths(params)
    V, L, D, F = CFG.vocab_size, CFG.num_layers, CFG.d_model, CFG.d_ff
    # embedding + lm_head, per layer 4 attention + 3 MLP kernels + 2 norm scales, final norm
    assert transformer.num_params(params) == 2 * V * D + L * (4 * D * D + 3 * D * F + 2 * D) + D


def test_flops_per_token_formula():
    V, L, D, F, T = CFG.vocab_size, CFG.num_layers, CFG.d_model, CFG.d_ff, 16
    n_matmul = L * (4 * D * D + 3 * D * F) + D * V
    assert transformer.flops_per_token(CFG, T) == 6 * n_matmul + 12 * L * T * D


def test_causality():
    params, t = params_for(), 5
    tokens_BT = random_tokens(1, (2, 12))
    changed_BT = tokens_BT.at[:, t].set((tokens_BT[:, t] + 1) % CFG.vocab_size)
    logits, _ = apply_jit(CFG, params, tokens_BT)
    logits_changed, _ = apply_jit(CFG, params, changed_BT)
    # Masked probabilities are exactly 0, so earlier positions are bit-identical.
    np.testing.assert_array_equal(logits[:, :t], logits_changed[:, :t])
    assert np.abs(logits[:, t:] - logits_changed[:, t:]).min(axis=-1).max() > 1e-3


def test_rope_half_split_layout_and_frequencies():
    K, base, pos = 8, 100.0, 3.0
    eye_KK = jnp.eye(K)
    # Feature j pairs with j + K/2 and turns by pos * base^(-2j/K).
    out = positions.rope(eye_KK[None, None], jnp.full((1, 1), pos), base=base)[0, 0]
    for j in range(K // 2):
        angle = pos * base ** (-2 * j / K)
        expected = np.zeros(K)
        expected[j], expected[j + K // 2] = np.cos(angle), np.sin(angle)
        np.testing.assert_allclose(out[j], expected, atol=1e-6)


def test_rope_preserves_norms_and_scores_depend_only_on_offset():
    B, T, H, K = 1, 6, 3, 16
    q_BTHK = jax.random.normal(jax.random.key(0), (B, T, H, K))
    k_BTHK = jax.random.normal(jax.random.key(1), (B, T, H, K))
    pos_BT = jnp.array([[0, 1, 7, 30, 100, 511]])
    rq = positions.rope(q_BTHK, pos_BT, base=10000.0)
    np.testing.assert_allclose(
        jnp.linalg.norm(rq, axis=-1), jnp.linalg.norm(q_BTHK, axis=-1), rtol=1e-5
    )

    # Scores <rope(q, m), rope(k, n)> for many (m, n) pairs at once, each pair also shifted.
    pairs = np.array([(3, 0), (0, 3), (10, 10), (50, 17)])
    shifts = np.array([0, 1, 37, 400])
    m_BT = jnp.asarray((pairs[:, None, 0] + shifts[None]).reshape(1, -1))
    n_BT = jnp.asarray((pairs[:, None, 1] + shifts[None]).reshape(1, -1))
    q_1 = jnp.broadcast_to(q_BTHK[:, :1], (1, m_BT.shape[1], H, K))
    k_1 = jnp.broadcast_to(k_BTHK[:, :1], (1, m_BT.shape[1], H, K))
    scores = jnp.sum(positions.rope(q_1, m_BT) * positions.rope(k_1, n_BT), axis=-1)
    scores_PSH = np.asarray(scores).reshape(len(pairs), len(shifts), H)
    # float32 angles at positions ~450 carry ~5e-5 rad of rounding.
    np.testing.assert_allclose(
        scores_PSH, np.broadcast_to(scores_PSH[:, :1], scores_PSH.shape), atol=1e-4
    )
    assert np.abs(scores_PSH[0, 0] - scores_PSH[1, 0]).max() > 1e-2  # (3,0) vs (0,3) differ


def test_rope_model_is_shift_invariant():
    """Relative positions only: offsetting every position leaves the logits unchanged (fails
    if rope were applied to q but not k, or with different positions for each)."""
    params, tokens_BT = params_for(), random_tokens(2, (2, 10))
    pos_BT = jnp.broadcast_to(jnp.arange(10), (2, 10))
    logits, _ = apply_jit(CFG, params, tokens_BT, positions_BT=pos_BT)
    shifted, _ = apply_jit(CFG, params, tokens_BT, positions_BT=pos_BT + 100)
    np.testing.assert_allclose(shifted, logits, atol=1e-4)  # float32 angle rounding at ~100


def test_position_none_is_order_blind_and_rope_is_not():
    """With one layer the last query attends to the set of earlier keys, so with no position
    encoding its logits ignore the order of the earlier tokens; rope must see the order."""
    tokens_BT = random_tokens(3, (2, 12))
    perm = np.array([3, 0, 6, 1, 5, 2, 4, 10, 8, 9, 7, 11])  # last token stays last
    for kind, order_blind in (("none", True), ("rope", False)):
        cfg = dataclasses.replace(CFG, num_layers=1, position=kind)
        params = params_for(cfg)
        last, _ = apply_jit(cfg, params, tokens_BT)
        last_perm, _ = apply_jit(cfg, params, tokens_BT[:, perm])
        close = np.allclose(last[:, -1], last_perm[:, -1], atol=1e-5)
        assert close == order_blind, kind


def test_unknown_position_kind():
    q = jnp.ones((1, 2, 1, 4))
    with pytest.raises(ValueError, match="unknown position encoding 'xyz'; expected one of: "):
        positions.apply_positions("xyz", q, q, jnp.zeros((1, 2), jnp.int32))


def test_a_token_decoder_refuses_2d_rotary_positions_at_config_time():
    with pytest.raises(ValueError, match="position='rope2d' needs .row, column. patch positions"):
        transformer.TransformerConfig(
            vocab_size=8,
            d_model=16,
            num_heads=2,
            num_layers=1,
            d_ff=32,
            max_len=8,
            position="rope2d",
        )


def test_left_padding_matches_unpadded():
    """Row 0 is 12 real tokens; rows 1 and 2 hold its first 8 and 3 tokens, left-padded. By
    causality row 0's first n logits are those of the unpadded n-token sequence."""
    params, pads = params_for(), (0, 4, 9)
    tokens_12 = random_tokens(4, (12,))
    tokens_BT = jnp.stack([jnp.roll(tokens_12, p).at[:p].set(7) for p in pads])
    mask_BT = jnp.arange(12)[None] >= jnp.array(pads)[:, None]
    pos_BT = jnp.maximum(jnp.cumsum(mask_BT, axis=1) - 1, 0)
    logits, _ = apply_jit(CFG, params, tokens_BT, positions_BT=pos_BT, key_mask_BT=mask_BT)
    for row, pad in enumerate(pads):
        # Same math on the same numbers up to float32 summation order.
        np.testing.assert_allclose(logits[row, pad:], logits[0, : 12 - pad], atol=1e-5)
    assert np.isfinite(logits).all()  # padding queries see no keys: zeros, not NaN


def test_bfloat16_compute_close_to_float32_and_params_stay_float32():
    cfg16 = dataclasses.replace(CFG, dtype="bfloat16")
    params16 = transformer.init_params(cfg16, jax.random.key(0))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params16))
    tokens_BT = random_tokens(5, (2, 12))
    logits32, _ = apply_jit(CFG, params16, tokens_BT)
    logits16, _ = apply_jit(cfg16, params16, tokens_BT)
    assert logits16.dtype == jnp.float32
    err = np.abs(np.asarray(logits16) - np.asarray(logits32))
    rel_rms = np.sqrt(np.mean(err**2) / np.mean(np.asarray(logits32) ** 2))
    # bfloat16 rounds each stored value by up to 2^-9 relative (unit roundoff u ~ 0.002). The
    # logits go through ~20 rounded steps (activations, matmul outputs, residual adds) whose
    # errors add roughly in quadrature, so a relative RMS error of a few u is expected (0.011
    # measured over 6 seeds, max abs 0.06 on logits of size ~3). The bounds, ~3x the measured
    # values, would catch a wrong cast (e.g. a weight or logit computed in a low-precision int/fp8)
    # but are not tight enough to tell a bfloat16 softmax from a float32 one.
    assert rel_rms < 0.03 and err.max() < 0.1, (rel_rms, err.max())
    assert err.max() > 0  # the bfloat16 path really ran in bfloat16


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"d_model": 30}, "d_model"),  # not divisible by 4 heads
        ({"num_heads": 0}, "num_heads"),
        ({"vocab_size": -1}, "vocab_size"),
        ({"num_layers": 2.0}, "num_layers"),
        ({"d_model": 24, "num_heads": 8}, "head dim"),  # head dim 3 is odd, rope needs even
        ({"position": "alibi"}, "position"),
        ({"dtype": "int32"}, "dtype"),
        ({"param_dtype": "float99"}, "param_dtype"),
        ({"rope_base": 0.0}, "rope_base"),
        ({"num_kv_heads": 3}, "num_kv_heads"),  # does not divide 4 heads
        ({"num_kv_heads": 0}, "num_kv_heads"),
        ({"num_kv_heads": 2.0}, "num_kv_heads"),
        ({"tie_embeddings": "yes"}, "tie_embeddings"),
        ({"rope_layout": "gptj"}, "rope_layout"),
        ({"norm_eps": 0.0}, "norm_eps"),
        ({"norm_eps": -1e-5}, "norm_eps"),
    ],
)
def test_config_validation_errors_are_one_line_and_name_the_field(overrides, field):
    with pytest.raises(ValueError) as info:
        dataclasses.replace(CFG, **overrides)
    message = str(info.value)
    assert "\n" not in message and field in message, message


def test_odd_head_dim_is_fine_without_rope():
    transformer.TransformerConfig(
        vocab_size=8, num_layers=1, d_model=24, num_heads=8, d_ff=8, max_len=8, position="none"
    )


def first_rule(path):
    for pattern, spec in transformer.SHARDING_RULES:
        if re.search(pattern, path):
            return spec
    return None


def test_sharding_rules_match_every_kernel_also_inside_optimizer_state():
    paths = flat_paths(params_for())
    used = set()
    for path, leaf in paths.items():
        spec = first_rule(path)
        if leaf.ndim < 2:
            assert spec is None, path  # norm scales stay replicated (or FSDP by the core)
            continue
        assert spec is not None, f"{path} {leaf.shape} matched by no rule"
        assert len(spec) == leaf.ndim and list(spec).count("model") == 1, (path, spec)
        assert first_rule(f"opt_state/0/mu/{path}") == spec
        assert first_rule(f"{path}/extra") is None  # rules are suffixes
        used.add(next(p for p, _ in transformer.SHARDING_RULES if re.search(p, path)))
    assert used == {p for p, _ in transformer.SHARDING_RULES}  # no dead rules
    attn, mlp = "blocks/0/attn", "blocks/0/mlp"
    assert first_rule(f"{attn}/q/kernel") == P(None, "model")  # output dim (heads)
    assert first_rule(f"{attn}/o/kernel") == P("model", None)  # input dim (heads)
    assert first_rule(f"{mlp}/up/kernel") == P(None, "model")
    assert first_rule(f"{mlp}/down/kernel") == P("model", None)


def test_tensor_parallel_apply_matches_single_device():
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    params = params_for()

    def place(path, x):
        spec = first_rule(path_str(path)) or P()
        return jax.device_put(x, NamedSharding(mesh, spec))

    sharded = jax.tree_util.tree_map_with_path(place, params)
    assert sharded["blocks"][0]["attn"]["q"]["kernel"].sharding.spec == P(None, "model")
    tokens_BT = jax.device_put(random_tokens(6, (4, 12)), NamedSharding(mesh, P("data")))
    expected, _ = apply_jit(CFG, params, random_tokens(6, (4, 12)))
    got, _ = apply_jit(CFG, sharded, tokens_BT)
    np.testing.assert_allclose(got, expected, atol=1e-5)  # float32 reduction order only


def test_features_are_what_the_output_projection_reads():
    cfg = transformer.TransformerConfig(
        vocab_size=16, num_layers=1, d_model=16, num_heads=2, d_ff=32, max_len=8
    )
    params = transformer.init_params(cfg, jax.random.key(0))
    tokens_BT = jax.random.randint(jax.random.key(1), (2, 8), 0, 16)
    logits_BTV, _ = transformer.apply(cfg, params, tokens_BT)
    hidden_BTD = transformer.features(cfg, params, tokens_BT)
    assert hidden_BTD.shape == (2, 8, 16)
    # The same float32 matmul the head does; only summation order may differ (~1e-6).
    np.testing.assert_allclose(
        hidden_BTD @ params["lm_head"]["kernel"], logits_BTV, rtol=1e-5, atol=1e-5
    )
    with pytest.raises(ValueError, match="exceeds TransformerConfig.max_len"):
        transformer.features(cfg, params, jnp.zeros((1, 9), jnp.int32))
