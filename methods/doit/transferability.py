"""DOIT's transferability weight omega_t for training from a pretrained model (the transfer
setting), computed once before training from the frozen features of the target task.

    omega_t = beta * omega_p + (1 - beta) * (1/k) sum_i sigmoid(omega_d^i)

omega_p is the pretrained model's raw performance on the target task in [0, 1] (here: the
zero-shot kNN accuracy of its frozen features, reference = the target's train split, queries =
its validation split), omega_d^i are transferability scores (here k = 1: LogME). The paper
does not give beta; BETA = 0.5. omega_t then scales DOIT's exploration: kappa_i = (1 - omega_t)
2^-floor(i / n) (methods/doit/policy.py): a model that already transfers well explores less.

LogME (You et al. 2021): for each class c, a Bayesian linear model y_c = F w + noise with
prior w ~ N(0, I / alpha) and noise N(0, I / beta) on the one-hot column y_c; alpha and beta
maximise the evidence p(y_c | F, alpha, beta) by MacKay's fixed-point updates
    gamma = sum_i beta s_i / (alpha + beta s_i)     (s_i: eigenvalues of F'F)
    m     = beta (alpha I + beta F'F)^-1 F' y_c      (the posterior mean)
    alpha = gamma / m'm,   beta = (N - gamma) / |y_c - F m|^2
and LogME is the maximised log evidence per example, averaged over classes. Every one of the
D eigenvalues enters the log-determinant (zeros included: dead ReLU units make F'F singular;
the authors' code sums over the nonzero ones only, which differs when rank F < D).
"""

import numpy as np

BETA = 0.5  # omega_p's share of omega_t (not given in the paper)
KNN_NEIGHBOURS = 5
MAX_ITERATIONS = 100
TOLERANCE = 1e-8  # relative change of alpha / beta that ends the fixed-point iteration


def log_evidence(features_ND, y_N, alpha: float, beta: float) -> float:
    """log p(y | F, alpha, beta) of the Bayesian linear model, via F'F's eigenvalues."""
    f = np.asarray(features_ND, np.float64)
    y = np.asarray(y_N, np.float64)
    n, d = f.shape
    s_D, v_DD = np.linalg.eigh(f.T @ f)
    s_D = np.maximum(s_D, 0.0)  # round-off below 0 on a singular F'F
    m = v_DD @ (beta * (v_DD.T @ (f.T @ y)) / (alpha + beta * s_D))
    residual = float(((y - f @ m) ** 2).sum())
    return float(
        d / 2 * np.log(alpha)
        + n / 2 * np.log(beta)
        - 0.5 * np.log(alpha + beta * s_D).sum()
        - beta / 2 * residual
        - alpha / 2 * float(m @ m)
        - n / 2 * np.log(2 * np.pi)
    )


def maximise_evidence(features_ND, y_N) -> tuple[float, float, float]:
    """(log evidence per example, alpha, beta) at MacKay's fixed point for one target column."""
    f = np.asarray(features_ND, np.float64)
    y = np.asarray(y_N, np.float64)
    n = f.shape[0]
    s_D, v_DD = np.linalg.eigh(f.T @ f)
    s_D = np.maximum(s_D, 0.0)
    projected_D = v_DD.T @ (f.T @ y)
    alpha = beta = 1.0
    for _ in range(MAX_ITERATIONS):
        gamma = float((beta * s_D / (alpha + beta * s_D)).sum())
        m = v_DD @ (beta * projected_D / (alpha + beta * s_D))
        new_alpha = gamma / max(float(m @ m), 1e-300)
        new_beta = (n - gamma) / max(float(((y - f @ m) ** 2).sum()), 1e-300)
        done = abs(new_alpha - alpha) <= TOLERANCE * alpha and abs(new_beta - beta) <= (
            TOLERANCE * beta
        )
        alpha, beta = new_alpha, new_beta
        if done:
            break
    return log_evidence(f, y, alpha, beta) / n, alpha, beta


def logme(features_ND, labels_N) -> float:
    """LogME: the mean over classes of the maximised log evidence per example (one-hot
    target per class; larger is more transferable)."""
    labels = np.asarray(labels_N)
    classes = np.unique(labels)
    if len(classes) < 2:
        raise ValueError(f"logme needs >= 2 classes, got {classes.tolist()}")
    return float(np.mean([maximise_evidence(features_ND, labels == c)[0] for c in classes]))


def knn_accuracy(reference_ND, reference_labels, query_MD, query_labels, k=KNN_NEIGHBOURS):
    """Accuracy of a k-nearest-neighbour vote (Euclidean) of `query` among `reference`; a tied
    vote goes to the class of the nearest neighbour among the tied ones."""
    ref = np.asarray(reference_ND, np.float64)
    qry = np.asarray(query_MD, np.float64)
    ref_labels = np.asarray(reference_labels)
    d2 = (qry**2).sum(1)[:, None] - 2 * qry @ ref.T + (ref**2).sum(1)[None, :]
    nearest = np.argsort(d2, axis=1, kind="stable")[:, :k]
    votes = ref_labels[nearest]  # [M, k], nearest first
    predictions = []
    for row in votes:
        values, counts = np.unique(row, return_counts=True)
        tied = set(values[counts == counts.max()].tolist())
        predictions.append(next(v for v in row if v in tied))
    return float(np.mean(np.array(predictions) == np.asarray(query_labels)))


def weight(omega_p: float, scores, beta: float = BETA) -> float:
    """omega_t = beta omega_p + (1 - beta) mean_i sigmoid(score_i)."""
    scores = np.asarray(scores, np.float64)
    return float(beta * omega_p + (1 - beta) * np.mean(1 / (1 + np.exp(-scores))))
