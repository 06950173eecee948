"""Q&C's calibration selection: TAP's affinity and spectral clustering, k-means, and the three
selection rules."""

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from core.errors import ConfigError
from methods.quant_cache import tap


def _planted(n_per=60, seed=0):
    """Four groups that neither features nor time separate alone: groups 0 and 1 share a feature
    direction and differ in time (sampler step 0 vs 40); groups 0 and 2 share a step and differ
    in direction; group 3 has its own direction at step 40. Returns (x [N, 16], t [N], group).

    Why not the 2 x 2 design (two directions x two times): TAP's affinity is a *sum* of a
    feature and a time term, and on a 2 x 2 factorial design such a sum has no fourth
    eigenvalue (the feature x time interaction is invisible to it), so no spectral clustering of
    it can find four groups. Why one step per group: with t in steps and time_unit 1, samples
    one step apart have temporal affinity exp(-1) only, so a group spread over steps splits by
    step (what the pool of the experiment is made of: see README)."""
    rng = np.random.default_rng(seed)
    directions = np.eye(16)[[0, 0, 5, 10]] * 3.0
    x = np.concatenate([d + 0.4 * rng.normal(size=(n_per, 16)) for d in directions])
    t = np.repeat([0.0, 40.0, 0.0, 40.0], n_per)
    return x, t, np.repeat(np.arange(4), n_per)


def test_spectral_clustering_recovers_groups_planted_in_feature_and_time():
    for data_seed in range(3):
        x, t, group = _planted(seed=data_seed)
        A = tap.affinity(x, t)
        for seed in range(5):  # not one lucky k-means start: every one of them
            labels = tap.spectral_labels(A, 4, rng=np.random.default_rng(seed))
            # A correct clustering scores 1; merging two groups scores about .7 or less.
            assert adjusted_rand_score(group, labels) > 0.9, (data_seed, seed)
        # k-means on the features alone cannot see time: it merges groups 0 and 1.
        best = max(
            adjusted_rand_score(group, tap.kmeans(x, 4, rng=np.random.default_rng(s))[0])
            for s in range(5)
        )
        assert best < 0.8, data_seed


def test_negative_cosines_are_clipped_and_clusters_still_recovered():
    x, t, group = _planted(seed=1)
    x = x - x.mean(0)  # centred: many pairs now have cos < 0
    A = tap.affinity(x, t)
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    assert (u @ u.T).min() < -0.5  # the data really has negative cosines
    assert A.min() >= 0 and np.all(np.isfinite(A))
    L = tap.normalized(A)
    assert np.all(np.isfinite(L)) and L.min() >= 0
    # The normalisation's fingerprint: top eigenvalue 1, eigenvector proportional to sqrt(d)
    # (float64 eigh of a 240 x 240 matrix: ~1e-12).
    w, v = np.linalg.eigh(L)
    assert w[-1] == pytest.approx(1.0, abs=1e-9)
    sqrt_d = np.sqrt(A.sum(1))
    assert abs(v[:, -1] @ sqrt_d) / np.linalg.norm(sqrt_d) == pytest.approx(1.0, abs=1e-9)
    for seed in range(5):
        labels = tap.spectral_labels(A, 4, rng=np.random.default_rng(seed))
        assert adjusted_rand_score(group, labels) > 0.9, seed


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
    # As many draws as groups: round-robin takes one member of each cluster of the first
    # subsample, so when the clusters match the groups every group appears, for every seed.
    # Draws that ignore the clusters cover all four with probability 4! / 4^4 ~ .09 per seed.
    for seed in range(5):
        rows = tap.tap_select(x, t, 4, k=4, rng=np.random.default_rng(seed), fraction=0.5)
        assert set(group[rows]) == {0, 1, 2, 3}, seed


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
