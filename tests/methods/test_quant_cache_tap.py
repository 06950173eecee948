"""Q&C's calibration selection: TAP's affinity and spectral clustering, k-means, and the three
selection rules."""

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from core.errors import ConfigError
from methods.quant_cache import tap


def _planted(n_per=60, seed=0):
    """Four groups: 2 feature directions x 2 time ranges, so neither features alone nor time
    alone separates all four. Returns (x [N, 16], t [N], group [N])."""
    rng = np.random.default_rng(seed)
    directions = np.eye(16)[[0, 8]] * 3.0
    x, t, group = [], [], []
    for g in range(4):
        direction, early = directions[g % 2], g < 2
        x.append(direction + 0.4 * rng.normal(size=(n_per, 16)))
        t.append(rng.integers(0, 10, n_per) if early else rng.integers(40, 50, n_per))
        group.append(np.full(n_per, g))
    return np.concatenate(x), np.concatenate(t).astype(float), np.concatenate(group)


def test_spectral_clustering_recovers_groups_planted_in_feature_and_time():
    x, t, group = _planted()
    labels = tap.spectral_labels(tap.affinity(x, t), 4, rng=np.random.default_rng(0))
    # Four well-separated groups: a correct clustering scores ~1, a clustering that merges the
    # time groups (features alone) at most ~0.5; 0.9 leaves room for a few stray points.
    assert adjusted_rand_score(group, labels) > 0.9
    # k-means on the features alone cannot see time: it does not find the four groups.
    km, _ = tap.kmeans(x, 4, rng=np.random.default_rng(0))
    assert adjusted_rand_score(group, km) < 0.7


def test_negative_cosines_are_clipped_and_clusters_still_recovered():
    x, t, group = _planted(seed=1)
    x = x - x.mean(0)  # centred: many pairs now have cos < 0
    A = tap.affinity(x, t)
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    assert (u @ u.T).min() < -0.5  # the data really has negative cosines
    assert A.min() >= 0 and np.all(np.isfinite(A))
    d = A.sum(1)
    L = A / np.sqrt(np.outer(d, d))
    assert np.all(np.isfinite(L)) and L.min() >= 0
    labels = tap.spectral_labels(A, 4, rng=np.random.default_rng(0))
    assert adjusted_rand_score(group, labels) > 0.9


def test_temporal_affinity_is_local_with_integer_steps():
    t = np.arange(0, 1000, dtype=float)
    A = tap.affinity(np.ones((len(t), 2)), t, alpha=0.0)  # the temporal term alone
    assert A[0, 1] == pytest.approx(np.exp(-1))
    assert A[0, 5] < np.exp(-5) + 1e-12  # five steps apart: ~0, block-diagonal in time
    wide = tap.affinity(np.ones((len(t), 2)), t / 999, alpha=0.0)  # t normalised to [0, 1]
    assert wide.min() >= np.exp(-1) - 1e-12  # ... then nearly flat instead


def test_selections_are_unique_valid_and_deterministic():
    x, t, group = _planted()
    for select in (
        lambda rng: tap.uniform_select(len(x), 40, rng=rng),
        lambda rng: tap.kmeans_select(x, 40, k=4, rng=rng),
        lambda rng: tap.tap_select(x, t, 40, k=4, rng=rng, fraction=0.5),
    ):
        a, b = select(np.random.default_rng(3)), select(np.random.default_rng(3))
        np.testing.assert_array_equal(a, b)
        assert len(a) == 40 == len(set(a.tolist())) and a.min() >= 0 and a.max() < len(x)


def test_tap_draws_from_every_planted_group():
    x, t, group = _planted()
    rows = tap.tap_select(x, t, 8, k=4, rng=np.random.default_rng(4), fraction=0.5)
    # 8 draws, round-robin over 3 subsamples x 4 clusters that match the groups: every group
    # appears (uniform draws of 8 from 240 miss a group with probability ~0.4).
    assert set(group[rows]) == {0, 1, 2, 3}


def test_kmeans_recovers_separated_blobs():
    rng = np.random.default_rng(5)
    centres = np.array([[0, 0], [10, 0], [0, 10]], float)
    x = np.concatenate([c + rng.normal(size=(30, 2)) for c in centres])
    labels, centroids = tap.kmeans(x, 3, rng=rng)
    assert adjusted_rand_score(np.repeat([0, 1, 2], 30), labels) == 1.0
    assert np.abs(np.sort(centroids[:, 0]) - [0, 0, 10]).max() < 1.0


def test_bad_arguments_are_one_line_errors():
    x, t, _ = _planted(n_per=5)
    rng = np.random.default_rng(0)
    for call, words in [
        (lambda: tap.uniform_select(10, 11, rng=rng), "n_select=11"),
        (lambda: tap.kmeans(x, 0, rng=rng), "k=0"),
        (lambda: tap.affinity(x, t, alpha=1.5), "alpha=1.5"),
        (lambda: tap.affinity(x, t, time_unit=0), "time_unit=0"),
        (lambda: tap.tap_select(x, t, 4, k=4, rng=rng, fraction=0.05), "cannot hold k=4"),
        (lambda: tap.tap_select(x, t, 4, k=0, rng=rng), "k=0"),
        (lambda: tap.tap_select(x, t, 4, k=2, rng=rng, fraction=0), "fraction=0"),
        (lambda: tap.tap_select(x, t, 21, k=2, rng=rng), "n_select=21"),
        (lambda: tap.kmeans_select(x, 21, k=2, rng=rng), "n_select=21"),
    ]:
        with pytest.raises(ConfigError, match=words) as info:
            call()
        assert "\n" not in str(info.value)
