"""DEQL through core.train (one closed-form fit per step, Gram matrix over the mesh) and its
experiment: selection on validation only, and the quick run's robust claim."""

import dataclasses
import os

import jax
import numpy as np
import pytest

import methods
from configs import deql as deql_config
from core import train
from core.errors import ConfigError
from core.state import TrainState
from methods import deql
from methods.deql import data, experiment


def test_train_step_on_8_devices_equals_the_direct_solve(tmp_path):
    config = deql_config.get_config("mesh=cpu,size=smoke")  # data=8: the psum Gram path
    result = train.run(config, methods.make(config), str(tmp_path))
    split = deql.load_split(config.data)
    X = split.train.toarray().astype(np.float64)
    hp = deql.Hyper(**config.model.to_dict())
    W = deql.fit_host(X.T @ X, hp)
    W_state = np.asarray(result.state.params["W"])
    assert W_state.shape == W.shape and W_state.dtype == np.float32
    # The state holds the float64 solve rounded to float32: relative 2^-24 of the largest entry.
    np.testing.assert_allclose(W_state, W, rtol=0, atol=1e-6 * np.abs(W).max())
    loss = [row["loss"] for row in result.history if "loss" in row][0]
    residual = np.sum((X - X @ W) ** 2) / np.sum(X**2)
    assert abs(loss - residual) < 1e-5  # float32 metric of a float64 quantity
    final = result.history[-1]
    assert set(final) == {"step", "eval/recall@20", "eval/recall@50", "eval/ndcg@100"}
    assert final["eval/recall@20"] == pytest.approx(
        deql.evaluate_W(W, split.val_in, split.val_out)["recall@20"], abs=1e-6
    )


@pytest.mark.parametrize("model", ["ease", "edlae"])
def test_step_without_a_mesh_fits_the_other_models(model):
    config = deql_config.get_config(f"mesh=cpu,size=smoke,model={model}")
    method = methods.make(config)
    batch = next(method.dataset("train", shard=(0, 1), seed=0))
    variables = method.init(jax.random.PRNGKey(0), batch)
    state = TrainState(step=0, rng=None, params=variables["params"], opt_state=(), extra={})
    new, metrics = method.step(state, batch, rng=None)  # no mesh in context: one matmul
    X = batch["x"].astype(np.float64)
    W = deql.fit_host(X.T @ X, deql.Hyper(**config.model.to_dict()))
    np.testing.assert_allclose(new.params["W"], W, rtol=0, atol=1e-6 * np.abs(W).max())
    assert np.all(np.diag(W) == 0)  # EASE and EDLAE constrain the diagonal
    assert 0 < float(metrics["loss"]) < 1


def test_config_errors_are_one_line():
    with pytest.raises(ConfigError, match="model='mf'"):
        deql_config.get_config("model=mf")
    config = deql_config.get_config("size=smoke")
    config.model.b, config.model.lam = 0.0, 0.0
    with pytest.raises(ConfigError, match="b=0 with lam=0"):
        methods.make(config)
    config = deql_config.get_config("size=smoke")
    config.train.batch_size = 16
    method = methods.make(config)
    with pytest.raises(ConfigError, match="train.batch_size=16 is below the 44 train users"):
        method.dataset("train", shard=(0, 1), seed=0)


def test_hyperparameters_are_chosen_on_validation_never_on_test(monkeypatch):
    setting = dataclasses.replace(
        experiment.QUICK, n_val=15, n_test=15, l2_bs=(0.25, 1.0, 2.0), l2_lams=(1.0, 10.0)
    )
    X = deql.synthetic_interactions(120, 50, seed=1)
    before = experiment.run_split(setting, X, seed=0)
    real_split = data.strong_split

    def scrambled(*args, **kwargs):  # the test users' held-out items replaced by others
        s = real_split(*args, **kwargs)
        return s._replace(test_out=s.test_in)

    monkeypatch.setattr(experiment.data, "strong_split", scrambled)
    after = experiment.run_split(setting, X, seed=0)
    for name in experiment.MODELS:
        assert after[name]["chosen"] == before[name]["chosen"]
        assert after[name]["val_recall@20"] == before[name]["val_recall@20"]


def test_quick_experiment_on_movielens_100k(tmp_path):
    """Quick run (1 split, 100 val + 100 test users, 1-4 grid points; ~15 s), measured
    2026-11-30: test Recall@20 EASE 0.4033, EDLAE 0.4083, DEQL(plain) 0.3275, DEQL(L2) 0.4087
    (b = 1, p = 0.5, lam = 30). DEQL(L2) - DEQL(plain) = +0.081 (claim: > 0.01) is robust;
    DEQL(L2) - EDLAE = +0.0004 is within the noise of 100 test users, so only its presence in
    the report is asserted, not its sign."""
    try:
        data.ml100k_path()
    except data.DataError as e:
        if os.environ.get("DEQL_DATA_REQUIRED"):
            raise
        pytest.skip(f"ML-100k unavailable: {e}")
    report = experiment.run(str(tmp_path), quick=True)
    plain_gap, vs_edlae = report.claims
    assert plain_gap.holds and plain_gap.measured > 5 * experiment.PLAIN_GAP
    summary = report.metrics["summary"]
    for name in experiment.MODELS:
        for value in summary[name].values():
            assert 0 < value["mean"] < 1
    assert np.isfinite(vs_edlae.measured) and "Measured gain of DEQL(L2)" in report.notes
    assert os.path.getsize(report.figures[0]) > 1000
