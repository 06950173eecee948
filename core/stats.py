"""Intervals over seeds or splits: the numbers an experiment's claims are decided on.

A claim compares two things measured on the same seeds (or data splits), so the unit of evidence
is the per-seed *difference*: pairing removes the seed-to-seed spread both share, which is often
larger than the effect. Pairs are matched by key (seed, split id), never by list order: two lists
filled in different orders, or one missing a seed, would otherwise be silently mis-paired.

`interval` gives the mean, its standard error and a seeded percentile bootstrap interval of the
mean. With n values every bootstrap mean lies within [min, max] of them, so at n = 3 no bootstrap
interval can cover the true mean more often than 1 - 2 / 2**3 = 75 % (normal data), whatever its
nominal level: use more seeds for claims whose margin is close (`tests/core/test_stats.py`
measures this). Pure numpy, so it runs anywhere an experiment's results file can be read.
"""

import dataclasses
from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from core.errors import ConfigError

MIN_SAMPLES = 3  # the project's rule: a claim rests on at least 3 seeds or splits
RESAMPLES = 10_000
LEVEL = 0.95


@dataclasses.dataclass(frozen=True)
class Interval:
    """The mean of n values (or of n paired differences) with a bootstrap interval."""

    mean: float
    se: float  # standard error of the mean (sample std with ddof=1, over sqrt(n))
    low: float
    high: float
    n: int
    level: float  # nominal coverage of [low, high]
    resamples: int
    seed: int

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> "Interval":
        return cls(**d)

    def __str__(self) -> str:
        return f"{self.mean:.4g} [{self.low:.4g}, {self.high:.4g}]"


def _as_floats(values: Mapping | Sequence, what: str) -> np.ndarray:
    array = np.asarray(list(values.values()) if isinstance(values, Mapping) else values, float)
    if array.ndim != 1 or array.size < MIN_SAMPLES:
        raise ConfigError(
            f"{what}: {array.size} values; an interval needs at least {MIN_SAMPLES} seeds or splits"
        )
    if not np.all(np.isfinite(array)):
        raise ConfigError(f"{what}: non-finite values {array.tolist()}")
    return array


def paired_differences(
    a: Mapping[Hashable, float], b: Mapping[Hashable, float], *, what: str = "a - b"
) -> dict[Hashable, float]:
    """{key: a[key] - b[key]} for keys (seeds, split ids) that both measured; both must have
    the same keys and at least MIN_SAMPLES of them."""
    if not isinstance(a, Mapping) or not isinstance(b, Mapping):
        raise ConfigError(f"{what}: pass {{seed or split: value}} mappings, paired by key")
    if set(a) != set(b):
        only_a, only_b = sorted(map(str, set(a) - set(b))), sorted(map(str, set(b) - set(a)))
        raise ConfigError(f"{what}: keys differ (only in a: {only_a}; only in b: {only_b})")
    if len(a) < MIN_SAMPLES:
        raise ConfigError(
            f"{what}: {len(a)} pairs; an interval needs at least {MIN_SAMPLES} seeds or splits"
        )
    return {k: float(a[k]) - float(b[k]) for k in a}


def interval(
    values: Mapping[Hashable, float] | Sequence[float],
    *,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = 0,
    what: str = "values",
) -> Interval:
    """Mean, standard error and percentile bootstrap interval of the mean of `values`."""
    if not 0 < level < 1 or resamples < 1:
        raise ConfigError(f"{what}: level={level} must be in (0, 1), resamples={resamples} >= 1")
    x = _as_floats(values, what)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    mean = float(x.mean())
    # The bootstrap's quantiles of a constant sample are that constant; clamp float noise so
    # low <= mean <= high always holds exactly.
    return Interval(
        mean=mean,
        se=float(x.std(ddof=1) / np.sqrt(x.size)),
        low=min(float(low), mean),
        high=max(float(high), mean),
        n=int(x.size),
        level=level,
        resamples=resamples,
        seed=seed,
    )


def paired_interval(
    a: Mapping[Hashable, float], b: Mapping[Hashable, float], *, what: str = "a - b", **kwargs
) -> Interval:
    """`interval` of the paired differences a - b (matched by key)."""
    return interval(paired_differences(a, b, what=what), what=what, **kwargs)
