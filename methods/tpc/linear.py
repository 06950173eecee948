"""The linear probe: scikit-learn's LogisticRegression, C chosen by validation F1.

    probe = fit(x_train_ND, y_train_N, x_val_MD, y_val_M)   # Probe(w0, w1_D, C, val_f1)
    logit_M = x_MD @ probe.w1 + probe.w0

As the paper: inputs already standardised (StandardScaler, done by the data loader), C from
{100, 10, 1, .1, .01, .001}, the C with the best validation F1 (ties: the first, i.e. the
weakest regularisation listed first). It is the linear baseline and TPC's frozen order-1 term.
"""

from typing import NamedTuple

import numpy as np

from methods.tpc.model import f1_score

CS = (100.0, 10.0, 1.0, 0.1, 0.01, 0.001)


class Probe(NamedTuple):
    w0: np.ndarray  # [] float32
    w1: np.ndarray  # [D] float32
    C: float
    val_f1: float


def fit(x_train, y_train, x_val, y_val, *, Cs=CS, max_iter: int = 2000, seed: int = 0) -> Probe:
    from sklearn.linear_model import LogisticRegression  # heavy import, only when fitting

    best = None
    for C in Cs:
        clf = LogisticRegression(C=C, max_iter=max_iter, random_state=seed)
        clf.fit(np.asarray(x_train, np.float64), np.asarray(y_train))
        w1 = clf.coef_[0].astype(np.float32)
        w0 = np.float32(clf.intercept_[0])
        score = f1_score(y_val, np.asarray(x_val, np.float32) @ w1 + w0)
        if best is None or score > best.val_f1:
            best = Probe(w0, w1, float(C), score)
    return best
