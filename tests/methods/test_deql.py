"""DEQL: the closed-form identities of the paper, the metrics, the ML-100k loader."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp
from jax.sharding import AxisType

from core.errors import ConfigError
from methods.deql import data, metrics, solvers

# (a, b, p, lam): plain, L2, b > a (allowed and sometimes best), small b with small p.
SETTINGS = [(1.0, 0.5, 0.5, 0.0), (1.0, 0.5, 0.5, 3.0), (1.0, 1.5, 0.3, 1.0), (0.8, 0.2, 0.1, 0.5)]


def _ratings(users=40, items=9, density=0.35, seed=0):
    rng = np.random.default_rng(seed)
    R = (rng.random((users, items)) < density).astype(np.float64)
    R[0] = 1.0  # every item has an interaction, so lam = 0 solves are non-singular
    return R


# ---------------------------------------------------------------------------------------------
# Solvers


@pytest.mark.parametrize("zero_diag", [False, True])
@pytest.mark.parametrize("a,b,p,lam", SETTINGS)
def test_miller_equals_direct_per_column_solve(a, b, p, lam, zero_diag):
    K = _ratings().T @ _ratings()
    W = np.asarray(solvers.deql(K, a, b, p, lam, zero_diag=zero_diag))
    W_direct = solvers.deql_direct(K, a, b, p, lam, zero_diag=zero_diag)
    assert W.dtype == np.float64
    # Both are float64 solves of 9 x 9 systems (measured gap ~1e-15); 1e-10 leaves room for the
    # conditioning of H^(i) while catching any wrong entry of G^(i), g^(i) or the updates.
    np.testing.assert_allclose(W, W_direct, rtol=0, atol=1e-10 * np.abs(W_direct).max())
    if zero_diag:
        assert np.abs(np.diag(W)).max() < 1e-12


def test_expected_loss_equals_monte_carlo_average_over_dropout_masks():
    R = _ratings(users=20, items=6)
    a, b, p = 1.0, 0.6, 0.4
    W = np.random.default_rng(1).normal(scale=0.3, size=(6, 6))
    with jax.enable_x64(True):
        analytic = float(solvers.expected_loss(jnp.asarray(W), jnp.asarray(R), a, b, p))
    rng = np.random.default_rng(2)
    kept_SUI = rng.random((20_000, *R.shape)) >= p  # Delta = 1 keeps the entry
    A_SUI = np.where(kept_SUI, b, a)
    loss_S = np.sum((A_SUI * (R - (kept_SUI * R) @ W)) ** 2, axis=(1, 2))
    stderr = loss_S.std() / np.sqrt(len(loss_S))
    # The MC mean is unbiased with this standard error; 5 SE fails by chance with p ~ 6e-7
    # (and the seeds are fixed), while a wrong coefficient moves the loss by many SE.
    assert abs(loss_S.mean() - analytic) < 5 * stderr


@pytest.mark.parametrize("a,b,p,lam", SETTINGS)
def test_gradient_of_expected_loss_vanishes_at_the_solution(a, b, p, lam):
    R = _ratings()
    with jax.enable_x64(True):
        R = jnp.asarray(R)
        objective = lambda W: solvers.expected_loss(W, R, a, b, p) + lam * jnp.sum(W**2)
        grad = jax.grad(objective)
        scale = float(jnp.abs(grad(jnp.zeros((9, 9)))).max())  # |2 v| at W = 0
        g = np.asarray(grad(solvers.deql(R.T @ R, a, b, p, lam)))
        g_free = np.asarray(grad(solvers.deql(R.T @ R, a, b, p, lam, zero_diag=True)))
    # float64 rounding of O(1) terms: 1e-9 of the gradient's scale (measured ~1e-15). With the
    # zero-diagonal constraint only the off-diagonal gradient vanishes (the diagonal carries the
    # Lagrange multiplier).
    assert np.abs(g).max() < 1e-9 * scale
    off_diagonal = ~np.eye(9, dtype=bool)
    assert np.abs(g_free[off_diagonal]).max() < 1e-9 * scale
    assert np.abs(np.diag(g_free)).max() > 1e-6 * scale  # the constraint is active


def test_b0_zero_diag_equals_edlae_once_lambda_is_on_deql_scale():
    K = _ratings().T @ _ratings()
    a, p, lam = 0.8, 0.5, 0.2
    W = np.asarray(solvers.deql(K, a, 0.0, p, lam, zero_diag=True))
    B = np.asarray(solvers.edlae(K, p, lam / (p * a**2 * (1 - p) ** 2)))
    # Exact algebraic identity, float64 (measured 1e-16).
    np.testing.assert_allclose(W * (1 - p), B, rtol=0, atol=1e-10 * np.abs(B).max())
    # With the same lam in both they are different models (notes: 14 % at these values).
    same_lam = np.asarray(solvers.edlae(K, p, lam))
    assert np.abs(W * (1 - p) - same_lam).max() > 0.01 * np.abs(B).max()


def test_ease_is_edlae_without_dropout_and_has_zero_diagonal():
    K = _ratings().T @ _ratings()
    B = np.asarray(solvers.ease(K, 2.0))
    np.testing.assert_array_equal(B, np.asarray(solvers.edlae(K, 0.0, 2.0)))
    assert np.all(np.diag(B) == 0)
    # EASE column i solves the reduced system (K + lam I)_{-i,-i} b = K_{-i,i}.
    keep = np.arange(9) != 3
    col = np.linalg.solve((K + 2.0 * np.eye(9))[np.ix_(keep, keep)], K[keep, 3])
    np.testing.assert_allclose(B[keep, 3], col, rtol=1e-10)


def test_solvers_reject_bad_input():
    K = np.eye(3)
    with pytest.raises(ConfigError, match="singular"):
        solvers.deql(K, 1.0, 0.0, 0.5, 0.0)
    with pytest.raises(ConfigError, match="p=1.0"):
        solvers.edlae(K, 1.0, 1.0)
    with pytest.raises(ConfigError, match="square"):
        solvers.ease(np.ones((2, 3)), 1.0)


def test_sharded_gram_on_8_devices_equals_single_device():
    X = _ratings(users=37, items=11).astype(np.float32)  # 37 users: padding to 40 is exercised
    mesh = jax.make_mesh((2, 4), ("data", "fsdp"), axis_types=(AxisType.Auto,) * 2)
    assert mesh.size == 8
    K_sharded = np.asarray(solvers.sharded_gram(X, mesh))
    # Integer counts are exact in float32, so the sum order across devices cannot matter.
    np.testing.assert_array_equal(K_sharded, np.asarray(solvers.gram(X)))
    np.testing.assert_array_equal(K_sharded, X.T @ X)


# ---------------------------------------------------------------------------------------------
# Metrics


def test_recall_is_normalised_by_min_k_heldout_and_fold_in_is_masked():
    scores = np.array([[9.0, 8.0, 7.0, 6.0, 5.0, 4.0], [9.0, 8.0, 7.0, 6.0, 5.0, 4.0]])
    fold_in = np.array([[1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]], np.float32)
    held_out = np.array([[0, 1, 0, 1, 1, 0], [0, 0, 1, 0, 0, 0]], np.float32)
    m = metrics.topk_metrics(scores, fold_in, held_out, k=2)
    # User 0: item 0 (top score) is fold-in, so the top 2 are items 1, 2: one hit of min(2, 3).
    # User 1: top 2 are items 0, 1, no hit; its one held-out item is ranked 3rd.
    np.testing.assert_allclose(m["recall"], [0.5, 0.0])
    ideal = 1 + 1 / np.log2(3)
    np.testing.assert_allclose(m["ndcg"], [1 / ideal, 0.0], rtol=1e-6)
    m3 = metrics.topk_metrics(scores, fold_in, held_out, k=3)
    np.testing.assert_allclose(m3["recall"], [2 / 3, 1.0])  # user 1: 1 hit / min(3, 1)


def test_evaluate_batches_and_skips_users_without_held_out_items():
    W = np.diag(np.arange(5, dtype=np.float64))[::-1]  # item j scores item 4 - j
    fold_in = sp.csr_matrix(np.eye(5, dtype=np.float32)[[0, 1, 2]])
    held_out = sp.csr_matrix(np.array([[0, 0, 0, 0, 1], [0, 0, 0, 1, 0], [0, 0, 0, 0, 0]]))
    # User u folds in item u and scores item 4 - u highest (weight 4 - u > 0 except u = 4).
    m = metrics.evaluate(W, fold_in, held_out, k=1, batch_size=2)
    assert m == {"recall": 1.0, "ndcg": 1.0}  # user 2 (no held-out items) is left out
    with pytest.raises(ConfigError, match="k=9"):
        metrics.evaluate(W, fold_in, held_out, k=9)


# ---------------------------------------------------------------------------------------------
# Data

INTER = (
    "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
    "u1\t10\t5\t1\nu1\t11\t3\t2\nu2\t10\t4\t3\nu2\t12\t4.5\t4\nu3\t11\t1\t5\n"
)


def test_reads_recbole_inter_and_grouplens_u_data_alike(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "ml-100k.inter").write_text(INTER)
    rows = [line.split("\t") for line in INTER.splitlines()[1:]]
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "u.data").write_text("\n".join("\t".join(r) for r in rows) + "\n")
    for folder in ("a", "b"):
        path = data.ml100k_path(tmp_path / folder)  # found: no download
        X = data.load_ml100k(path)
        assert X.user_ids.tolist() == ["u1", "u2"]  # u3 has no rating >= 4
        assert X.item_ids.tolist() == ["10", "12"]
        np.testing.assert_array_equal(X.matrix.toarray(), [[1, 0], [1, 1]])


def test_data_env_folder_is_used(tmp_path, monkeypatch):
    (tmp_path / "u.data").write_text("1\t2\t5\t0\n")
    monkeypatch.setenv("DEQL_DATA", str(tmp_path))
    assert data.ml100k_path() == tmp_path / "u.data"


@pytest.mark.parametrize(
    "text,message",
    [
        (INTER.replace("u2\t10\t4\t3", "u2\t10\t4"), "line 4: expected 4 tab-separated fields"),
        (INTER.replace("4.5", "good"), "line 5: rating 'good' is not a number"),
        (INTER.replace("rating:float", "score:float"), "line 1: the header lacks column"),
        (INTER.splitlines()[0] + "\n", "no ratings after the header"),
        ("", "the ratings file is empty"),
        ("1\t2\t3\t0\n", "no rating is >= 4"),
    ],
)
def test_malformed_files_give_one_line_errors(tmp_path, text, message):
    path = tmp_path / "ratings.inter"
    path.write_text(text)
    with pytest.raises(data.DataError, match=message) as err:
        data.load_ml100k(path)
    assert "\n" not in str(err.value)


def test_missing_file_gives_one_line_error(tmp_path):
    with pytest.raises(data.DataError, match="cannot read"):
        data.read_interactions(tmp_path / "absent.inter")


def _random_interactions(users=60, items=30, seed=0):
    X = (np.random.default_rng(seed).random((users, items)) < 0.3).astype(np.float32)
    X[:, 0] = 1  # every user has >= 2 interactions in practice; item 0 is in every split's train
    return sp.csr_matrix(X)


def test_strong_split_holds_out_users_and_folds_in_80_percent():
    X = _random_interactions()
    s = data.strong_split(X, n_val=10, n_test=12, seed=3)
    assert (s.train.shape[0], s.val_in.shape[0], s.test_in.shape[0]) == (38, 10, 12)
    assert np.all(np.diff(s.train.tocsc().indptr) > 0)  # only items seen in train are kept
    parts = (s.train, s.val_in, s.val_out, s.test_in, s.test_out)
    assert X.nnz == sum(m.nnz for m in parts) + s.dropped  # every interaction accounted for
    for fold_in, held_out in ((s.val_in, s.val_out), (s.test_in, s.test_out)):
        assert fold_in.multiply(held_out).nnz == 0
        n_in, n_out = np.diff(fold_in.indptr), np.diff(held_out.indptr)
        assert np.all(n_out >= 1)
        total = n_in + n_out
        assert np.all(np.abs(n_out - 0.2 * total) <= 0.5 + 1)  # rounding, min 1 held out
    again = data.strong_split(X, n_val=10, n_test=12, seed=3)
    assert (again.test_out != s.test_out).nnz == 0  # seeded
    other = data.strong_split(X, n_val=10, n_test=12, seed=4)
    assert other.test_out.shape != s.test_out.shape or (other.test_out != s.test_out).nnz > 0
    with pytest.raises(data.DataError, match="n_val=50"):
        data.strong_split(X, n_val=50, n_test=12, seed=0)


def test_weak_split_partitions_every_users_interactions():
    X = _random_interactions()
    s = data.weak_split(X, seed=0)
    full = X[:, s.items]
    np.testing.assert_array_equal((s.train + s.val + s.test).toarray(), full.toarray())
    assert s.train.multiply(s.val).nnz == s.train.multiply(s.test).nnz == 0
    assert X.nnz == s.train.nnz + s.val.nnz + s.test.nnz + s.dropped
    # An item only one user has, with its one interaction outside train, is dropped and counted.
    Y = X.toarray()
    Y[:, -1] = 0
    Y[0, -1] = 1
    lone = [data.weak_split(sp.csr_matrix(Y), seed=k) for k in range(8)]
    assert any(w.dropped >= 1 and Y.shape[1] - 1 not in w.items for w in lone)
    assert abs(s.test.nnz / full.nnz - 0.2) < 0.05  # per-user rounding of 20 %
    with pytest.raises(data.DataError, match="fractions"):
        data.weak_split(X, seed=0, fractions=(0.5, 0.5, 0.5))


def test_real_movielens_100k():
    try:
        path = data.ml100k_path()
    except data.DataError as e:
        if os.environ.get("DEQL_DATA_REQUIRED"):
            raise
        pytest.skip(f"ML-100k unavailable: {e}")
    X = data.load_ml100k(path)
    if path.name == data.INTER_NAME:  # the recbole copy, measured once: rating >= 4
        assert X.matrix.shape == (942, 1447) and X.matrix.nnz == 55_375
    s = data.strong_split(X.matrix, n_val=100, n_test=100, seed=0)
    assert s.val_in.shape[0] == s.test_in.shape[0] == 100


def test_float32_cholesky_refined_to_float64_accuracy():
    """`_spd_inverse` factors in float32 (float64 Cholesky does not compile for multi-chip TPUs)
    and refines in float64: at cond(H) = 1e4 float32 alone is 5e-5 off numpy's float64 inverse,
    the refined inverse 2e-13 (measured). `factor64` (one device: `fit_host`, the experiment)
    factors in float64 and must reach the same accuracy."""
    rng = np.random.default_rng(0)
    Q, _ = np.linalg.qr(rng.normal(size=(200, 200)))
    H = (Q * np.logspace(0, 4, 200)) @ Q.T
    want = np.linalg.inv(H)
    with jax.enable_x64(True):
        got = np.asarray(solvers._spd_inverse(jnp.asarray(H)))
        host = np.asarray(solvers._spd_inverse(jnp.asarray(H), factor64=True))  # fit_host's
    # float64's own inversion error at cond 1e4 is ~cond * 1.1e-16 = 1e-12; 1e-11 allows that
    # ten times over and is 5e6 times below what float32 without refinement gives.
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-11
    assert np.linalg.norm(host - want) / np.linalg.norm(want) < 1e-11
