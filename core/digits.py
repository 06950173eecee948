"""FD-digits: an image-quality evaluator for generative models of scikit-learn's 8x8 digits.

    splits = digits.load_splits()                      # fixed train / validation / test
    clf = digits.classifier(f"{workdir}/cache")        # trained once, then read back
    feats_ND = digits.features(clf, images_NHWC)       # penultimate features (float64)
    fd = digits.frechet_distance(feats_ND, digits.features(clf, splits.test.images))
    acc = digits.conditional_accuracy(clf, images_NHWC, labels_N)

Data: `load_digits` (1797 images, pixel values 0..16) scaled to [-1, 1] as [N, 8, 8, 1]
float32. Splits are stratified by class from one seeded permutation per class (seed 0): per
class 60 % train, 20 % validation, 20 % test (1078 / 359 / 360 images), so every split has
every digit in its natural proportion and nothing depends on the caller.

Classifier (a stand-in for Inception in FID): conv3x3(32)-ReLU, conv3x3(64)-ReLU, 2x2 average
pool -> a 4x4x64 feature map ("spatial", the token grid of a patch-2 model of 8x8 images),
dense(64)-ReLU ("penultimate", the FD features), dense(10). Trained once on the train split
by one jitted step in a Python loop (Adam 1e-3, batch 64, random 1-pixel shifts, a fixed number
of epochs: no choice is made on validation or test). Not a `core.train` run: the classifier is a
fixed part of the evaluator, trained on a fixed array in half a minute, with no config,
checkpoints or workdir of its own. Its parameters are stored under
`<cache_root>/digits_classifier/<key>.npz` (key: a hash of its settings and this file's source),
so the seeds and arms of an experiment share one classifier.

Frechet distance (float64 numpy): |mu1 - mu2|^2 + tr(S1) + tr(S2) - 2 tr((S1^1/2 S2 S1^1/2)^1/2),
the last trace from the eigenvalues of the symmetric PSD matrix S1^1/2 S2 S1^1/2 (eigh, negative
round-off clipped to 0): equal to tr(sqrtm(S1 S2)) without a non-symmetric sqrtm.
"""

import dataclasses
import functools
import hashlib
import json
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

SPLIT_FRACTIONS = (0.6, 0.2, 0.2)  # train, validation, test, per class
NUM_CLASSES = 10
IMAGE_SHAPE = (8, 8, 1)


class Split(NamedTuple):
    images: np.ndarray  # float32 [N, 8, 8, 1] in [-1, 1]
    labels: np.ndarray  # int32 [N]


class Splits(NamedTuple):
    train: Split
    validation: Split
    test: Split


def split_indices(labels_N: np.ndarray, seed: int = 0) -> tuple[np.ndarray, ...]:
    """(train, validation, test) row indices, stratified: each class permuted by its own seeded
    generator and cut at SPLIT_FRACTIONS; sorted within each split."""
    parts = ([], [], [])
    for digit in range(NUM_CLASSES):
        rows = np.flatnonzero(labels_N == digit)
        rows = rows[np.random.default_rng([seed, digit]).permutation(len(rows))]
        n_train = round(SPLIT_FRACTIONS[0] * len(rows))
        n_val = round(SPLIT_FRACTIONS[1] * len(rows))
        for part, chunk in zip(parts, np.split(rows, [n_train, n_train + n_val]), strict=True):
            part.append(chunk)
    return tuple(np.sort(np.concatenate(p)) for p in parts)


def load_splits(seed: int = 0) -> Splits:
    from sklearn.datasets import load_digits

    x_ND, labels_N = load_digits(return_X_y=True)
    images = (x_ND / 8.0 - 1.0).astype(np.float32).reshape(-1, *IMAGE_SHAPE)
    labels_N = labels_N.astype(np.int32)
    return Splits(*(Split(images[i], labels_N[i]) for i in split_indices(labels_N, seed)))


# ------------------------------------------------------------------------------ classifier


@dataclasses.dataclass(frozen=True)
class ClassifierSettings:
    conv_channels: tuple[int, int] = (32, 64)
    feature_dim: int = 64
    epochs: int = 60
    batch_size: int = 64
    lr: float = 1e-3
    seed: int = 0


class Classifier(NamedTuple):
    params: dict  # numpy arrays
    settings: ClassifierSettings
    test_accuracy: float


def init_classifier(settings: ClassifierSettings, rng: jax.Array) -> dict:
    c1, c2 = settings.conv_channels
    keys = jax.random.split(rng, 4)
    he = jax.nn.initializers.he_normal()
    shapes = {
        "conv1": (3, 3, 1, c1),
        "conv2": (3, 3, c1, c2),
        "dense": (4 * 4 * c2, settings.feature_dim),
        "out": (settings.feature_dim, NUM_CLASSES),
    }
    return {
        name: {"w": he(key, shape), "b": jnp.zeros(shape[-1])}
        for key, (name, shape) in zip(keys, shapes.items(), strict=True)
    }


def _conv(x_BHWC, layer):
    y = jax.lax.conv_general_dilated(
        x_BHWC, layer["w"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    return y + layer["b"]


def forward(params: dict, images_BHWC) -> dict:
    """{"spatial": [B, 4, 4, C2], "penultimate": [B, F], "logits": [B, 10]}."""
    h = jax.nn.relu(_conv(images_BHWC, params["conv1"]))
    h = jax.nn.relu(_conv(h, params["conv2"]))
    B, H, W, C = h.shape
    spatial = h.reshape(B, H // 2, 2, W // 2, 2, C).mean(axis=(2, 4))
    penultimate = jax.nn.relu(spatial.reshape(B, -1) @ params["dense"]["w"] + params["dense"]["b"])
    logits = penultimate @ params["out"]["w"] + params["out"]["b"]
    return {"spatial": spatial, "penultimate": penultimate, "logits": logits}


def _shift(rng, images_BHWC):
    """Each image moved by a random (dy, dx) in {-1, 0, 1}^2, background (-1) filled in."""
    padded = jnp.pad(images_BHWC, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=-1.0)
    offsets = jax.random.randint(rng, (images_BHWC.shape[0], 2), 0, 3)
    crop = lambda img, o: jax.lax.dynamic_slice(img, (o[0], o[1], 0), IMAGE_SHAPE)  # noqa: E731
    return jax.vmap(crop)(padded, offsets)


def train_classifier(settings: ClassifierSettings, train: Split) -> dict:
    """Adam on the cross-entropy over `settings.epochs` epochs of seeded shuffles: one scan."""
    n = len(train.labels)
    steps_per_epoch = n // settings.batch_size  # the remainder of each shuffle is skipped
    perm_rng = np.random.default_rng(settings.seed)
    order = np.concatenate([perm_rng.permutation(n) for _ in range(settings.epochs)])
    order = order[: settings.epochs * steps_per_epoch * settings.batch_size]
    batches = order.reshape(-1, settings.batch_size)
    rng = jax.random.key(settings.seed)
    params = init_classifier(settings, rng)
    tx = optax.adam(settings.lr)
    images, labels = jnp.asarray(train.images), jnp.asarray(train.labels)

    def loss(params, x, y):
        logits = forward(params, x)["logits"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(params, opt_state, index_B, i):
        x = _shift(jax.random.fold_in(rng, i), images[index_B])
        grads = jax.grad(loss)(params, x, labels[index_B])
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    # A Python loop over one jitted step: the same program under lax.scan ran ~20x slower on
    # XLA:CPU (0.4 s vs 17 ms per step of these convolutions, measured).
    opt_state = tx.init(params)
    for i, index_B in enumerate(batches):
        params, opt_state = step(params, opt_state, index_B, i)
    return jax.tree.map(np.asarray, params)


def _source_hash() -> str:
    with open(__file__, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def classifier(cache_root: str, settings: ClassifierSettings | None = None) -> Classifier:
    """The classifier for `settings`, trained on the train split the first time and read back
    from `<cache_root>/digits_classifier/` afterwards."""
    settings = settings or ClassifierSettings()
    text = json.dumps({**dataclasses.asdict(settings), "code": _source_hash()}, sort_keys=True)
    key = hashlib.sha256(text.encode()).hexdigest()[:20]
    path = os.path.join(cache_root, "digits_classifier", f"{key}.npz")
    splits = load_splits()
    if os.path.exists(path):
        with np.load(path) as stored:
            flat = dict(stored)
        params = {}
        for name, value in flat.items():
            layer, leaf = name.split("/")
            params.setdefault(layer, {})[leaf] = value
    else:
        params = train_classifier(settings, splits.train)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp.npz"  # never a half-written file under the real name
        flat = {f"{layer}/{leaf}": v for layer, d in params.items() for leaf, v in d.items()}
        np.savez(tmp, **flat)
        os.replace(tmp, path)
    accuracy = float(np.mean(predict(params, splits.test.images) == splits.test.labels))
    return Classifier(params, settings, accuracy)


_forward = jax.jit(forward)


def _batched(params, images_NHWC, name, batch_size=512):
    images_NHWC = np.asarray(images_NHWC, np.float32)
    if images_NHWC.ndim != 4 or images_NHWC.shape[1:] != IMAGE_SHAPE:
        raise ValueError(f"images have shape {images_NHWC.shape}, expected [N, 8, 8, 1]")
    chunks = [
        np.asarray(_forward(params, images_NHWC[i : i + batch_size])[name])
        for i in range(0, len(images_NHWC), batch_size)
    ]
    return np.concatenate(chunks)


def predict(params: dict, images_NHWC) -> np.ndarray:
    return _batched(params, images_NHWC, "logits").argmax(-1)


def features(clf: Classifier, images_NHWC) -> np.ndarray:
    """Penultimate features [N, feature_dim], float64."""
    return _batched(clf.params, images_NHWC, "penultimate").astype(np.float64)


def conditional_accuracy(clf: Classifier, images_NHWC, labels_N) -> float:
    """The fraction of images the classifier assigns to the label they were generated for."""
    return float(np.mean(predict(clf.params, images_NHWC) == np.asarray(labels_N)))


def frechet_distance(a_ND: np.ndarray, b_ND: np.ndarray) -> float:
    """The Frechet distance between Gaussians fitted to two feature sets (module docstring)."""
    a_ND, b_ND = np.asarray(a_ND, np.float64), np.asarray(b_ND, np.float64)
    if a_ND.ndim != 2 or b_ND.ndim != 2 or a_ND.shape[1] != b_ND.shape[1]:
        raise ValueError(f"feature sets must be [N, D] with one D, got {a_ND.shape}, {b_ND.shape}")
    if min(len(a_ND), len(b_ND)) < 2:
        raise ValueError("each feature set needs at least 2 rows for a covariance")
    mu_a, mu_b = a_ND.mean(0), b_ND.mean(0)
    cov_a, cov_b = np.cov(a_ND, rowvar=False), np.cov(b_ND, rowvar=False)
    w, v = np.linalg.eigh(cov_a)
    sqrt_a = (v * np.sqrt(np.clip(w, 0, None))) @ v.T
    middle = sqrt_a @ cov_b @ sqrt_a
    cross = np.sqrt(np.clip(np.linalg.eigvalsh((middle + middle.T) / 2), 0, None)).sum()
    return float(np.sum((mu_a - mu_b) ** 2) + np.trace(cov_a) + np.trace(cov_b) - 2 * cross)
