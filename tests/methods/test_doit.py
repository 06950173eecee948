"""DOIT (methods/doit): cycle score, GP surrogate, encoding, acquisition schedule, SWATS,
Padam, and the policy through core.train (a killed run resumes bitwise)."""

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import methods.doit as doit
from configs import doit as doit_config
from core import cycles, train
from core.errors import ConfigError
from methods.doit import encoding, optimizers, policy, score, surrogate


def test_cycle_score_equals_a_hand_computation():
    losses = [4.0, 3.0, 3.5, 1.0]  # l0 = 4, then three losses
    d = [(4 - 3) / 4, (3 - 3.5) / 3.5, (3.5 - 1) / 3.5]
    upper = (4 - 3.5) / (4 * 3)
    lower = (4 - 1) / (4 * 3)
    mean, std = np.mean(d), np.std(d)
    for alpha in (0.0, 0.7):
        expected = np.tanh((mean + upper + lower) / 3 + alpha * std)
        assert score.cycle_score(losses, alpha) == pytest.approx(expected, rel=1e-12)


def test_cycle_score_lies_in_minus_one_one_and_diverged_cycles_score_minus_one():
    rng = np.random.default_rng(0)
    for _ in range(200):
        losses = rng.exponential(size=rng.integers(2, 30)) * 10.0 ** rng.integers(-6, 6)
        assert -1.0 <= score.cycle_score(losses, alpha=rng.normal()) <= 1.0
    assert score.cycle_score([1.0, 0.5, np.nan]) == -1.0
    assert score.cycle_score([1.0, 0.5, 0.25]) > 0 > score.cycle_score([0.25, 0.5, 1.0])


def closed_form(x, y, q, length, noise, amplitude):
    k = amplitude * (surrogate.rbf(x, x, length) + noise * np.eye(len(y)))
    k_q = amplitude * surrogate.rbf(x, q, length)
    k_inv = np.linalg.inv(k)
    mean = k_q.T @ k_inv @ y
    var = amplitude - np.einsum("nq,nm,mq->q", k_q, k_inv, k_q)
    return mean, np.sqrt(var)


def test_gp_posterior_equals_the_closed_form():
    rng = np.random.default_rng(1)
    x, q = rng.normal(size=(7, 2)), rng.normal(size=(4, 2))
    y = np.tanh(x[:, 0]) + 0.05 * rng.normal(size=7)
    f = surrogate.fit(x, y, length=0.8, noise=1e-2)
    assert f.amplitude == pytest.approx(y @ np.linalg.solve(
        surrogate.rbf(x, x, 0.8) + 1e-2 * np.eye(7), y) / 7, rel=1e-10)  # fmt: skip
    mean, std = surrogate.predict(f, q)
    ref_mean, ref_std = closed_form(x, y, q, 0.8, 1e-2, f.amplitude)
    # float64 Cholesky vs explicit inverse of a well-conditioned 7x7 kernel.
    np.testing.assert_allclose(mean, ref_mean, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(std, ref_std, rtol=1e-6, atol=1e-9)


def test_gp_hyperparameters_maximise_the_marginal_likelihood():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(12, 2))
    y = np.sin(2 * x[:, 0]) + 0.1 * rng.normal(size=12)
    f = surrogate.fit(x, y)
    best = f.log_likelihood
    assert best == pytest.approx(
        surrogate.log_likelihood(x, y, f.length, f.noise, f.amplitude), rel=1e-9
    )
    for length in surrogate.LENGTH_SCALES:
        for noise in surrogate.NOISE_RATIOS:
            other = surrogate.fit(x, y, length=length, noise=noise)
            assert other.log_likelihood <= best + 1e-9
    for factor in (0.9, 1.1):  # the amplitude is the likelihood's maximum for (l, r)
        ll = surrogate.log_likelihood(x, y, f.length, f.noise, f.amplitude * factor)
        assert ll < best


def test_gp_without_data_is_the_prior_and_data_shrinks_the_std():
    mean, std = surrogate.posterior(np.zeros((0, 2)), np.zeros(0), np.zeros((3, 2)))
    np.testing.assert_array_equal(mean, 0.0)
    np.testing.assert_array_equal(std, surrogate.PRIOR_STD)
    x = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    _, std = surrogate.posterior(x, np.array([0.5, 0.4, 0.6]), np.array([[0.0, 0.0], [9.0, 9.0]]))
    assert std[0] < std[1]


def test_kappa_halves_with_the_self_consistent_schedule_and_grows_as_printed():
    s = policy.Settings(num_optimizers=2, num_cycles=50, halving=10, omega_t=0.4)
    assert [policy.kappa(s, i) for i in (0, 9, 10, 25)] == [0.6, 0.6, 0.3, 0.15]
    printed = policy.Settings(2, 50, halving=10, omega_t=0.4, schedule="printed")
    assert [policy.kappa(printed, i) for i in (0, 10, 20)] == pytest.approx([0.6, 0.8, 0.9])


def test_pca_basis_is_the_snapshots_principal_axes_and_projects_alike_on_device():
    rng = np.random.default_rng(3)
    along = rng.normal(size=(9, 1)) * np.array([[3.0, 1.0, 0.0, 0.0, 0.0]])
    snaps = {"0": (along + 0.01 * rng.normal(size=(9, 5))).astype(np.float32)}
    means, bases = encoding.fit(snaps, 9, components=2)
    direction = np.array([3.0, 1.0, 0, 0, 0]) / np.sqrt(10)
    assert abs(bases["0"][0] @ direction) == pytest.approx(1.0, abs=1e-3)  # noise 0.01
    np.testing.assert_allclose(bases["0"] @ bases["0"].T, np.eye(2), atol=1e-5)
    params = {"w": jnp.asarray(snaps["0"][4])}
    on_device = encoding.project(params, means, bases, pattern="w")
    on_host = encoding.project_rows(snaps, 9, means, bases)[4]
    np.testing.assert_allclose(on_device, on_host, rtol=1e-5, atol=1e-6)  # float32 matmuls
    with pytest.raises(ConfigError, match="matches no parameter"):
        encoding.selected(params, "kernel")


def swats_reference(grads, lr, b1, b2, eps, switch_eps):
    """(first step whose criterion holds, Lambda) by direct numpy iteration."""
    m = v = np.zeros_like(grads[0])
    lam = 0.0
    for k, g in enumerate(grads, start=1):
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        p = -lr * (m / (1 - b1**k)) / (np.sqrt(v / (1 - b2**k)) + eps)
        gamma = p @ p / (-p @ g)
        lam = b2 * lam + (1 - b2) * gamma
        if k > 1 and abs(lam / (1 - b2**k) - gamma) < switch_eps:
            return k, lam / (1 - b2**k)
    return None, None


def test_swats_switches_when_its_criterion_says_and_not_before():
    rng = np.random.default_rng(4)
    grads = (np.array([1.0, -0.5, 2.0]) + 0.3 * rng.normal(size=(60, 3))).astype(np.float32)
    switch_eps = 2e-4  # fixed so the criterion first holds mid-sequence (checked below)
    k_switch, lam = swats_reference(grads.astype(np.float64), 0.01, 0.9, 0.999, 1e-8, switch_eps)
    assert k_switch is not None and 5 < k_switch < 55
    tx = optimizers.swats(0.01, switch_eps=switch_eps)
    state = tx.init(jnp.zeros(3))
    switched = []
    for k, g in enumerate(grads, start=1):
        updates, state = tx.update(jnp.asarray(g), state)
        switched.append(bool(state.switched))
        if k == k_switch:
            assert float(state.sgd_lr) == pytest.approx(lam, rel=1e-3)  # float32 vs float64
        if k == k_switch + 1:  # the first SGD step: -(1 - b1) Lambda g (fresh velocity)
            np.testing.assert_allclose(updates, -0.1 * float(state.sgd_lr) * g, rtol=1e-5)
    assert switched.index(True) + 1 == k_switch and all(switched[k_switch - 1 :])


def test_padam_with_exponent_one_half_is_amsgrad_with_bias_correction():
    rng = np.random.default_rng(5)
    grads = rng.normal(size=(6, 3)).astype(np.float32)
    tx = optimizers.padam(0.1, partial=0.5)
    state = tx.init(jnp.zeros(3))
    m = v = v_max = np.zeros(3, np.float32)  # the reference in float32 too
    for t, g in enumerate(grads, start=1):
        updates, state = tx.update(jnp.asarray(g), state)
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
        v_max = np.maximum(v_max, v)
        # Bias corrections in float32 as the transformation has them: 1 - 0.999^t cancels.
        c1, c2 = (1 - np.float32(b) ** np.float32(t) for b in (0.9, 0.999))
        expected = -0.1 * (m / c1) / (np.sqrt(v_max / c2) + 1e-8)
        np.testing.assert_allclose(updates, expected, rtol=1e-5)  # float32, another op order


def test_adabound_equals_a_hand_computation_of_two_steps():
    # gamma = 1 makes the band narrow from step 1: [final_lr / 2, 2 final_lr], then
    # [2/3, 3/2] final_lr; final_lr = 0.01 so one coordinate is clipped and one is not.
    tx = optimizers.adabound(1e-3, final_lr=0.01, gamma=1.0)
    state = tx.init(jnp.zeros(2))
    updates, state = tx.update(jnp.array([1.0, 0.1]), state)
    # Step 1: m = 0.1 g, v = 0.001 g^2, eta = 1e-3 sqrt(0.001) / 0.1 / (sqrt(0.001) |g|)
    # = [0.01, 0.1]: the first inside [0.005, 0.02], the second clipped to 0.02.
    np.testing.assert_allclose(updates, [-0.01 * 0.1, -0.02 * 0.01], rtol=1e-5)  # float32
    updates, state = tx.update(jnp.array([-2.0, 0.1]), state)
    m = np.array([0.09 * 1.0 + 0.1 * -2.0, 0.09 * 0.1 + 0.1 * 0.1])
    v = np.array([0.999 * 0.001 * 1.0 + 0.001 * 4.0, 0.999 * 0.001 * 0.01 + 0.001 * 0.01])
    eta = 1e-3 * np.sqrt(1 - 0.999**2) / (1 - 0.9**2) / (np.sqrt(v) + 1e-8)
    assert eta[0] < 0.01 * 2 / 3 < 0.01 * 3 / 2 < eta[1]  # both clipped, one to each side
    np.testing.assert_allclose(updates, -np.array([0.01 * 2 / 3, 0.01 * 3 / 2]) * m, rtol=1e-5)


def smoke_config(**doit_options):
    c = doit_config.get_config("size=smoke")
    c.train.steps, c.train.checkpoint_every, c.train.keep_checkpoints = 6, 2, 10
    c.doit.tau, c.doit.n_ini = 5, 4
    for k, v in doit_options.items():
        c.doit[k] = v
    return c


def test_doit_policy_cold_starts_then_acquires_and_resumes_bitwise(tmp_path):
    c = smoke_config()
    one = jax.devices()[:1]
    whole = train.run(c, doit.make(c), str(tmp_path / "whole"), devices=one)
    state = whole.state.extra["doit"]
    chosen = np.asarray(state["chosen"])
    assert np.all(chosen >= 0)  # every cycle recorded
    basis = np.asarray(state["pca_basis"]["0"])
    np.testing.assert_allclose(basis @ basis.T, np.eye(2), atol=1e-5)  # fitted after cycle 4
    assert np.all(np.abs(np.asarray(state["encodings"])[: c.train.steps]).sum(1) > 0)
    run_dir = tmp_path / "killed"
    shutil.copytree(tmp_path / "whole", run_dir)
    for lost in ("4", "6"):  # killed in cycle 3: a cold-start draw, then the PCA fit, to redo
        shutil.rmtree(run_dir / "checkpoints" / lost)
    resumed = train.run(c, doit.make(c), str(run_dir), devices=one)
    for a, b in zip(jax.tree.leaves(resumed.state), jax.tree.leaves(whole.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bad_doit_options_are_one_line_errors():
    with pytest.raises(ConfigError, match="doit.policy='greedy' is unknown"):
        doit.make(smoke_config(policy="greedy"))
    with pytest.raises(ConfigError, match="doit.single='lbfgs' is not in the pool"):
        doit.make(smoke_config(policy="single", single="lbfgs"))
    with pytest.raises(ConfigError, match="doit.task='sphere' is unknown"):
        doit.make(smoke_config(task="sphere"))
    with pytest.raises(ConfigError, match="doit.schedule='linear'"):
        doit.make(smoke_config(schedule="linear"))


def test_single_policy_runs_its_optimiser_only():
    c = smoke_config(policy="single", single="sgdm")
    session = train.init(c, doit.make(c), devices=jax.devices()[:1])
    rows = session.train(4)
    assert {r[cycles.OPTIMIZER] for r in rows} == {list(c.doit.pool).index("sgdm")}
    assert isinstance(optax.sgd(0.1), optax.GradientTransformation)
