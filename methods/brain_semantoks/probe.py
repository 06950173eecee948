"""Evaluation of frozen features: the official linear probe, the FC baseline, collapse diagnostics.

- `crop_features`: every subject's "cls_avg" features averaged over `crops` evenly spaced
  test-time crops (one subject's crops never straddle a split).
- `linear_probe`: BatchNorm + Linear (weights N(0, 2e-5) truncated, bias 0) trained by SGD with
  momentum 0.9 on cross-entropy for `epochs` epochs of batches of min(256, n_train // 8), one
  model per (repetition, learning rate) in one jitted vmap; the learning rate is chosen per
  repetition on that repetition's validation balanced accuracy; the number is the test balanced
  accuracy at that choice, averaged over the repetitions (the official `linear_probe.py`).
- `fc_probe`: the FC baseline, logistic regression on the upper triangle of the ROI correlation
  matrix, its inverse regularisation C chosen on the same validation splits from a grid of as
  many values as the probe's learning rates.
- `collapse`: the teacher's CLS-projection std over a batch, the effective rank of its CLS
  features, the mean cosine between a scan's tokens.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from core.errors import ConfigError
from methods.brain_semantoks import model

BN_EPS, BN_MOMENTUM = 1e-5, 0.1  # torch.nn.BatchNorm1d's


class Splits(NamedTuple):
    train_RN: np.ndarray  # subject indices per repetition
    val_RN: np.ndarray
    test_RN: np.ndarray


def splits(n: int, train: int, val: int, repetitions: int, seed: int) -> Splits:
    """`repetitions` random train / validation / test partitions of n subjects (test: the rest)."""
    if train + val >= n or min(train, val, repetitions) < 1:
        raise ConfigError(
            f"probe splits: train={train} + val={val} must leave test subjects of n={n}, and "
            f"each (and repetitions={repetitions}) be >= 1"
        )
    perms = np.stack([np.random.default_rng([seed, r]).permutation(n) for r in range(repetitions)])
    return Splits(perms[:, :train], perms[:, train : train + val], perms[:, train + val :])


def crop_starts(length: int, crop: int, crops: int) -> np.ndarray:
    return np.linspace(0, length - crop, crops).astype(np.int32)


@functools.partial(jax.jit, static_argnums=(0,))
def _features(cfg, params, buffers, x_BCT):
    return model.features(cfg, params, buffers, x_BCT)


def crop_features(cfg, params, buffers, x_NCT, crops: int, batch: int = 128) -> np.ndarray:
    """[N, 2D] float32: features averaged over `crops` evenly spaced crops of each scan."""
    n, _, length = x_NCT.shape
    out = np.zeros((n, 2 * cfg.dim), np.float64)
    for start in crop_starts(length, cfg.crop, crops):
        view = x_NCT[:, :, start : start + cfg.crop]
        for i in range(0, n, batch):
            chunk = view[i : i + batch]
            pad = batch - len(chunk)  # one compiled shape for every chunk
            padded = np.concatenate([chunk, np.zeros((pad, *chunk.shape[1:]), chunk.dtype)])
            out[i : i + len(chunk)] += np.asarray(_features(cfg, params, buffers, padded))[
                : len(chunk)
            ]
    return (out / crops).astype(np.float32)


def balanced_accuracy(pred, labels, classes: int):
    """The mean over classes present in `labels` of the recall (sklearn's balanced accuracy)."""
    onehot = jax.nn.one_hot(labels, classes)
    hits = (onehot * (pred == labels)[..., None]).sum(-2)
    counts = onehot.sum(-2)
    recall = jnp.where(counts > 0, hits / jnp.maximum(counts, 1), 0.0)
    return recall.sum(-1) / jnp.maximum((counts > 0).sum(-1), 1)


def _bn_linear(p, stats, x, train: bool):
    if train:
        mean, var = x.mean(0), x.var(0)
    else:
        mean, var = stats
    h = (x - mean) * jax.lax.rsqrt(var + BN_EPS) * p["gamma"] + p["beta"]
    return h @ p["w"] + p["b"]


@functools.partial(jax.jit, static_argnames=("classes", "epochs", "batch"))
def _fit_and_score(rng, f_NF, y_N, tr_RN, va_RN, te_RN, lrs_K, *, classes, epochs, batch):
    """Balanced accuracies [R, K] on validation and test of a probe per (repetition, lr)."""
    n_train = tr_RN.shape[1]
    steps = n_train // batch  # a last partial batch is dropped; the permutation differs per epoch

    def one(rng, tr, va, te, lr):
        dim = f_NF.shape[1]
        w = 2e-5 * jax.random.truncated_normal(rng, -2.0 / 2e-5, 2.0 / 2e-5, (dim, classes))
        p = {"gamma": jnp.ones(dim), "beta": jnp.zeros(dim), "w": w, "b": jnp.zeros(classes)}
        stats = (jnp.zeros(dim), jnp.ones(dim))
        mom = jax.tree.map(jnp.zeros_like, p)

        def step(carry, xs):
            p, mom, stats = carry
            idx = xs
            x, y = f_NF[idx], y_N[idx]

            def loss(p):
                logits = _bn_linear(p, None, x, train=True)
                ce = -jax.nn.log_softmax(logits)[jnp.arange(len(y)), y]
                return ce.mean()

            g = jax.grad(loss)(p)
            mom = jax.tree.map(lambda m, gi: 0.9 * m + gi, mom, g)  # torch SGD momentum
            p = jax.tree.map(lambda a, m: a - lr * m, p, mom)
            var = x.var(0) * len(y) / (len(y) - 1)  # torch keeps the unbiased variance
            new = (stats[0] * (1 - BN_MOMENTUM) + BN_MOMENTUM * x.mean(0),
                   stats[1] * (1 - BN_MOMENTUM) + BN_MOMENTUM * var)  # fmt: skip
            return (p, mom, new), None

        def epoch(carry, k):
            order = tr[jax.random.permutation(k, n_train)]
            idx = order[: steps * batch].reshape(steps, batch)
            return jax.lax.scan(step, carry, idx)[0], None

        carry, _ = jax.lax.scan(epoch, (p, mom, stats), jax.random.split(rng, epochs))
        p, _, stats = carry
        score = lambda ids: balanced_accuracy(
            _bn_linear(p, stats, f_NF[ids], train=False).argmax(-1), y_N[ids], classes
        )
        return score(va), score(te)

    reps = tr_RN.shape[0]
    keys = jax.random.split(rng, (reps, lrs_K.shape[0]))
    over_lr = jax.vmap(one, in_axes=(0, None, None, None, 0))
    return jax.vmap(over_lr, in_axes=(0, 0, 0, 0, None))(keys, tr_RN, va_RN, te_RN, lrs_K)


def chosen(val_RK: np.ndarray, test_RK: np.ndarray) -> dict:
    """Each repetition's test score at its best validation point (first on ties); their means,
    and how often the choice sat on the grid's edge (index 0 or K - 1)."""
    best_R = np.argmax(val_RK, axis=1)
    rows = np.arange(len(best_R))
    edge = np.isin(best_R, (0, val_RK.shape[1] - 1)).mean()
    return {
        "val": float(val_RK[rows, best_R].mean()),
        "test": float(test_RK[rows, best_R].mean()),
        "edge_share": float(edge),
    }


def linear_probe(f_NF, y_N, sp: Splits, lrs, *, classes: int, epochs: int, seed: int) -> dict:
    batch = min(256, max(1, sp.train_RN.shape[1] // 8))
    val, test = _fit_and_score(
        jax.random.key(seed),
        jnp.asarray(f_NF),
        jnp.asarray(y_N),
        *(jnp.asarray(a) for a in sp),
        jnp.asarray(lrs, jnp.float32),
        classes=classes,
        epochs=epochs,
        batch=batch,
    )
    return chosen(np.asarray(val), np.asarray(test))


def _balanced(y, pred, classes):
    return float(balanced_accuracy(jnp.asarray(pred), jnp.asarray(y), classes))


def fc_probe(f_NF, y_N, sp: Splits, cs, *, classes: int) -> dict:
    """The FC baseline's scores, chosen on validation as `linear_probe`'s."""
    val, test = np.zeros((len(sp.train_RN), len(cs))), np.zeros((len(sp.train_RN), len(cs)))
    for r, (tr, va, te) in enumerate(zip(*sp, strict=True)):
        scaler = StandardScaler().fit(f_NF[tr])
        for k, c in enumerate(cs):
            fit = LogisticRegression(C=c, max_iter=3000).fit(scaler.transform(f_NF[tr]), y_N[tr])
            val[r, k] = _balanced(y_N[va], fit.predict(scaler.transform(f_NF[va])), classes)
            test[r, k] = _balanced(y_N[te], fit.predict(scaler.transform(f_NF[te])), classes)
    return chosen(val, test)


def effective_rank(x_BD) -> jax.Array:
    """exp(entropy) of the normalised singular values of the centred features."""
    s = jnp.linalg.svd(x_BD - x_BD.mean(0), compute_uv=False)
    p = s / jnp.maximum(s.sum(), 1e-12)
    return jnp.exp(-jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.maximum(p, 1e-30)), 0.0)))


@functools.partial(jax.jit, static_argnums=(0,))
def collapse(cfg, params, buffers, x_BCT) -> dict:
    """The collapse diagnostics of an encoder (module docstring) on a batch of crops."""
    tokens = model.encode(cfg, params, buffers, x_BCT).astype(jnp.float32)
    z = model.project(params["head"], tokens[:, 0])
    unit = tokens[:, 1:] / jnp.linalg.norm(tokens[:, 1:], axis=-1, keepdims=True)
    cos_BSS = jnp.einsum("bsd,btd->bst", unit, unit)
    s = cos_BSS.shape[1]
    off_diag = (cos_BSS.sum((1, 2)) - s) / (s * s - s)
    return {
        "proj_std": z.std(0).mean(),
        "effective_rank": effective_rank(tokens[:, 0]),
        "token_cosine": off_diag.mean(),
    }
