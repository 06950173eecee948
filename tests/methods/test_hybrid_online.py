"""Hybrid online learning (methods/hybrid_online): exact oracles, Frank-Wolfe against a generic
solver, the two-weight bookkeeping against the O(t^2) definition, no leak of x_t, the
regulariser's log(v + 1), exact hindsight regret, the JAX learner against the NumPy reference,
core.train with resume, the core-trained Method against the experiment's rounds, the game's
exploitability, and the quick experiment."""

import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize

import methods.hybrid_online as hybrid
from configs import hybrid_online as hybrid_config
from core import train
from core.errors import ConfigError
from methods.hybrid_online import classes, experiment, game, learners, reference, simulate
from methods.hybrid_online import learner as ftrl
from methods.hybrid_online.classes import LOSSES, Label, Mixture

INF = np.inf


def random_labels(rng, count):
    """Thresholds of random orientation: (lo, inf, flip)."""
    return [(float(rng.uniform()), INF, int(rng.integers(2))) for _ in range(count)]


def as_label(r):
    return Label(jnp.asarray(r[0]), jnp.asarray(r[1]), jnp.asarray(r[2]))


def padded(c, size):
    c_N = np.zeros(size)
    c_N[: len(c)] = c
    return jnp.asarray(c_N), jnp.arange(size) < len(c)


# ------------------------------------------------------------------ oracles


@pytest.mark.parametrize("n", [0, 1, 2, 7, 16])
def test_threshold_oracle_equals_brute_force_including_the_empty_suffix(n):
    rng = np.random.default_rng(n)
    with jax.enable_x64(True):
        for trial in range(20):
            # trial 0: all costs positive, so only the empty suffix is optimal
            c = rng.uniform(0.1, 1, n) if trial == 0 else rng.normal(size=n)
            brute = min([0.0] + [c[i:].sum() for i in range(n)])
            c_N, valid = padded(c, 16)
            v = classes.suffix_oracle(c_N, valid)
            # float64 sums of <= 16 terms of size ~1: 1e-12 is far above their rounding
            assert float(v.cost) == pytest.approx(brute, abs=1e-12)
            assert float(jnp.sum(c_N * v.indicator)) == pytest.approx(brute, abs=1e-12)
            assert not np.any(np.asarray(v.indicator)[n:])  # never a padded slot
            if trial == 0:
                assert int(v.start) == 16 and float(jnp.sum(v.indicator)) == 0


@pytest.mark.parametrize("n", [0, 1, 5, 12])
def test_interval_oracle_equals_brute_force_including_the_empty_run(n):
    rng = np.random.default_rng(10 + n)
    with jax.enable_x64(True):
        for trial in range(20):
            c = rng.uniform(0.1, 1, n) if trial == 0 else rng.normal(size=n)
            runs = [
                c[i : j + 1].sum() for i, j in itertools.combinations_with_replacement(range(n), 2)
            ]
            brute = min([0.0, *runs])
            c_N, valid = padded(c, 12)
            v = classes.interval_oracle(c_N, valid)
            assert float(v.cost) == pytest.approx(brute, abs=1e-12)  # float64, 12 terms
            assert float(jnp.sum(c_N * v.indicator)) == pytest.approx(brute, abs=1e-12)
            idx = np.flatnonzero(np.asarray(v.indicator))
            assert idx.size == 0 or (np.all(np.diff(idx) == 1) and idx[-1] < n)  # one run


@pytest.mark.parametrize("r_class", ["thresholds", "intervals"])
def test_adversary_best_response_is_the_best_label_function_of_R(r_class):
    rng = np.random.default_rng(3)
    with jax.enable_x64(True):
        for _ in range(20):
            x = np.sort(rng.uniform(size=9))
            c = rng.normal(size=9)
            cuts = [*x, INF]
            if r_class == "thresholds":
                candidates = [(a, INF, f) for a in cuts for f in (0, 1)]
            else:
                candidates = [(a, b, 0) for a in cuts for b in cuts if a <= b]
            brute = min(c @ reference.label(r, x) for r in candidates)
            label, cost = classes.label_best_response(
                jnp.asarray(c), jnp.asarray(x), jnp.ones(9, bool), r_class
            )
            assert float(cost) == pytest.approx(brute, abs=1e-12)  # float64, 9 terms
            achieved = c @ np.asarray(classes.labels_at(label, jnp.asarray(x)))
            assert achieved == pytest.approx(brute, abs=1e-12)  # the label is the argmin


@pytest.mark.parametrize("h_class", ["thresholds", "intervals"])
def test_hindsight_regret_uses_the_exact_best_fixed_hypothesis(h_class):
    rng = np.random.default_rng(4)
    loss = LOSSES["squared"]
    with jax.enable_x64(True):
        for _ in range(10):
            x = rng.uniform(size=30)
            y = (rng.uniform(size=30) < 0.5).astype(float)
            cuts = [*np.sort(x), INF]
            if h_class == "thresholds":
                hs = [(x >= a).astype(float) for a in cuts]
            else:
                hs = [((x >= a) & (x <= b)).astype(float) for a in cuts for b in cuts if a <= b]
            brute = min(np.sum((h - y) ** 2) for h in hs)
            best = classes.best_fixed_loss(jnp.asarray(x), jnp.asarray(y), loss, h_class)
            assert float(best) == pytest.approx(brute, abs=1e-12)  # sums of 0/1 terms
        # a grid of 11 thresholds misses the best one on this sample: the minimum is not a grid's
        x = np.array([0.51, 0.52, 0.53, 0.54, 0.58])
        y = np.array([0.0, 0.0, 1.0, 1.0, 1.0])
        best = classes.best_fixed_loss(jnp.asarray(x), jnp.asarray(y), loss, "thresholds")
        grid = min(np.sum(((x >= a) - y) ** 2) for a in np.linspace(0, 1, 11))
        assert float(best) == 0 and grid == 2


def test_mixture_value_is_the_weighted_sum_of_its_thresholds_and_intervals():
    h = Mixture(jnp.array([0.2, 0.5, jnp.inf]), jnp.array([0.3, 0.5, 0.2]),
                jnp.array([0.5, 0.7, jnp.inf]), jnp.array([0.0, 0.5, 0.0]))  # fmt: skip
    x = jnp.array([0.1, 0.2, 0.5, 0.6, 0.7, 0.71])
    # 0.3 [x >= .2] + 0.5 [.5 <= x <= .7]
    expected = [0.0, 0.3, 0.8, 0.8, 0.8, 0.3]
    np.testing.assert_allclose(classes.mixture_at(h, x), expected, atol=1e-7)  # float32 sums


# ------------------------------------------------------------------ the learner


def buffer_after(xs, rs, T_max):
    """The learner's buffer after rounds 1..len(xs) with samples xs and label functions rs."""
    state = ftrl.init(T_max, jnp.float64)
    for x, r in zip(xs, rs, strict=True):
        state = ftrl.update(
            state, ftrl.frank_wolfe(state.buffer, SMALL), jnp.float64(x), as_label(r)
        )
    return state.buffer


SMALL = ftrl.settings(50, loss="squared", max_iters=3)  # few iterations: building buffers only


def test_two_weights_equal_the_quadratic_definition_and_no_sample_enters_its_own_round():
    """The two running weights give the objective of the definition, which re-sums every past
    round over the samples before it (O(t^2)); storing x_t before adding round t's loss (a
    leak of x_t into l~_t) would change it."""
    rng = np.random.default_rng(5)
    n = 12
    xs, rs = rng.uniform(size=n), random_labels(rng, n)
    with jax.enable_x64(True):
        buffer = buffer_after(xs, rs, 16)
        assert int(buffer.n) == n
        order = np.argsort(xs)
        np.testing.assert_array_equal(np.asarray(buffer.x)[:n], xs[order])
        newest = int(np.flatnonzero(order == n - 1)[0])  # x_n: no round has used it yet
        assert float(buffer.w0[newest]) == 0 and float(buffer.w1[newest]) == 0
        for _ in range(5):
            z_sorted = rng.uniform(size=n)
            z_by_sample = np.empty(n)
            z_by_sample[order] = z_sorted
            s = ftrl.settings(n + 1, loss="squared")
            z_N = jnp.asarray(np.concatenate([z_sorted, np.zeros(4)]))
            ours = float(ftrl.objective(buffer, z_N, s))
            naive = reference.naive_objective(z_by_sample, xs, rs, s.eta)
            assert ours == pytest.approx(naive, rel=1e-12)  # float64, ~100 terms


def test_regulariser_is_v_log_v_plus_1():
    """psi = sum v log(v + 1): 0 and a zero gradient at v = 0 (log v would give nan or -inf),
    log 2 per sample at v = 1."""
    with jax.enable_x64(True):
        buffer = ftrl.empty_buffer(8, jnp.float64)._replace(n=jnp.asarray(5))
        s = ftrl.settings(10)
        zero, one = jnp.zeros(8), jnp.ones(8)
        assert float(ftrl.objective(buffer, zero, s)) == 0
        assert float(ftrl.objective(buffer, one, s)) == pytest.approx(5 * np.log(2), rel=1e-12)
        np.testing.assert_array_equal(ftrl.gradient(buffer, zero, s), np.zeros(8))
        # d/dv v log(v + 1) = log(v + 1) + v / (v + 1): log 2 + 1/2 at v = 1
        np.testing.assert_allclose(ftrl.gradient(buffer, one, s)[:5], np.log(2) + 0.5, rtol=1e-12)


def monotone_minimum(buffer, s, n):
    """min G over conv(thresholds) = {0 <= z_1 <= ... <= z_n <= 1} by scipy (SLSQP)."""
    pad = np.zeros(buffer.x.shape[0] - n)
    G = lambda z: float(ftrl.objective(buffer, jnp.asarray(np.concatenate([z, pad])), s))
    dG = lambda z: np.asarray(ftrl.gradient(buffer, jnp.asarray(np.concatenate([z, pad])), s))[:n]
    step_up = lambda i: np.eye(n)[i + 1] - np.eye(n)[i]
    order = [
        {"type": "ineq", "fun": lambda z, i=i: step_up(i) @ z, "jac": lambda z, i=i: step_up(i)}
        for i in range(n - 1)
    ]
    out = scipy.optimize.minimize(
        G, np.full(n, 0.5), jac=dG, bounds=[(0, 1)] * n, constraints=order, method="SLSQP",
        options={"ftol": 1e-14, "maxiter": 1000},
    )  # fmt: skip
    assert out.success, out.message
    return out.fun


@pytest.mark.parametrize("loss", ["squared", "absolute"])
def test_frank_wolfe_reaches_a_generic_solvers_minimum_within_its_gap(loss):
    rng = np.random.default_rng(6)
    n = 10
    # labels mostly 1 (thresholds low in [0, 1/2]): the minimum is far from the empty start
    xs, rs = rng.uniform(size=n), [(float(a), INF, 0) for a in rng.uniform(0, 0.5, n)]
    with jax.enable_x64(True):
        buffer = buffer_after(xs, rs, 12)
        for gap_scale, max_iters in [(1e-3, 100_000), (1.0, 100_000), (0.0, 4), (0.0, 20)]:
            s = ftrl.settings(20, loss=loss, gap_scale=gap_scale, max_iters=max_iters)
            best = monotone_minimum(buffer, s, n)
            solution = ftrl.frank_wolfe(buffer, s)
            value = float(ftrl.objective(buffer, solution.z, s))
            gap = float(solution.gap)
            # SLSQP's minimum is accurate to ~1e-9 here; the gap must bound G(z) - G* above
            assert best - 1e-9 <= value <= best + gap + 1e-9, (
                gap_scale,
                max_iters,
                value,
                best,
                gap,
            )
            start = float(ftrl.objective(buffer, jnp.zeros(12), s))
            assert value < start - 0.5  # a nontrivial minimum, far from the empty start
            if max_iters == 100_000:
                assert gap <= s.eta * s.epsilon  # the stopping rule
            else:
                assert int(solution.calls) == max_iters and gap > 0  # stopped by the cap
        # the iterate is the value of its mixture at the samples
        h = ftrl.mixture(buffer, solution)
        np.testing.assert_allclose(classes.mixture_at(h, buffer.x[:n]), solution.z[:n], atol=1e-12)


def test_jax_learner_equals_the_numpy_reference_round_by_round():
    rng = np.random.default_rng(7)
    T = 40
    xs, rs = rng.uniform(size=T), random_labels(rng, T)
    s = ftrl.settings(T, loss="squared")
    ours = []
    with jax.enable_x64(True):
        state = ftrl.init(T, jnp.float64)
        step = jax.jit(lambda st, x, r: ftrl.step(st, x, r, s))
        for x, r in zip(xs, rs, strict=True):
            state, (p, loss, solution) = step(state, jnp.float64(x), as_label(r))
            ours.append((float(p), float(loss), float(solution.gap), int(solution.calls)))
    ref = reference.Reference(T, loss="squared")
    theirs = [ref.round(x, r) for x, r in zip(xs, rs, strict=True)]
    for t, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert a[3] == b[3], (t, a, b)  # the same oracle calls: the same FW path
        # float64, different summation orders over <= 40 terms
        np.testing.assert_allclose(a[:3], b[:3], rtol=1e-9, atol=1e-9, err_msg=f"round {t + 1}")


# ------------------------------------------------------------------ core.train


def smoke_config(**overrides):
    config = hybrid_config.get_config("mesh=cpu,size=smoke")
    for key, value in overrides.items():
        config.train[key] = value
    return config


def test_runs_through_core_train_with_no_optimiser_and_resumes_exactly(tmp_path):
    config = smoke_config(steps=4, checkpoint_every=2)
    whole = train.run(config, hybrid.make(config), str(tmp_path / "whole"))
    assert whole.state.opt_state == train.init(config, hybrid.make(config)).state.opt_state
    rows = [r for r in whole.history if "regret" in r]
    assert [r["rounds"] for r in rows] == [8, 16, 24, 32]  # 8 rounds per step
    assert all(r["gap_max"] <= float(hybrid.settings_from(config).epsilon) for r in rows)
    # an interrupted run: stop after step 2 (its checkpoint), then the same command resumes
    first = smoke_config(steps=4, checkpoint_every=2)
    part = tmp_path / "part"
    session_rows = train.run(
        smoke_config(steps=4, checkpoint_every=2), hybrid.make(first), str(part)
    )
    del session_rows
    import shutil

    shutil.rmtree(part / "checkpoints" / "4")
    resumed = train.run(first, hybrid.make(first), str(part))
    for a, b in zip(
        jax.tree.leaves(whole.state.params), jax.tree.leaves(resumed.state.params), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    lines = [json.loads(x) for x in (part / "metrics.jsonl").read_text().splitlines()]
    assert [r["rounds"] for r in lines if "regret" in r] == [8, 16, 24, 32]


@pytest.mark.parametrize("adversary", ["adaptive", "oblivious"])
def test_core_trained_method_equals_the_experiments_rounds_round_by_round(adversary):
    """The Method trained by core.train (B rounds per step, state carried in params / extra
    across jitted steps on the test mesh) and `simulate.rounds` (the experiment's one scan of T
    rounds) on the same x_t and the same round keys (the core's step key fold_in(rng, step),
    split B ways) play the same game: every round's x, loss and label, the oracle calls and the
    final buffers are bitwise equal (the same float32 operations in the same order: the step
    only cuts the scan into pieces); the steps' aggregate metrics equal the rounds' up to
    float32 rounding."""
    steps, batch = 30, 8  # T = 240 rounds (the batch: a multiple of the 8 test devices)
    config = smoke_config(steps=steps, batch_size=batch)
    config.hybrid.adversary = adversary
    method = hybrid.make(config)
    session = train.init(config, method)
    base_key = jax.device_get(session.state.rng)  # the core folds each step into it
    rows = session.train(steps)
    final = jax.device_get(session.state)

    s = hybrid.settings_from(config)
    h = config.hybrid
    stream = method.dataset("train", shard=(0, 1), seed=config.seed)
    x_T = jnp.concatenate([jnp.asarray(next(stream)["x"]) for _ in range(steps)])
    keys_T = jnp.concatenate(
        [jax.random.split(jax.random.fold_in(base_key, i), batch) for i in range(steps)]
    )
    choose = simulate.adversary(
        h.adversary, distribution=h.distribution, loss=h.loss, r_class=h.r_class
    )
    run = jax.device_get(
        jax.jit(
            lambda keys, x: simulate.rounds(
                learners.ftrl_fw(s), choose, keys, x, loss=s.loss, h_class=s.h_class
            )
        )(keys_T, x_T)
    )
    history = final.extra["history"]
    np.testing.assert_array_equal(history["x"], run.x_T)
    np.testing.assert_array_equal(history["y"], run.label_T)
    np.testing.assert_array_equal(history["loss"], run.loss_T)
    ours = hybrid._as_state(final.params)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(run.state), strict=True):
        np.testing.assert_array_equal(a, b)
    per_step = lambda a_T: np.asarray(a_T).reshape(steps, batch)
    assert [r["oracle_calls"] for r in rows] == per_step(run.calls_T).sum(1).tolist()
    # The step's aggregates are reduced and divided by XLA inside the step (a division by the
    # constant eta becomes a multiplication by its reciprocal), these by NumPy: float32 rounding
    # of a sum or a quotient, a few units in the last place (2^-23 = 1.2e-7), hence 1e-6.
    aggregates = [
        ([r["gap_max"] for r in rows], per_step(run.gap_T).max(1) / s.eta),
        ([r["loss"] for r in rows], per_step(run.loss_T).mean(1)),
        (rows[-1]["regret"], run.regret),
    ]
    for step_metric, from_rounds in aggregates:
        np.testing.assert_allclose(step_metric, from_rounds, rtol=1e-6)
    assert len(set(np.asarray(run.label_T).tolist())) == 2  # the adversary plays both labels


def test_config_errors_are_one_line():
    config = smoke_config()
    config.hybrid.adversary = "nasty"
    with pytest.raises(ConfigError, match="hybrid.adversary='nasty'"):
        hybrid.make(config)
    config = smoke_config()
    config.dtype = "bfloat16"
    with pytest.raises(ConfigError, match="dtype='bfloat16' is not supported by this method"):
        hybrid.make(config)


# ------------------------------------------------------------------ the game


def test_exploitability_is_zero_at_the_equilibrium_and_positive_off_it():
    with jax.enable_x64(True):
        q = jnp.asarray(game.quadrature("uniform", 1000))
        half = Mixture(jnp.array([0.0]), jnp.array([0.5]), jnp.array([jnp.inf]), jnp.zeros(1))
        # h = 1/2 everywhere and r_bar = 1/2 everywhere: u = 0 whatever either plays
        assert abs(float(game.exploitability(half, jnp.full(q.shape, 0.5), q))) < 1e-12
        pure = Mixture(jnp.array([0.5]), jnp.array([1.0]), jnp.array([jnp.inf]), jnp.zeros(1))
        # a pure threshold is answered by r = h (payoff 1); r_bar = 1/2 gives the min player 0
        assert float(game.exploitability(pure, jnp.full(q.shape, 0.5), q)) == pytest.approx(1.0)


# ------------------------------------------------------------------ the quick experiment


def test_quick_experiment_ftl_slope_exceeds_ftrl_fw_slope(tmp_path):
    report = experiment.run(str(tmp_path), quick=True)
    assert report.all_hold, report.markdown()
    assert (tmp_path / "hybrid_online_regret.png").exists()
    derived = experiment.claims_from_results(json.loads(json.dumps(report.results)))
    assert [c.holds for c in derived] == [c.holds for c in report.claims]
