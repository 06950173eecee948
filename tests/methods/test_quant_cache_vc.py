"""Q&C's variance compensation closed forms and the setting grammar."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core.errors import ConfigError
from methods.quant_cache import settings, vc


def _batch(seed=0, shape=(64, 8, 8, 2)):
    rng = np.random.default_rng(seed)
    # Offset like digits' dark background (mean ~ -0.6): with a zero mean the printed form
    # happens to agree with the derived one (a / x' ~ c), so the test could not tell them apart.
    x_ref = (0.5 * rng.normal(size=shape) - 0.6).astype(np.float32)
    mu = x_ref.mean(axis=(0, 1, 2))
    return jnp.asarray(x_ref), jnp.asarray(mu)


def test_derived_gain_inverts_a_pure_rescaling():
    x_ref, mu = _batch()
    c = jnp.array([1.7, 0.6])  # per channel
    x_hat = mu + c * (x_ref - mu)
    k = vc.gain(x_hat, x_ref, mu)
    # float32 sums over 4,096 values per channel: relative error ~1e-6.
    np.testing.assert_allclose(np.asarray(k), 1 / np.asarray(c), rtol=1e-4)
    np.testing.assert_allclose(
        np.asarray(vc.compensate(x_hat, mu, k)), np.asarray(x_ref), atol=1e-4
    )
    # The printed form does not follow from the objective: it misses 1 / c here.
    printed = vc.gain(x_hat, x_ref, mu, form="printed")
    assert np.all(np.abs(np.asarray(printed) * np.asarray(c) - 1) > 1e-2)


def test_derived_gain_minimises_the_objective():
    x_ref, mu = _batch(1)
    noise = jax.random.normal(jax.random.key(0), x_ref.shape)
    x_hat = mu + 1.3 * (x_ref - mu) + 0.4 * noise  # rescaled and noisy: no exact inverse
    k = vc.gain(x_hat, x_ref, mu)
    with jax.enable_x64(True):
        args = [jnp.asarray(a, jnp.float64) for a in (x_hat, x_ref, mu)]
        k64 = jnp.asarray(k, jnp.float64)
        h = 1e-4
        for ch in range(2):
            step = jnp.zeros(2, jnp.float64).at[ch].set(h)
            j = lambda kk, ch=ch: vc.objective(kk, *args)[ch]  # noqa: E731
            slope = (j(k64 + step) - j(k64 - step)) / (2 * h)
            curvature = (j(k64 + step) - 2 * j(k64) + j(k64 - step)) / h**2
            # Zero slope at the float32 K: |J'| within K's rounding (~1e-7 K) x J''.
            assert abs(float(slope)) < 1e-5 * float(curvature) * max(1.0, abs(float(k64[ch])))
            assert float(curvature) > 0


def test_gain_clamps_small_references():
    x_ref, mu = _batch(2)
    x_ref = x_ref.at[0, 0, 0, 0].set(0.0)  # 1 / x' would be infinite
    k = vc.gain(x_ref * 1.1, x_ref, mu)
    assert np.all(np.isfinite(np.asarray(k)))
    with pytest.raises(ValueError, match="eps"):
        vc.gain(x_ref, x_ref, mu, eps=0.0)
    with pytest.raises(ValueError, match="form"):
        vc.gain(x_ref, x_ref, mu, form="paper")


def test_setting_names():
    s = settings.parse("w4a8+c2+tap+vc")
    assert (s.w_bits, s.a_bits, s.cache_every, s.calibration, s.vc) == (4, 8, 2, "tap", True)
    assert settings.parse("w8a8").calibration == "uniform"
    assert settings.parse("c3") == settings.Setting("c3", cache_every=3)
    assert not settings.parse("fp").quantized
    for bad, words in [
        ("w9a8", "2..8"),
        ("c1", "N >= 2"),
        ("tap", "calibration rule needs"),
        ("vc", "compensates"),
        ("w4a8+w8a8", "twice"),
        ("int8", "unknown token"),
    ]:
        with pytest.raises(ConfigError, match=words):
            settings.parse(bad)
    with pytest.raises(ConfigError, match="repeats"):
        settings.parse_list("fp/c2/fp")
