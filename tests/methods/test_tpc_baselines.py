"""TPC's baselines (methods/tpc/baselines.py): the MLP's dropout, parameter matching against
TPC's truncations, training through the core, and the EE-MLP's exits. Synthetic data only."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from methods.tpc import baselines, model, planted
from tests.methods.test_tpc import KEY, _accuracy, _config


def test_mlp_dropout_is_inverted_and_training_only():
    """torch's nn.Dropout after the hidden ReLU: units dropped with probability p, kept ones
    scaled by 1 / (1 - p) so the mean logit is unchanged; without an rng (evaluation) the
    output is the no-dropout one. Dropping without the rescale moves the mean by p."""
    D, H, B = 3, 256, 4096
    params = baselines.init("mlp", D, KEY, hidden=H)
    params["hidden"]["b"] = jnp.ones(H)  # every unit active: its drop is visible
    x_BD = jnp.tile(jnp.ones((1, D)) * 0.1, (B, 1))
    clean = np.asarray(baselines.apply("mlp", params, x_BD))
    np.testing.assert_array_equal(
        np.asarray(baselines.apply("mlp", params, x_BD, dropout=0.5)), clean
    )
    dropped = np.asarray(baselines.apply("mlp", params, x_BD, dropout=0.5, rng=KEY))
    assert np.std(dropped) > 0.1 * abs(clean[0, 0] - params["out"]["b"][0])
    spread = np.std(dropped) / np.sqrt(B)
    assert abs(dropped.mean() - clean.mean()) < 4 * spread, (dropped.mean(), clean.mean())


def test_parameter_counts_and_matched_baselines():
    np.testing.assert_array_equal(model.param_counts(64, 5, 16), [65, 1105, 2145, 3185, 4225])
    H = baselines.mlp_hidden(4225, 64)
    assert H == 64 and baselines.mlp_params(64, H) == 4225  # NOTES 18: 64 hidden, 4,225
    for D, N, R in ((64, 5, 16), (384, 5, 64), (10, 4, 3), (5376, 5, 64)):
        hidden = baselines.ee_mlp_hidden(D, N, R)
        ee_N, tpc_N = baselines.ee_mlp_params(D, hidden), model.param_counts(D, N, R)
        unit_N = np.array([0, D + 2, *(np.array(hidden[:-1]) + 2)])  # one hidden unit's cost
        assert ee_N[0] == tpc_N[0]
        assert np.all(np.abs(ee_N - tpc_N) <= unit_N), (ee_N, tpc_N)
    params = baselines.init("ee_mlp", 10, KEY, hidden=baselines.ee_mlp_hidden(10, 4, 3))
    n_params = sum(x.size for x in jax.tree.leaves(params))
    assert n_params == baselines.ee_mlp_params(10, baselines.ee_mlp_hidden(10, 4, 3))[-1]
    assert baselines.apply("ee_mlp", params, jnp.ones((2, 10))).shape == (2, 4)


def test_baselines_train_through_core(tmp_path):
    """The bilinear probe (order 2 + bias) learns a planted order-2 polynomial that the
    linear probe cannot (test accuracy, seeds 0, 1, 2: linear .50/.50/.51, bilinear
    .97/.96/.89); the EE-MLP trains all its exits."""
    s = planted.splits(8, rank=2, orders=(2,), n_train=1000, n_val=200, n_test=500)
    c = _config(order=3, rank=4)
    c.optim.lr = 1e-2
    one = jax.devices()[:1]
    lin = baselines.fit_linear(s)
    lin_acc = _accuracy(s.y_test, s.x_test @ lin.params["w1"] + lin.params["w0"])
    bil = baselines.fit(c, "bilinear", s, str(tmp_path / "bil"), epochs=15, devices=one)
    bil_acc = _accuracy(s.y_test, baselines.apply("bilinear", bil.params, s.x_test)[:, 0])
    assert bil_acc > lin_acc + 0.3, (bil_acc, lin_acc)
    ee = baselines.fit(c, "ee_mlp", s, str(tmp_path / "ee"), epochs=1, devices=one)
    assert len(ee.test_f1) == 3 and np.all(np.isfinite(ee.test_f1))
    # The parameter-matched MLP (H = 32 here) fits the same quadratic rule through the same
    # trainer: its loss falls and it leaves the linear probe far behind (seed 0: ~.9 vs .5).
    mlp = baselines.fit(c, "mlp", s, str(tmp_path / "mlp"), epochs=15, devices=one, hidden=32)
    mlp_acc = _accuracy(s.y_test, baselines.apply("mlp", mlp.params, s.x_test)[:, 0])
    losses = [row["loss"] for row in mlp.history if "loss" in row]
    assert losses[-1] < 0.7 * losses[0], losses
    assert mlp_acc > lin_acc + 0.25, (mlp_acc, lin_acc)


def test_ee_mlp_exit_reads_only_the_blocks_before_it():
    """Exit 1 is linear in x; exit j + 1 reads h_j: changing block j moves exits j + 1 on and
    leaves the earlier ones bit-identical. Equal widths, so an exit reading the wrong hidden
    state would still have the right shapes; and the loss is the mean BCE over all exits
    (the released code's train_all), so every exit gets a gradient."""
    D, hidden = 6, [6, 6, 6]
    params = baselines.init("ee_mlp", D, KEY, hidden=hidden)
    x_BD = jax.random.normal(jax.random.PRNGKey(1), (16, D))
    forward = jax.jit(functools.partial(baselines.apply, "ee_mlp"))  # one compile, four calls
    logit_BE = np.asarray(forward(params, x_BD))
    exit0 = params["exits"][0]
    # float32 matmuls of the same operands in another grouping: ~1e-7 relative
    np.testing.assert_allclose(logit_BE[:, 0], (x_BD @ exit0["w"] + exit0["b"])[:, 0], 1e-5)
    for j in range(len(hidden)):
        blocks = list(params["blocks"])
        blocks[j] = {**blocks[j], "b": blocks[j]["b"] + 1.0}
        moved_BE = np.asarray(forward({**params, "blocks": blocks}, x_BD))
        np.testing.assert_array_equal(moved_BE[:, : j + 1], logit_BE[:, : j + 1])
        assert np.all(np.abs(moved_BE[:, j + 1 :] - logit_BE[:, j + 1 :]).max(0) > 1e-3), j
    y_B = (x_BD[:, 0] > 0).astype(jnp.int32)
    batch = {"x": x_BD, "y": y_B}
    loss = functools.partial(baselines.loss_fn, "ee_mlp", "xla", 0.0, rng=None, extra=None)
    (loss_value, _), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params, batch)
    per_exit_E = [
        float(jnp.mean(optax.sigmoid_binary_cross_entropy(logit_BE[:, e], y_B)))
        for e in range(len(hidden) + 1)
    ]
    np.testing.assert_allclose(float(loss_value), np.mean(per_exit_E), rtol=1e-5)  # f32 sums
    assert all(float(jnp.abs(g["w"]).max()) > 0 for g in grads["exits"])
