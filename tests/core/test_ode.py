"""core.ode: Dopri5 and Euler against closed forms (a linear field's matrix exponential, a
time-dependent field's integral), Euler's first-order convergence and exact step count, the saved
path, backwards integration, gradients through a closed-over parameter under jit, bad inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from core import ode
from core.errors import ConfigError

RNG = np.random.default_rng(0)
A_DD = (RNG.normal(size=(4, 4)) * 0.5).astype(np.float32)  # spectral norm ~1.5
X0_ND = RNG.normal(size=(3, 4)).astype(np.float32)
T0, T1 = 0.25, 1.5


def linear(t, x_ND):
    """dx/dt = A x for each row."""
    del t
    return x_ND @ jnp.asarray(A_DD).T


def linear_exact(t):
    """x(t) = expm(A (t - T0)) x0 per row, in float64."""
    return X0_ND.astype(np.float64) @ scipy.linalg.expm(A_DD.astype(np.float64) * (t - T0)).T


def ramp(t, x_ND):
    """dx/dt = 2t: x(t1) = x0 + t1^2 - t0^2."""
    return jnp.full_like(x_ND, 2 * t)


def test_dopri5_matches_the_matrix_exponential():
    x1 = jax.jit(lambda x0: ode.solve(linear, x0, T0, T1))(X0_ND)
    assert x1.shape == X0_ND.shape and x1.dtype == jnp.float32
    # rtol = atol = 1e-5 bounds each step's local error; the global error accumulates over the
    # steps and lands at ~8e-6 here (|x| ~ 1). float32 rounding (~1e-7 per step) is far below
    # that, so the bound is 5x the requested tolerance.
    np.testing.assert_allclose(np.asarray(x1, np.float64), linear_exact(T1), rtol=0, atol=5e-5)


def test_euler_converges_at_first_order_to_the_same_answer():
    errors = []
    for steps in (1000, 2000):
        x1 = jax.jit(lambda x0, s=steps: ode.solve(linear, x0, T0, T1, method="euler", steps=s))(
            X0_ND
        )
        errors.append(np.abs(np.asarray(x1, np.float64) - linear_exact(T1)).max())
    # Global error C h: halving h halves it (4e-4 -> 2e-4 here; float32 rounding over 2000
    # steps is ~1e-6, too small to move the ratio).
    assert 1.8 < errors[0] / errors[1] < 2.2
    assert errors[1] < 3e-4


def test_a_time_dependent_field_integrates_to_t1_squared_minus_t0_squared():
    t0, t1 = 0.5, 2.0
    x1 = ode.solve(ramp, X0_ND, t0, t1)
    # Dopri5 is exact on a polynomial of degree 1 in t: only float32 rounding remains.
    np.testing.assert_allclose(x1, X0_ND + t1**2 - t0**2, rtol=1e-6, atol=1e-6)
    # Euler's left-point sum of 2t over n equal steps is t1^2 - t0^2 - (t1 - t0)^2 / n: this pins
    # the number of steps and that each one evaluates the field at its start time.
    x1 = ode.solve(ramp, X0_ND, t0, t1, method="euler", steps=3)
    np.testing.assert_allclose(x1, X0_ND + t1**2 - t0**2 - (t1 - t0) ** 2 / 3, rtol=1e-6)


def test_save_at_returns_the_path():
    ts = np.linspace(T0, T1, 5, dtype=np.float32)
    path = jax.jit(lambda x0, ts: ode.solve(linear, x0, T0, T1, save_at=ts))(X0_ND, ts)
    assert path.shape == (5, *X0_ND.shape)
    np.testing.assert_array_equal(path[0], X0_ND)  # the first saved time is t0 itself
    # Times between steps come from Dopri5's dense (4th-order) interpolant: its error is of the
    # order of the step's own local error, inside the same 5e-5 as the endpoint.
    for t, x in zip(ts, path, strict=True):
        np.testing.assert_allclose(np.asarray(x, np.float64), linear_exact(t), rtol=0, atol=5e-5)


def test_backwards_integration_returns_to_the_start():
    x1 = linear_exact(T1).astype(np.float32)
    back = ode.solve(linear, x1, T1, T0)
    np.testing.assert_allclose(back, X0_ND, rtol=0, atol=5e-5)  # as forwards
    x_euler = ode.solve(ramp, X0_ND, 1.0, 0.0, method="euler", steps=4)
    np.testing.assert_allclose(x_euler, X0_ND - 1.0 - 1.0 / 4, rtol=1e-6)  # left points, h < 0


def test_gradient_through_a_closed_over_parameter_under_jit():
    """What training through the solve needs: dx/dt = a x gives x(1) = x0 e^a, d/da = x0 e^a."""

    def final(a, x0_N):
        return ode.solve(lambda t, x: a * x, x0_N, 0.0, 1.0, rtol=1e-6, atol=1e-6).sum()

    x0 = jnp.array([1.0, -0.5, 2.0])
    value, grad = jax.jit(jax.value_and_grad(final))(0.7, x0)
    np.testing.assert_allclose(value, x0.sum() * np.exp(0.7), rtol=1e-5)
    np.testing.assert_allclose(grad, x0.sum() * np.exp(0.7), rtol=1e-5)


@pytest.mark.parametrize(
    "kwargs, names",
    [
        ({"method": "rk4"}, "method"),
        ({"method": "euler"}, "steps"),
        ({"method": "euler", "steps": 0}, "steps"),
        ({"steps": 2.5}, "steps"),
        ({"rtol": 0.0}, "rtol"),
        ({"save_at": np.zeros((2, 2))}, "save_at"),
        ({"save_at": np.zeros(0)}, "save_at"),
    ],
)
def test_bad_arguments_raise_one_line_config_errors(kwargs, names):
    with pytest.raises(ConfigError, match=names) as error:
        ode.solve(ramp, X0_ND, 0.0, 1.0, **kwargs)
    assert "\n" not in str(error.value)
