"""Datasets for the TPC probes: standardised features [N, D] with binary labels, in three splits.

    splits = load("digits", seed=0)                 # sklearn digits, label = digit is odd
    splits = load("prompts", seed=0, layer=4)       # MiniLM layer-4 activations, label = harmful
    splits.x_train                                  # float32 [N, D], train mean 0, std 1
    splits.y_train                                  # int32 [N] in {0, 1}
    prompt_set.prompt_texts(seed=0)                 # the prompts' texts, labels, splits, factors

Every split is standardised with the TRAIN split's mean and std (sklearn StandardScaler,
ddof 0): features whose train std is below 1e-6 are only centred (scale 1, StandardScaler's
zero-variance rule). Clamping such a std to 1e-6 instead would turn a pixel that is constant in
train but not in test into a 1e6-sized outlier.

"digits" (scikit-learn's 8x8 digits, 1797 images, D = 64; shipped inside the sklearn wheel):
label 1 iff the digit is odd. 70/30 train/test split, then 20 % of train for validation, both
stratified by the digit (so by parity too) and seeded by `seed`.

"prompts" (D = 384): MiniLM activations of the templated prompts of `prompt_set` (its
docstring: the factors, the label rule harmful = operational AND (direction XOR polarity),
the splits by held-out template): 3072 prompts, 1920 / 384 / 768 train / val / test.

Activations: mean-pooled states of MiniLM layer `layer` (default 4 of 6) from
`minilm.activations`, cached as `<cache_dir>/prompts_l{layer}_s{seed}.npy` (cache_dir: option,
else $TPC_CACHE, else ~/.cache/iclr26/tpc); the first call encodes 3072 prompts, ~30 s on 2
busy CPU cores, later calls read the cache (20 ms).

Measured (seed 0, layer 4; sklearn LogisticRegression with C from {100, ..., 0.001} picked by
validation F1; an order-2 term sum_r lam_r (u_r . z)^2 trained with AdamW on top of that frozen
linear probe, rank 16 or 64): linear F1 .84 validation / .61 test (train .99); order-2 .98-.99
validation / .72-.77 test; a 64-unit MLP .995 / .76. The gap below 1 on test is the unseen
templates. A layer scan on an earlier draw of the surface variants (test F1, linear / MLP-64):

    layer      1     2     3     4     5     6
    linear   .70   .50   .63   .71   .61   .20
    MLP-64   .68   .68   .73   .78   .74   .78

Layer 4, the default, had the best linear probe there (the fairest baseline) while a nonlinear
probe still beat it.

Options: digits none; prompts `layer`, `cache_dir`, `batch_size` (64), `limit` (encode a seeded
subset of at most `limit` prompts, split shares kept: for tests).
"""

import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from core.errors import ConfigError
from methods.tpc import prompt_set

DATASETS = ("digits", "prompts")
STD_FLOOR = 1e-6  # train std below this: centre only (StandardScaler's zero-variance rule)
DEFAULT_CACHE = Path("~/.cache/iclr26/tpc")
OPTIONS = {"digits": (), "prompts": ("layer", "cache_dir", "batch_size", "limit")}


class Splits(NamedTuple):
    """Standardised features float32 [N, D] and labels int32 [N] in {0, 1} per split."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    info: dict  # JSON-friendly: name, sizes, positive rates, what the label means, ...


def load(name: str, *, seed: int = 0, **options) -> Splits:
    """The dataset `name` (one of DATASETS) split and standardised; see the module docstring."""
    if name not in DATASETS:
        raise ConfigError(f"tpc data: unknown dataset {name!r}; choices: {', '.join(DATASETS)}")
    unknown = sorted(set(options) - set(OPTIONS[name]))
    if unknown:
        allowed = ", ".join(OPTIONS[name]) or "none"
        raise ConfigError(f"tpc data: unknown option(s) {unknown} for {name!r}; allowed: {allowed}")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ConfigError(f"tpc data: seed={seed!r}; expected an int >= 0")
    return _load_digits(seed) if name == "digits" else _load_prompts(seed, **options)


# ---------------------------------------------------------------------------------------------
# Shared helpers


def standardise(x_train, *others) -> tuple[np.ndarray, ...]:
    """Every array scaled by x_train's mean and std (ddof 0), as float32."""
    mean_D = x_train.mean(0)
    std_D = x_train.std(0)
    std_D = np.where(std_D < STD_FLOOR, 1.0, std_D)
    return tuple(((x - mean_D) / std_D).astype(np.float32) for x in (x_train, *others))


def _splits(name: str, x: dict, y: dict, info: dict) -> Splits:
    """Splits from per-split arrays, standardised by train, with sizes and rates in info."""
    x_train, x_val, x_test = standardise(x["train"], x["val"], x["test"])
    y = {k: np.asarray(v, np.int32) for k, v in y.items()}
    info = {
        "name": name,
        **info,
        "num_features": int(x_train.shape[1]),
        "sizes": {k: len(v) for k, v in y.items()},
        "positive_rate": {k: round(float(v.mean()), 4) if len(v) else 0.0 for k, v in y.items()},
        "standardised": f"train mean/std (ddof 0); std < {STD_FLOOR:g} -> centred only",
    }
    return Splits(x_train, y["train"], x_val, y["val"], x_test, y["test"], info)


# ---------------------------------------------------------------------------------------------
# digits


def digits_indices(seed: int) -> dict[str, np.ndarray]:
    """Row indices into sklearn's load_digits per split: 70/30 train/test, then 20 % of train
    for validation, both stratified by the digit (so by its parity too)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digit_N = load_digits().target
    idx = np.arange(len(digit_N))
    train, test = train_test_split(idx, test_size=0.3, stratify=digit_N, random_state=seed)
    train, val = train_test_split(train, test_size=0.2, stratify=digit_N[train], random_state=seed)
    return {"train": train, "val": val, "test": test}


def _load_digits(seed: int) -> Splits:
    from sklearn.datasets import load_digits

    x_ND, digit_N = load_digits(return_X_y=True)
    parts = digits_indices(seed)
    x = {k: x_ND[v] for k, v in parts.items()}
    y = {k: digit_N[v] % 2 for k, v in parts.items()}
    info = {"seed": seed, "label": "1 iff the digit is odd (sklearn load_digits, 8x8 pixels)"}
    return _splits("digits", x, y, info)


# ---------------------------------------------------------------------------------------------
# prompts: activations and splits


def cache_folder(option=None) -> Path:
    """The activation cache folder: the option, else $TPC_CACHE, else ~/.cache/iclr26/tpc."""
    return Path(option or os.environ.get("TPC_CACHE") or DEFAULT_CACHE).expanduser()


def encode_prompt_layers(seed: int, layers, cache_dir=None, batch_size=64) -> None:
    """Fill the activation cache of `load("prompts", seed=seed, layer=l)` for every l in
    `layers` in one encoder pass (a layer scan)."""
    from methods.tpc import minilm

    paths = [cache_folder(cache_dir) / f"prompts_l{layer}_s{seed}.npy" for layer in layers]
    texts = prompt_set.prompt_texts(seed).texts
    minilm.activations_layers(texts, layers, batch_size=batch_size, cache_paths=paths)


def _load_prompts(seed: int, layer=4, cache_dir=None, batch_size=64, limit=None) -> Splits:
    from methods.tpc import minilm  # imports JAX and the model code only when needed

    prompts = prompt_set.prompt_texts(seed)
    name = f"prompts_l{layer}_s{seed}"
    if limit is not None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 3:
            raise ConfigError(f"tpc data: limit={limit!r}; expected an int >= 3 (or None)")
        prompts, name = prompt_set.subset(prompts, limit, seed), f"{name}_n{limit}"
    path = cache_folder(cache_dir) / f"{name}.npy"
    x_ND = minilm.activations(prompts.texts, layer, batch_size=batch_size, cache_path=path)
    parts = {k: prompts.split == k for k in ("train", "val", "test")}
    info = {
        "seed": seed,
        "label": prompt_set.LABEL,
        "layer": layer,
        "encoder": "all-MiniLM-L6-v2, mean-pooled over tokens",
        "cache_path": str(path),
        "test_templates": prompt_set.held_out_templates(seed).tolist(),
        "val_templates": prompt_set.held_out_templates(seed, "val").tolist(),
        "factors": "hazard/safeguard event x promote/prevent x operational/non-operational",
    }
    x = {k: x_ND[m] for k, m in parts.items()}
    y = {k: prompts.labels[m] for k, m in parts.items()}
    return _splits("prompts", x, y, info)
