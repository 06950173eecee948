"""DOIT's transfer setting: LogME, the kNN accuracy, the weight omega_t, and the transfer
experiment's claims from a results record."""

import numpy as np
import pytest

from methods.doit import on_transfer, transferability


def planted(seed=0, n=400):
    """Three classes decided by 4 informative features (a linear score + noise), and 4 pure
    noise features of the same scale."""
    rng = np.random.default_rng(seed)
    informative = rng.normal(size=(n, 4))
    labels = np.argmax(informative @ rng.normal(size=(4, 3)) + 0.3 * rng.normal(size=(n, 3)), 1)
    return informative, rng.normal(size=(n, 4)), labels


def test_log_evidence_equals_the_gaussian_marginal_likelihood():
    informative, _, labels = planted(n=60)
    y = (labels == 0).astype(np.float64)
    alpha, beta = 2.0, 3.0
    # y ~ N(0, I / beta + F F' / alpha): the model's marginal, computed directly.
    cov = np.eye(60) / beta + informative @ informative.T / alpha
    _, logdet = np.linalg.slogdet(cov)
    direct = -0.5 * y @ np.linalg.solve(cov, y) - 0.5 * logdet - 30 * np.log(2 * np.pi)
    got = transferability.log_evidence(informative, y, alpha, beta)
    assert got == pytest.approx(direct, rel=1e-10)  # float64, eigh vs slogdet


def test_fixed_point_maximises_the_evidence_over_alpha_and_beta():
    informative, noise, labels = planted()
    features = np.concatenate([informative, noise], axis=1)
    y = (labels == 1).astype(np.float64)
    per_example, alpha, beta = transferability.maximise_evidence(features, y)
    best = transferability.log_evidence(features, y, alpha, beta)
    assert per_example == pytest.approx(best / len(y), rel=1e-12)
    # 1 %: the evidence is flat in alpha; a fixed point off by 5 % (the posterior mean with
    # alpha and beta swapped) still loses to one of these neighbours.
    for factor_a, factor_b in ((1.01, 1), (1 / 1.01, 1), (1, 1.01), (1, 1 / 1.01)):
        a, b = alpha * factor_a, beta * factor_b
        assert transferability.log_evidence(features, y, a, b) < best


def test_logme_ranks_informative_features_above_noise_features():
    informative, noise, labels = planted()
    scores = [transferability.logme(informative[:, [i]], labels) for i in range(4)]
    scores += [transferability.logme(noise[:, [i]], labels) for i in range(4)]
    assert min(scores[:4]) > max(scores[4:])
    assert transferability.logme(informative, labels) > transferability.logme(noise, labels)
    with pytest.raises(ValueError, match=">= 2 classes"):
        transferability.logme(informative, np.zeros(len(labels)))


def test_knn_accuracy_votes_among_the_k_nearest_and_breaks_ties_by_the_nearest():
    reference = np.array([[0.0], [1.0], [2.0], [10.0], [11.0]])
    labels = np.array([0, 0, 1, 1, 1])
    # Query 0.4: neighbours 0 (0), 1 (0), 2 (1): two votes for class 0.
    assert transferability.knn_accuracy(reference, labels, [[0.4]], [0], k=3) == 1.0
    # Query 1.6 with k = 2: one vote each; the nearest (2.0, class 1) decides.
    assert transferability.knn_accuracy(reference, labels, [[1.6]], [1], k=2) == 1.0
    assert transferability.knn_accuracy(reference, labels, [[1.6]], [0], k=2) == 0.0


def test_weight_mixes_knn_accuracy_and_the_squashed_logme():
    expected = 0.5 * 0.9 + 0.5 / (1 + np.exp(0.7))  # LogME -0.7
    assert transferability.weight(0.9, [-0.7]) == pytest.approx(expected, rel=1e-12)
    assert transferability.weight(0.9, [-0.7], beta=1.0) == pytest.approx(0.9)


def transfer_record(with_weight: float, without: float) -> dict:
    """Five seeds; singles end at 0.90-0.98 (best: adam), DOIT with and without omega_t at the
    given accuracies (+ a seed jitter)."""
    finals = dict(zip(on_transfer.runs.SINGLES, (0.90, 0.92, 0.94, 0.96, 0.98), strict=True))
    finals |= {"doit_transfer": with_weight, "doit": without}
    rows = [
        {"arm": arm, "seed": seed, "test_accuracy": acc + 0.001 * seed}
        for arm, acc in finals.items()
        for seed in range(5)
    ]
    return {"run": "full_transfer", "rows": rows, "config": {"margin": 0.01}}


@pytest.mark.parametrize(
    ("with_weight", "without", "holds"),
    [(0.985, 0.975, [True, True, True]), (0.975, 0.975, [True, False, True]),
     (0.96, 0.975, [False, False, False])],
)  # fmt: skip
def test_transfer_claims(with_weight, without, holds):
    claims = on_transfer.claims_from_results(transfer_record(with_weight, without))
    assert [c.holds for c in claims] == holds
    assert "(adam)" in claims[0].text
