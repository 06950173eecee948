"""core.stats: pairing by key, refusals, and the bootstrap interval's width and coverage."""

import numpy as np
import pytest

from core import stats
from core.errors import ConfigError


def test_constant_difference_gives_a_zero_width_interval():
    a = {0: 0.9, 1: 0.7, 2: 0.8, 3: 0.6}
    b = {k: v - 0.25 for k, v in a.items()}
    iv = stats.paired_interval(a, b)
    # a - b is 0.25 up to one float64 subtraction's rounding (~1e-16) per seed.
    assert iv.low == pytest.approx(0.25, abs=1e-12) and iv.high == pytest.approx(0.25, abs=1e-12)
    assert iv.se == pytest.approx(0.0, abs=1e-12) and iv.n == 4


def test_pairs_by_key_not_by_order():
    # The same per-seed numbers inserted in another order: pairing by position would subtract
    # seed 2 from seed 0 and give a different (wider) interval.
    a = {0: 1.0, 1: 2.0, 2: 3.0}
    b_reordered = {2: 2.9, 0: 0.9, 1: 1.9}
    diffs = stats.paired_differences(a, b_reordered)
    # Each difference is 0.1 up to float64 rounding of the subtraction.
    np.testing.assert_allclose([diffs[k] for k in (0, 1, 2)], [0.1] * 3, atol=1e-12)
    iv = stats.paired_interval(a, b_reordered)
    assert iv.high - iv.low < 1e-12  # constant difference: zero width up to rounding


def test_refuses_mismatched_keys_and_too_few_pairs():
    with pytest.raises(ConfigError, match=r"only in a: \['3'\]") as info:
        stats.paired_differences({0: 1, 1: 1, 2: 1, 3: 1}, {0: 1, 1: 1, 2: 1})
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="2 pairs; an interval needs at least 3"):
        stats.paired_differences({0: 1.0, 1: 2.0}, {0: 0.0, 1: 1.0})
    with pytest.raises(ConfigError, match="paired by key"):
        stats.paired_differences([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    with pytest.raises(ConfigError, match="2 values"):
        stats.interval([0.5, 0.6])
    with pytest.raises(ConfigError, match="non-finite"):
        stats.interval([0.5, float("nan"), 0.6])


def test_interval_is_seeded_and_brackets_the_mean():
    x = {s: v for s, v in enumerate([0.1, 0.5, 0.2, 0.9, 0.4])}
    first, again = stats.interval(x, seed=3), stats.interval(x, seed=3)
    assert first == again
    assert first.low < first.mean < first.high
    assert first.mean == pytest.approx(0.42, abs=1e-12)  # float64 mean of 5 numbers
    # Standard error: sample std (ddof=1) over sqrt(n), float64 rounding only.
    assert first.se == pytest.approx(np.std(list(x.values()), ddof=1) / np.sqrt(5), rel=1e-12)
    # A narrower level gives a narrower interval inside the wider one.
    narrow = stats.interval(x, seed=3, level=0.5)
    assert first.low <= narrow.low <= narrow.high <= first.high
    assert stats.Interval.from_dict(first.to_dict()) == first


def coverage(n: int, trials: int = 400, resamples: int = 1000) -> float:
    rng = np.random.default_rng(0)
    hits = 0
    for trial in range(trials):
        iv = stats.interval(rng.normal(1.0, 2.0, size=n), resamples=resamples, seed=trial)
        hits += iv.low <= 1.0 <= iv.high
    return hits / trials


def test_coverage_is_roughly_nominal_with_enough_seeds():
    # Percentile bootstrap of a normal mean at n = 20: its known coverage is ~0.93 at a nominal
    # 0.95 (it uses the plug-in variance and normal tails). 400 trials give a Monte Carlo
    # standard error of ~0.012, so [0.89, 0.98] allows about 3 standard errors either side.
    assert 0.89 <= coverage(20) <= 0.98


def test_coverage_at_three_seeds_is_at_most_three_quarters():
    # Every bootstrap mean of 3 values lies within their [min, max], which misses the true
    # mean when all 3 fall on one side of it: probability 2 / 8. So coverage <= 0.75 (plus
    # Monte Carlo noise, standard error ~0.02 at 400 trials), whatever the nominal level.
    assert coverage(3) <= 0.80
