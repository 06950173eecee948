"""core.digits: the fixed splits, the Frechet distance, the conditional accuracy, and (slow)
the classifier's accuracy and cache."""

import jax
import numpy as np
import pytest
import scipy.linalg

from core import digits


def test_splits_are_fixed_disjoint_stratified_and_scaled():
    labels = np.repeat(np.arange(10), 20)
    train, val, test = digits.split_indices(labels)
    assert len(set(train) | set(val) | set(test)) == len(labels)
    assert len(train) + len(val) + len(test) == len(labels)
    for part, share in zip((train, val, test), digits.SPLIT_FRACTIONS, strict=True):
        assert np.all(np.bincount(labels[part], minlength=10) == round(share * 20))
    np.testing.assert_array_equal(digits.split_indices(labels)[0], train)  # seeded, fixed
    splits = digits.load_splits()
    assert [len(s.labels) for s in splits] == [1078, 359, 360]
    assert splits.train.images.min() == -1 and splits.train.images.max() == 1
    assert splits.train.images.shape[1:] == digits.IMAGE_SHAPE


def test_frechet_distance_is_zero_for_identical_sets():
    a_ND = np.random.default_rng(0).normal(size=(300, 8)) @ np.diag(np.arange(1.0, 9.0))
    # float64 eigen-decompositions of a matrix of scale ~64: round-off ~1e-12 of that.
    assert abs(digits.frechet_distance(a_ND, a_ND)) < 1e-8


def test_frechet_distance_of_a_mean_shift_is_its_squared_length():
    """Equal covariances: FD = |mu1 - mu2|^2 exactly (the trace terms cancel)."""
    a_ND = np.random.default_rng(1).normal(size=(500, 6)) @ np.random.default_rng(2).normal(
        size=(6, 6)
    )
    for length in (0.5, 2.0, 5.0):
        shift = length * np.ones(6) / np.sqrt(6)
        # float64 round-off of traces of ~10: 1e-9 absolute.
        assert digits.frechet_distance(a_ND + shift, a_ND) == pytest.approx(length**2, abs=1e-9)


def test_frechet_distance_matches_scipy_sqrtm():
    rng = np.random.default_rng(3)
    a_ND = rng.normal(size=(400, 5)) @ rng.normal(size=(5, 5))
    b_ND = rng.normal(size=(300, 5)) @ rng.normal(size=(5, 5)) + 0.3
    mu_a, mu_b = a_ND.mean(0), b_ND.mean(0)
    s_a, s_b = np.cov(a_ND, rowvar=False), np.cov(b_ND, rowvar=False)
    cross = np.real(scipy.linalg.sqrtm(s_a @ s_b))
    expected = np.sum((mu_a - mu_b) ** 2) + np.trace(s_a + s_b - 2 * cross)
    # scipy's Schur-based sqrtm of a non-symmetric product vs our eigh route: ~1e-10 relative.
    assert digits.frechet_distance(a_ND, b_ND) == pytest.approx(expected, rel=1e-8)


def test_conditional_accuracy_counts_argmax_equal_to_the_requested_label():
    settings = digits.ClassifierSettings()
    clf = digits.Classifier(
        jax.tree.map(np.asarray, digits.init_classifier(settings, jax.random.key(0))), settings, 0.0
    )
    images = digits.load_splits().validation.images[:50]
    # The classifier's own argmax, computed here rather than through digits.predict.
    predicted = np.asarray(digits.forward(clf.params, images)["logits"]).argmax(-1)
    assert digits.conditional_accuracy(clf, images, predicted) == 1.0
    assert digits.conditional_accuracy(clf, images, (predicted + 1) % 10) == 0.0
    half = np.where(np.arange(50) < 25, predicted, (predicted + 1) % 10)
    assert digits.conditional_accuracy(clf, images, half) == 0.5
    assert digits.features(clf, images).shape == (50, settings.feature_dim)


@pytest.mark.slow  # trains the classifier: ~30 s on a loaded 2-core machine
def test_classifier_reaches_its_accuracy_and_is_read_back_from_the_cache(tmp_path):
    clf = digits.classifier(str(tmp_path))
    assert clf.test_accuracy >= 0.97  # a small CNN's usual ~98 %; measured 0.983
    again = digits.classifier(str(tmp_path))  # read back, not retrained
    jax.tree.map(np.testing.assert_array_equal, clf.params, again.params)
    assert len(list((tmp_path / "digits_classifier").glob("*.npz"))) == 1
