"""TPC (paper 18): term dropout, the staged schedule's freezing (and its core steps against the
copied stage step), recovery of a planted polynomial, the cascade and config errors. Synthetic
data only (methods/tpc/planted.py); the baselines (test_tpc_baselines.py), the experiment's claims
(test_tpc_experiment.py) and the datasets (test_tpc_data.py) have their own tests."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import tpc as tpc_config
from core import optim
from core import steps as core_steps
from core import train as core_train
from core.errors import ConfigError
from core.state import TrainState
from methods import tpc
from methods.tpc import cascade, linear, model, planted
from methods.tpc import train as tpc_train

KEY = jax.random.PRNGKey(0)


def _config(**model):
    c = tpc_config.get_config("mesh=cpu,size=small,dataset=planted")
    c.model.update(model)
    c.train.checkpoint_every = 0
    return c


def _accuracy(y, logit):
    return float(np.mean((np.asarray(logit) > 0) == (np.asarray(y) == 1)))


# ------------------------------------------------------------------------------ term dropout


def test_term_dropout_keeps_older_terms_unscaled_and_never_drops_the_newest():
    T_BN = jax.random.normal(KEY, (6, 4))
    at3 = T_BN[:, 0] + T_BN[:, 1] + T_BN[:, 2]  # P_{:3}: the order-4 term is outside it
    np.testing.assert_allclose(model.train_logit(T_BN, 3, 0.0, KEY), at3, rtol=1e-6)
    np.testing.assert_allclose(model.train_logit(T_BN, 3, 1.0, KEY), T_BN[:, 2], rtol=1e-6)
    traced = jax.jit(lambda t, n: model.train_logit(t, n, 0.0, KEY))(T_BN, jnp.int32(2))
    np.testing.assert_allclose(traced, T_BN[:, 0] + T_BN[:, 1], rtol=1e-6)

    # E[logit] = (1 - p) (older terms) + newest, with no 1/(1 - p): over many rows of one row.
    p, B = 0.3, 40000
    row_N = jnp.array([1.0, 2.0, 4.0, 8.0])
    logit_B = model.train_logit(jnp.tile(row_N, (B, 1)), 3, p, KEY)
    want = (1 - p) * (1.0 + 2.0) + 4.0
    assert abs(float(logit_B.mean()) - want) < 4 * np.sqrt(p * (1 - p) * 5 / B)
    # Each older term has its own per-example mask: every subset of {1, 2} occurs.
    assert set(np.unique(np.asarray(logit_B))) == {4.0, 5.0, 6.0, 7.0}


def test_joint_all_trains_every_truncation_on_one_dropout_draw():
    """The released code's train_all: every truncation's logit from one draw of term masks
    (the forward at order N), the loss their mean BCE. A loss on the last column alone (the
    "joint" mode) or a fresh draw per truncation fails it."""
    T_BN = jax.random.normal(KEY, (64, 4))
    np.testing.assert_allclose(model.train_logits_all(T_BN, 0.0, KEY), jnp.cumsum(T_BN, 1), 1e-6)
    Y_BN = np.asarray(model.train_logits_all(T_BN, 0.5, KEY))
    added_BN = np.diff(Y_BN, axis=1, prepend=0.0)  # the term each truncation adds
    kept_BN = np.isclose(added_BN, np.asarray(T_BN), atol=1e-6)
    assert np.all(kept_BN | (np.abs(added_BN) < 1e-6)) and np.all(kept_BN[:, -1])
    assert 0.3 < kept_BN[:, :-1].mean() < 0.7  # older terms (the linear one too) dropped
    one = np.asarray(model.train_logit(T_BN, 4, 0.5, KEY))
    np.testing.assert_allclose(Y_BN[:, -1], one, rtol=1e-6)  # the same masks as order N's

    cfg = tpc_train.ProbeConfig(order=4, rank=3, mode="joint_all")
    p = model.init_params(5, 4, 3, KEY, linear=(0.1, np.ones(5)), lam_std=0.5)
    x_BD = jax.random.normal(jax.random.PRNGKey(2), (32, 5))
    y_B = (x_BD[:, 0] * x_BD[:, 1] > 0).astype(jnp.int32)
    extra = {"linear": {"w0": p["w0"], "w1": p["w1"]}, "order": jnp.int32(4)}
    loss, _ = tpc_train.loss_fn(
        cfg, {"U": p["U"], "lam": p["lam"]}, {"x": x_BD, "y": y_B}, rng=KEY, extra=extra
    )
    Y_all = model.logits(p, x_BD)
    want = optax.sigmoid_binary_cross_entropy(Y_all, y_B[:, None].astype(jnp.float32)).mean()
    np.testing.assert_allclose(float(loss), float(want), rtol=1e-5)  # float32 sums


# ------------------------------------------------------------------ the staged schedule


def _stepped(freeze_earlier: bool, steps_per_stage: int = 4):
    """Params after stage 0 (order 2) and after stage 1 (order 3) of an N = 4 schedule, and
    the optimiser's step counts on the first step of stage 1."""
    s = planted.splits(8, n_train=256, n_val=64, n_test=64)
    c = _config(order=4, rank=4, freeze_earlier=freeze_earlier)
    c.train.steps, c.train.batch_size = 3 * steps_per_stage, 32
    probe = linear.fit(s.x_train, s.y_train, s.x_val, s.y_val)
    session = core_train.init(c, tpc.make(c, splits=s, probe=probe), devices=jax.devices()[:1])
    state, snaps = session.state, [jax.tree.map(np.array, session.state.params)]
    for i in range(2 * steps_per_stage):
        state, _ = session.step(state, session.next_batch())
        if i == steps_per_stage:  # the first step of stage 1 has run
            counts = [int(x) for x in jax.tree.leaves(state.opt_state) if x.dtype == jnp.int32]
        if i + 1 in (steps_per_stage, 2 * steps_per_stage):
            snaps.append(jax.tree.map(np.array, state.params))
    linear_after = jax.tree.map(np.array, state.extra["linear"])
    return snaps, counts, probe, linear_after


@pytest.mark.parametrize("freeze_earlier", [True, False])
def test_progressive_stages_freeze_and_reset(freeze_earlier):
    """Stage 0 trains order 2 only; in stage 1 order 2 stays bit-identical when frozen (the
    paper) and moves when not (the released code); order 4 never moves before its stage; the
    linear term never moves; the optimiser restarts at the stage boundary."""
    (init, after0, after1), counts, probe, linear_after = _stepped(freeze_earlier)
    for name in ("U", "lam"):
        assert not np.array_equal(after0[name][0], init[name][0])  # order 2 trained in stage 0
        np.testing.assert_array_equal(after0[name][1:], init[name][1:])  # 3, 4 untouched
        assert not np.array_equal(after1[name][1], after0[name][1])  # order 3 trained in stage 1
        np.testing.assert_array_equal(after1[name][2], init[name][2])  # order 4 untouched
        if freeze_earlier:
            np.testing.assert_array_equal(after1[name][0], after0[name][0])
        else:
            assert not np.array_equal(after1[name][0], after0[name][0])
    np.testing.assert_array_equal(linear_after["w1"], probe.w1)
    np.testing.assert_array_equal(linear_after["w0"], probe.w0)
    assert counts and set(counts) == {1}  # Adam's count (and the LR schedule) restarted


# ------------------------------------------------------------ planted polynomial, cascade


@pytest.fixture(scope="module")
def planted_fit(tmp_path_factory):
    """The paper's progressive TPC (N = 3, R = 4) on a planted rank-2 order-2 + order-3
    polynomial in D = 8 (labels = its sign about the median), 30 epochs per order."""
    s = planted.splits(8, rank=2, orders=(2, 3), n_train=2000, n_val=500, n_test=1000, seed=0)
    c = _config(order=3, rank=4)
    c.optim.lr = 3e-3
    workdir = str(tmp_path_factory.mktemp("tpc"))
    fit = tpc_train.fit_progressive(c, s, workdir, epochs=30, devices=jax.devices()[:1])
    return s, fit


def test_planted_low_rank_polynomial_is_recovered(planted_fit):
    """Measured (seeds 0, 1, 2): test accuracy linear .708/.710/.709, order 2 .869/.848/.899,
    order 3 .905/.933/.912. Asserted: order 2 >= linear + .10 and order 3 >= linear + .15, and the
    truncations improve with the order; validation F1 is logged at the end of each stage."""
    s, fit = planted_fit
    Y_BN = np.asarray(model.logits(fit.params, s.x_test))
    acc = [_accuracy(s.y_test, Y_BN[:, n]) for n in range(3)]
    assert acc[0] == pytest.approx(
        _accuracy(s.y_test, s.x_test @ fit.probe.w1 + fit.probe.w0), abs=2e-3
    )
    assert acc[1] >= acc[0] + 0.10, acc
    assert acc[2] >= acc[0] + 0.15, acc
    assert acc[2] > acc[1], acc
    assert [order for _, order, _ in fit.stages] == [2, 3]


def test_cascade_extremes_and_carried_logits(planted_fit):
    s, fit = planted_fit
    D, N, R = 8, 3, 4
    counts_N = model.param_counts(D, N, R)
    Y_BN = np.asarray(model.logits(fit.params, s.x_test))

    everyone_out = cascade.cascade(fit.params, s.x_test, s.y_test, 0.5)
    assert np.all(everyone_out.exit_order == 1) and everyone_out.mean_params == D + 1

    no_exit = cascade.cascade(fit.params, s.x_test, s.y_test, 1.0)
    assert np.all(no_exit.exit_order == N) and no_exit.mean_params == counts_N[-1]
    assert no_exit.f1 == model.f1_score(s.y_test, Y_BN[:, -1])

    for tau in (0.7, 0.9, 0.99):
        r = cascade.cascade(fit.params, s.x_test, s.y_test, tau)
        # Carrying the partial logit and adding term k == recomputing the truncation.
        np.testing.assert_allclose(r.logit, Y_BN[np.arange(len(Y_BN)), r.exit_order - 1], atol=1e-5)
        v = cascade.cascade_from_logits(Y_BN, s.y_test, tau, counts_N)
        np.testing.assert_array_equal(r.exit_order, v.exit_order)
        assert abs(r.exit_fraction.sum() - 1) < 1e-9
        assert r.mean_params == pytest.approx(float(counts_N @ r.exit_fraction))
        assert 1 < r.mean_exit_order < N


def test_bucketed_cascade_makes_the_decisions_of_all_truncations():
    """The jitted cascade (active rows gathered into buckets of row counts) on a random probe
    whose higher orders move rows across the thresholds: its exit orders and logits are those
    of `cascade_from_logits` on `model.logits`, and a second call compiles nothing new."""
    D, N, R, B = 24, 5, 6, 1000
    k_lin, k_probe, k_x, k_y = jax.random.split(KEY, 4)
    w1_D = np.asarray(jax.random.normal(k_lin, (D,))) / np.sqrt(D)
    params = model.init_params(D, N, R, k_probe, linear=(0.3, w1_D), lam_std=1.0)
    x_BD = np.asarray(jax.random.normal(k_x, (B, D)))
    y_B = np.asarray(jax.random.bernoulli(k_y, 0.5, (B,))).astype(np.int32)
    Y_BN = np.asarray(model.logits(params, x_BD))
    counts_N = model.param_counts(D, N, R)
    for tau in (0.6, 0.8, 0.95, 0.99):
        r = cascade.cascade(params, x_BD, y_B, tau)
        v = cascade.cascade_from_logits(Y_BN, y_B, tau, counts_N)
        # The cascade adds order k's term (its own matmul on gathered rows) to the carried
        # logit; model.logits takes all orders from one einsum and a cumsum. Same sums in
        # float32, but XLA may block and associate them differently, so the logits agree to
        # float32 rounding (~1e-6 at |logit| < 10) and not bit for bit: a row whose truncated
        # logit lies within 1e-5 of a threshold may exit one order apart. No other row may.
        _, high = cascade.logit_thresholds(tau)
        near_B = np.any(np.abs(np.abs(Y_BN) - high) < 1e-5, axis=1)
        differ_B = r.exit_order != v.exit_order
        assert not np.any(differ_B & ~near_B), np.flatnonzero(differ_B & ~near_B)
        rows = np.arange(B)
        np.testing.assert_allclose(r.logit, Y_BN[rows, r.exit_order - 1], rtol=1e-5, atol=1e-5)
        assert len(np.unique(r.exit_order)) >= 3  # several stages ran, at several row counts
        assert r.mean_params == pytest.approx(float(counts_N @ r.exit_fraction))
    compiled = cascade._gathered_term._cache_size(), cascade._jit_term._cache_size()
    cascade.cascade(params, x_BD, y_B, 0.8)
    assert (cascade._gathered_term._cache_size(), cascade._jit_term._cache_size()) == compiled
    # 4 sizes per octave, at least MIN_BUCKET = 64, at most B (then x is taken whole).
    buckets = [cascade.bucket(n, B) for n in (1, 64, 65, 300, 513, 897, 1000)]
    assert buckets == [64, 64, 80, 320, 640, 1000, 1000]


def test_pair_attribution_sums_to_the_order_2_term():
    params = model.init_params(5, 3, 4, KEY, lam_std=0.5)
    x_D = jax.random.normal(jax.random.PRNGKey(1), (5,))
    c_DD = np.asarray(model.pair_attribution(params, x_D), np.float64)
    term2 = float(model.terms(model.logits(params, x_D[None]))[0, 1])
    assert np.sum(np.triu(c_DD, 1)) + 0.5 * np.trace(c_DD) == pytest.approx(term2, rel=1e-4)


# --------------------------------------------------------------------------------- config


def test_config_errors_are_one_line_naming_the_field():
    with pytest.raises(ConfigError, match="mode='random' is unknown"):
        tpc_config.get_config("mode=random")
    with pytest.raises(ConfigError, match="dataset='mnist' is unknown"):
        tpc_config.get_config("dataset=mnist")
    for field, value, match in (
        ("rank", 0, "model.rank=0 must be an int >= 1"),
        ("order", 1, "model.order=1 must be an int >= 2"),
        ("mode", "max", "model.mode='max' is unknown"),
        ("dropout", 1.5, "model.dropout=1.5 must be in"),
    ):
        c = _config()
        setattr(c.model, field, value)
        with pytest.raises(ConfigError, match=match) as info:
            tpc.make(c)
        assert "\n" not in str(info.value)


def _copied_stage_step(cfg, loss, tx, stage: int):
    """The stage step TPC carried before it moved onto core.steps.gradient_step: the reference."""
    mask_K = tpc_train.trainable(cfg, stage)

    def masked(tree):
        return {"U": tree["U"] * mask_K[:, None, None], "lam": tree["lam"] * mask_K[:, None]}

    def step(state, batch, *, rng):
        extra = {**state.extra, "order": jnp.int32(tpc_train.stage_order(cfg, stage))}
        grad_fn = jax.value_and_grad(loss, has_aux=True)
        (value, metrics), grads = grad_fn(state.params, batch, rng=rng, extra=extra)
        grads = masked(grads)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, masked(updates))
        metrics = {"loss": value, **metrics, "grad_norm": optax.tree.norm(grads)}
        return state.replace(params=params, opt_state=opt_state), metrics

    return step


def test_staged_core_steps_equal_the_copied_stage_steps():
    """Three stages of the masked core gradient step (with term dropout, so the rng matters)
    are bitwise the copied step's params, losses and accuracies. grad_norm is not compared: the
    core's is the norm of the unmasked gradient, frozen blocks included."""
    s = planted.splits(8, n_train=64, n_val=16, n_test=16)
    c = _config(order=4, rank=4, dropout=0.2)
    c.optim.grad_clip = 0.05  # below the gradients' norm (~0.4): frozen blocks must not count
    sps = 3
    c.train.steps, c.train.batch_size = 3 * sps, 16
    probe = linear.fit(s.x_train, s.y_train, s.x_val, s.y_val)
    method = tpc.make(c, splits=s, probe=probe)
    cfg = tpc_train.probe_config(c)
    tx = optim.make(c.optim, sps)
    lengths = [sps] * (cfg.num_stages - 1)
    copied = core_steps.switch(
        [_copied_stage_step(cfg, method.loss, tx, k) for k in range(cfg.num_stages)],
        core_steps.by_step(lengths),
        reset=core_steps.at_branch_start(lengths),
        tx=tx,
    )
    start = method.init(KEY, None)
    params = start.pop("params")
    runs = []
    for step, step_tx in ((copied, tx), (method.step, method.tx)):
        state = TrainState(jnp.int32(0), KEY, params, step_tx.init(params), start)
        step, rows = jax.jit(step), []
        for batch in itertools.islice(method.dataset("train", shard=(0, 1), seed=0), 3 * sps):
            state, metrics = step(state, batch, rng=jax.random.fold_in(KEY, state.step))
            state = state.replace(step=state.step + 1)
            rows.append([np.asarray(metrics[k]).tobytes() for k in ("loss", "acc", "order")])
        runs.append((jax.tree.map(lambda x: np.asarray(x).tobytes(), state.params), rows))
    assert runs[0] == runs[1]
    assert [np.frombuffer(r[2], np.float32)[0] for r in runs[1][1]] == [2] * 3 + [3] * 3 + [4] * 3
