"""methods/dupa/collapse_check.collapse_metrics on tokens of known geometry."""

import numpy as np

from methods.dupa.collapse_check import collapse_metrics


def test_collapsed_tokens_read_as_collapse_and_random_ones_do_not():
    rng = np.random.default_rng(0)
    shared_NP = rng.normal(size=(4, 16))
    # one vector per position for every image and path, plus 1 % noise
    collapsed = shared_NP + 0.01 * rng.normal(size=(2, 32, 4, 16))
    m = collapse_metrics(collapsed)
    # 1 % isotropic noise moves a cosine by ~1e-4 and the spread to ~0.01 * sqrt(16) / |v|
    assert m["same"] > 0.99 and m["cross"] > 0.99 and m["spread"] < 0.05
    # paths agree per image, images differ: what a good (non-collapsed) alignment looks like
    per_image = rng.normal(size=(32, 4, 16))
    aligned = per_image + 0.01 * rng.normal(size=(2, 32, 4, 16))
    m = collapse_metrics(aligned)
    # independent 16-d Gaussians: each cross cosine has sd 1/4, their mean over 32 * 31 / 2
    # pairs at 4 positions sd ~0.006; 0.02 (3.5 sd) still fails if the diagonal is counted (+1/32)
    assert m["same"] > 0.99 and abs(m["cross"]) < 0.02 and m["spread"] > 0.8


def test_a_code_of_the_label_reads_as_collapse_among_same_class_images_only():
    rng = np.random.default_rng(1)
    labels = np.repeat(np.arange(8), 4)  # 8 classes of 4 images
    code_CNP = rng.normal(size=(8, 4, 16))  # one vector per class and position
    coded = code_CNP[labels] + 0.01 * rng.normal(size=(2, 32, 4, 16))
    m = collapse_metrics(coded, labels)
    # the two paths agree, as do two images of one class; other classes ~independent 16-d draws
    assert m["same"] > 0.99 and m["cross_same_class"] > 0.99
    # all pairs: 3 of 31 others share the class -> ~0.1 + 0.9 * N(0, 1/4) / sqrt(many pairs)
    assert m["cross"] < 0.3
    assert "cross_same_class" not in collapse_metrics(coded)
