"""Brain-Semantoks' losses, masks and teacher: each against a direct computation, each able to
fail for a plausible bug (a teacher that gets gradients, same-view pairs in the compression, the
masker's integer rules off by one, an EMA the wrong way round)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import brain_semantoks as bs_config
from core import train
from methods import brain_semantoks
from methods.brain_semantoks import losses, model


def unit(x):
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def test_coding_rate_equals_a_direct_slogdet():
    z = unit(jax.random.normal(jax.random.key(0), (2, 24, 8)))
    v, b, p = z.shape
    direct = 0.0
    for i in range(v):
        m = np.eye(p) + p / (b * losses.EPS) * np.asarray(z[i], np.float64).T @ np.asarray(z[i])
        direct += 0.5 * np.linalg.slogdet(m)[1] / v
    direct *= (p + b) / (p * b)
    # float32 Cholesky of a well-conditioned 8 x 8 matrix: ~1e-6 relative.
    np.testing.assert_allclose(float(losses.coding_rate(z)), direct, rtol=1e-5)


def test_gradients_reach_only_the_student():
    k1, k2 = jax.random.split(jax.random.key(1))
    s = unit(jax.random.normal(k1, (2, 16, 8)))
    t = unit(jax.random.normal(k2, (2, 16, 8)))
    g_s, g_t = jax.grad(lambda s, t: losses.mcr_loss(s, t)[0], argnums=(0, 1))(s, t)
    assert float(jnp.abs(g_t).max()) == 0.0
    assert float(jnp.abs(g_s).max()) > 1e-3
    # The expansion's own gradient reaches the student (through its half of the mean).
    g_exp = jax.grad(lambda s: losses.coding_rate((s + jax.lax.stop_gradient(t)) / 2))(s)
    assert float(jnp.abs(g_exp).max()) > 1e-4


def test_the_compression_leaves_out_same_view_pairs():
    k1, k2 = jax.random.split(jax.random.key(2))
    a = unit(jax.random.normal(k1, (16, 8)))
    b = unit(jax.random.normal(k2, (16, 8)))
    # Student and teacher agree within each view (the diagonal) but the views are unrelated:
    # counting same-view pairs would give ~1/2, the cross-view mean is ~0.
    views = jnp.stack([a, b])
    cross = float(jnp.mean(jnp.sum(a * b, -1)))
    np.testing.assert_allclose(float(losses.compression(views, views)), cross, atol=1e-6)


def test_aligned_and_spread_embeddings_minimise_the_cls_loss():
    b, p = 32, 16
    spread = unit(jax.random.normal(jax.random.key(3), (b, p)))
    aligned = losses.mcr_loss(jnp.stack([spread, spread]), jnp.stack([spread, spread]))[0]
    collapsed_z = jnp.tile(spread[:1], (b, 1))
    collapsed = losses.mcr_loss(jnp.stack([collapsed_z] * 2), jnp.stack([collapsed_z] * 2))[0]
    other = unit(jax.random.normal(jax.random.key(4), (b, p)))
    misaligned = losses.mcr_loss(jnp.stack([spread, spread]), jnp.stack([other, other]))[0]
    assert float(aligned) < float(collapsed) - 0.1  # spread beats collapse
    assert float(aligned) < float(misaligned) - 0.5  # alignment across views beats none


def test_the_ttr_weight_decays_over_its_fraction_then_stays_zero():
    w = lambda step, frac: float(losses.ttr_weight(step, 1000, frac))
    assert w(0, 0.05) == pytest.approx(0.5)
    assert w(25, 0.05) == pytest.approx(0.25, abs=1e-6)
    assert w(49, 0.05) > 0 and w(50, 0.05) == 0.0 and w(999, 0.05) == 0.0
    assert w(500, 1.0) == pytest.approx(0.25, abs=1e-6) and w(10, 0.0) == 0.0


def test_slice_masks_follow_the_official_integer_rules():
    # Networks: randint(int(.65 * 6), int(.85 * 6)) = randint(3, 5), exclusive: 3 or 4 rows.
    assert losses.network_counts(6, (0.65, 0.85)) == (3, 5)
    # Patches: min(ceil(r * 5), 5) - 1 for r in [.65, .85]: ceil(3.25..4.25) - 1 = 3 or 4.
    assert [int(losses.block_length(r, 5)) for r in (0.65, 0.8, 0.81, 0.85)] == [3, 3, 4, 4]
    m = np.asarray(losses.slice_masks(jax.random.key(5), 512, 6, 5))
    by_rows = np.all(m == m[:, :, :1], axis=2).all(1) & m.any((1, 2))
    rows = m[by_rows][:, :, 0].sum(1)
    assert set(rows) == {3, 4}
    cols = m[~by_rows][:, 0, :]
    assert np.all(m[~by_rows] == cols[:, None, :])  # whole columns
    assert set(cols.sum(1)) == {3, 4}
    assert all(np.all(np.diff(np.flatnonzero(c)) == 1) for c in cols)  # contiguous
    assert 0.35 < by_rows.mean() < 0.65


def test_masked_tokens_keep_their_positions():
    cfg = model.ModelConfig(dim=16, heads=2, depth=0, mlp=32, dense_channels=8, sg_channels=8,
                            head_hidden=16, head_out=8)  # fmt: skip
    params, buffers = model.init(cfg, jax.random.key(6))
    x = jax.random.normal(jax.random.key(7), (1, cfg.rois, cfg.crop))
    mask = jnp.zeros((1, cfg.rows, cfg.patches), bool).at[0, 1, 2].set(True).at[0, 4, 0].set(True)
    tokens = model.encode(cfg, params, buffers, x, mask)[0, 1:].reshape(cfg.rows, cfg.patches, -1)
    pos = model.sincos_1d(np.arange(cfg.patches), cfg.dim)
    for g, p in ((1, 2), (4, 0)):
        expect = model.layer_norm(
            params["norm"], params["mask_token"] + params["row_embedding"][g] + pos[p]
        )
        np.testing.assert_allclose(tokens[g, p], expect, atol=1e-5)
    assert float(jnp.abs(tokens[1, 2] - tokens[4, 0]).max()) > 0.1


def smoke():
    c = bs_config.get_config("size=smoke")
    c.dtype = "float32"
    return c


def test_the_teacher_is_an_ema_of_the_student_after_each_step():
    c = smoke()
    session = train.init(c, brain_semantoks.make(c), devices=jax.devices()[:1])
    session.train(1)  # the warm-up's first learning rate is 0: step 1 leaves the student
    teacher0 = jax.device_get(session.state.extra["teacher"])
    params0 = jax.device_get(session.state.params)
    session.train(1)
    params1 = jax.device_get(session.state.params)
    teacher1 = jax.device_get(session.state.extra["teacher"])
    m = float(losses.momentum(1, c.train.steps, c.ssl.momentum))
    assert 0.99 < m < 1
    expect = jax.tree.map(lambda t, p: m * t + (1 - m) * p, teacher0, params1)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), teacher1,
                 expect)  # fmt: skip
    moved = jax.tree.leaves(jax.tree.map(lambda a, b: np.abs(a - b).max(), params0, params1))
    assert max(moved) > 0  # the student moved, so the check above can tell m from 1 - m
    # The momentum's cosine reaches 1 at the last step.
    assert float(losses.momentum(c.train.steps, c.train.steps)) == pytest.approx(1.0)
