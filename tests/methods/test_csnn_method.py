"""CSNN through core.train (methods/csnn/__init__.py, tasks.py, configs/csnn.py): batching of
same-shape graphs, tree features, Minesweeper full-batch training sharded over 8 devices equal
to one device, and config errors."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import methods
from configs import csnn as csnn_config
from core import steps as core_steps
from core.errors import ConfigError
from core.state import TrainState
from methods.csnn import data, graph_ops, model, tasks
from tests.methods.mesh_check import losses_on_mesh


def test_disjoint_union_equals_graph_by_graph():
    # A wrong offset in tile_edges would wire graph b's nodes to graph b' and mix outputs.
    task = tasks.make_task("tree", depth=2)
    batch = tasks.stack_examples(task, np.random.default_rng(0), 3)
    cfg = model.ModelConfig(in_features=task.in_features, out_features=task.out_features, hidden=4)
    params = model.init(cfg, jax.random.PRNGKey(0))
    out_BNO = tasks.forward(cfg, params, task, jnp.asarray(batch["x"]))
    for b in range(3):
        edges = graph_ops.Edges(jnp.asarray(task.senders_E), jnp.asarray(task.receivers_E))
        one_NO = model.apply(cfg, params, (jnp.asarray(batch["x"][b]), edges))
        # Same float32 operations per node; only the segment layout differs.
        np.testing.assert_allclose(out_BNO[b], one_NO, rtol=1e-5, atol=1e-6)


def test_tile_edges_stay_receiver_sorted_and_in_range():
    g = data.barbell(np.random.default_rng(0))
    senders_E, receivers_E = tasks.tile_edges(g.senders_E, g.receivers_E, 4, g.num_nodes)
    assert np.all(np.diff(receivers_E) >= 0)
    assert senders_E.max() < 4 * g.num_nodes
    assert np.all(senders_E // g.num_nodes == receivers_E // g.num_nodes)


def test_tree_features_one_hot_ids():
    depth = 2
    g = data.tree_neighbors_match(np.random.default_rng(1), depth)
    x_NF = tasks.tree_features(g.x_NF, depth)
    assert x_NF.shape == (7, 3 + 2 * 5)
    np.testing.assert_array_equal(x_NF.sum(1), 3.0)  # one type, one key slot, one label slot
    slots = 2**depth + 1
    key_N = np.argmax(x_NF[:, 3 : 3 + slots], 1) - 1
    label_N = np.argmax(x_NF[:, 3 + slots :], 1) - 1
    np.testing.assert_array_equal(key_N, g.x_NF[:, 1])
    np.testing.assert_array_equal(label_N, g.x_NF[:, 2])


def test_minesweeper_sharded_over_8_devices_equals_one_device():
    config = csnn_config.get_config("mesh=cpu,size=smoke")
    config.model.dropout = 0.0  # the same dropout mask either way is not what is tested here
    config.model.input_dropout = 0.0
    sharded, _ = losses_on_mesh(config, methods.make, steps=3)
    session_one = csnn_one_device(config)
    # Same float32 model; only the reduction order over the nodes' shards differs.
    np.testing.assert_allclose(sharded, session_one, rtol=2e-5)
    assert sharded[-1] < sharded[0]  # it trains


def csnn_one_device(config, steps=3):
    from core import train

    session = train.init(config, methods.make(config), devices=jax.devices()[:1])
    state, losses = session.state, []
    for _ in range(steps):
        state, metrics = session.step(state, session.next_batch())
        losses.append(float(metrics["loss"]))
    return losses


def test_minesweeper_loss_only_sees_train_nodes():
    # Changing labels outside the train mask must not change the loss.
    task, graph = tasks.minesweeper_task(0, side=10)
    cfg = model.ModelConfig(in_features=10, out_features=1, hidden=4)
    params = model.init(cfg, jax.random.PRNGKey(0))
    train_N = np.arange(graph.num_nodes) % 3 == 0
    batch = {"x": graph.x_NF, "y": graph.y_N, "train": train_N}
    out_BNO = tasks.forward(cfg, params, task, jnp.asarray(graph.x_NF)[None])
    loss, _ = task.loss(out_BNO, batch)
    flipped = dict(batch, y=np.where(train_N, graph.y_N, 1 - graph.y_N))
    np.testing.assert_allclose(task.loss(out_BNO, flipped)[0], loss, rtol=1e-6)
    flipped_train = dict(batch, y=np.where(train_N, 1 - graph.y_N, graph.y_N))
    assert abs(float(task.loss(out_BNO, flipped_train)[0]) - float(loss)) > 1e-3


@pytest.mark.parametrize(
    "arg, field, message",
    [
        ("model=gcn,ablation=single_operator", None, "ablation"),
        ("depth=x", None, "depth"),
        ("task=ring", None, "task"),
        ("size=smoke", ("train", "batch_size", 64), "batch_size"),
        ("size=smoke", ("model", "widht", 3), "unknown fields"),
        ("size=smoke", ("model", "dropout", 1.5), "dropout"),
        ("size=smoke", ("data", "split", 10), "split"),
        ("size=smoke,task=tree", ("data", "depth", 0), "depth"),
    ],
)
def test_config_errors_name_the_field(arg, field, message):
    with pytest.raises(ConfigError, match=message):
        config = csnn_config.get_config(arg)
        if field:
            section, name, value = field
            config[section][name] = value
        method = methods.make(config)
        method.dataset("train", shard=(0, 1), seed=0)


@pytest.mark.parametrize("kind", ["csnn", "gcn"])
def test_benchmark_tree_messages_flow_to_the_root_only(kind):
    """On the benchmark's child -> parent edges a leaf hears nothing (its output ignores the
    root's input) while the root hears every leaf within depth + 1 layers; on undirected edges
    the leaf does hear the root."""
    depth = 2
    outs = {}
    for edges in ("child_to_parent", "undirected"):
        task = tasks.make_task("tree", depth=depth, tree_edges=edges, tree_keys="by_position")
        x_NF = tasks.stack_examples(task, np.random.default_rng(0), 1)["x"]
        cfg = model.ModelConfig(
            kind=kind, in_features=task.in_features, out_features=task.out_features,
            hidden=8, num_layers=depth + 1, layer_norm=True,
        )  # fmt: skip
        params = model.init(cfg, jax.random.PRNGKey(1))
        moved_root = x_NF.copy()
        moved_root[0, 0] = np.roll(moved_root[0, 0], 1)  # another query at the root
        moved_leaf = x_NF.copy()
        moved_leaf[0, -1] = np.roll(moved_leaf[0, -1], 1)  # another label at the last leaf
        outs[edges] = [
            np.asarray(tasks.forward(cfg, params, task, jnp.asarray(x))[0])
            for x in (x_NF, moved_root, moved_leaf)
        ]
    base, root, leaf = outs["child_to_parent"]
    first_leaf = 2**depth - 1
    np.testing.assert_array_equal(base[first_leaf:], root[first_leaf:])  # leaves hear nothing
    assert np.abs(base[0] - leaf[0]).max() > 1e-4  # the root hears the last leaf
    base_u, root_u, _ = outs["undirected"]
    assert np.abs(base_u[first_leaf] - root_u[first_leaf]).max() > 1e-4


def _plateau_scales(errors_by_window, patience, every=2):
    config = csnn_config.get_config("task=tree,protocol=benchmark,size=smoke")
    config.optim.plateau_every, config.optim.plateau_patience = every, patience
    tx = methods.csnn.plateau_tx(config)
    params = {"w": jnp.zeros(())}
    state, scales = tx.init(params), []
    for error in errors_by_window:
        for _ in range(every):
            updates, state = tx.update({"w": jnp.ones(())}, state, params, value=error)
        scales.append(float(state[-1].scale))
    return scales


def test_plateau_halves_after_patience_windows_as_torch():
    """torch's ReduceLROnPlateau (patience p, mode max, threshold 1e-4 abs) halves the rate at
    the (p + 1)-th window in a row without improvement; a gain of no more than 1e-4 is none."""
    scales = _plateau_scales([0.5] * 5, patience=3)  # windows 2-5 do not improve on window 1
    assert scales == [1.0, 1.0, 1.0, 1.0, 0.5]
    # 5e-5 below the best, so below the threshold (float32 resolves it: 6e-8 at 0.5).
    assert _plateau_scales([0.5] + [0.49995] * 4, patience=3)[-1] == 0.5
    improving = [0.5 - 0.001 * k for k in range(5)]
    assert _plateau_scales(improving, patience=3)[-1] == 1.0


def _copied_plateau_step(loss, tx):
    """The step CSNN carried before core.steps.gradient_step took update_args: the reference."""

    def step(state, batch, *, rng):
        grad_fn = jax.value_and_grad(loss, has_aux=True)
        (value, metrics), grads = grad_fn(state.params, batch, rng=rng, extra=state.extra)
        error = 1.0 - metrics["accuracy"]
        updates, opt_state = tx.update(grads, state.opt_state, state.params, value=error)
        params = optax.apply_updates(state.params, updates)
        lr_scale = opt_state[-1].scale
        metrics = {"loss": value, **metrics, "grad_norm": optax.tree.norm(grads)}
        return state.replace(params=params, opt_state=opt_state), {**metrics, "lr_scale": lr_scale}

    return step


def test_plateau_through_the_core_step_equals_the_copied_step():
    """The core's gradient step given CSNN's training error and scale metric is bitwise the
    copied step it replaced, across a plateau drop. (The same held on the benchmark tree's
    smoke config for 12 steps of the real model: issue 38's report.)"""
    config = csnn_config.get_config("task=tree,protocol=benchmark,size=smoke")
    config.optim.plateau_every, config.optim.plateau_patience, config.optim.lr = 1, 1, 0.1
    tx = methods.csnn.plateau_tx(config)
    x_BF = jax.random.normal(jax.random.PRNGKey(0), (32, 3))
    batch = {"x": x_BF, "y": jnp.sign(x_BF[:, 0] + 0.5 * x_BF[:, 1] ** 2)}  # not separable

    def logistic(params, batch, *, rng, extra):
        del rng, extra
        logit_B = batch["x"] @ params["w"]
        accuracy = jnp.mean(jnp.sign(logit_B) == batch["y"])
        return jnp.mean(jax.nn.softplus(-batch["y"] * logit_B)), {"accuracy": accuracy}

    new_step = core_steps.gradient_step(
        logistic,
        tx,
        update_args=methods.csnn.training_error,
        opt_metrics=methods.csnn.plateau_scale,
    )
    params = {"w": jnp.array([-0.3, 0.2, 0.3])}  # accuracy 0.31, rising for 8 steps
    runs = []
    for step in (jax.jit(_copied_plateau_step(logistic, tx)), jax.jit(new_step)):
        state = TrainState(jnp.int32(0), jax.random.PRNGKey(0), params, tx.init(params), {})
        rows = []
        for _ in range(12):
            state, metrics = step(state, batch, rng=None)
            rows.append({k: np.asarray(v).tobytes() for k, v in metrics.items()})
        runs.append((np.asarray(state.params["w"]).tobytes(), rows))
    assert runs[0] == runs[1]
    scales = [np.frombuffer(row["lr_scale"], np.float32)[0] for row in runs[1][1]]
    # Full rate while the accuracy rises (the error falls), halved once it stalls.
    assert set(scales[:8]) == {1.0} and min(scales) < 1.0


def _host_tree_accuracy(predict, params, trees: dict, chunk: int = 512) -> float:
    """The host loop the "train" / "test" streams replaced (the reference): root accuracy over
    a fixed tree set in chunks, the last padded with repeats of the first tree, not counted."""
    count, correct = len(trees["y"]), 0
    for start in range(0, count, chunk):
        x_BNF = trees["x"][start : start + chunk]
        real = len(x_BNF)
        x_BNF = np.concatenate([x_BNF, np.repeat(trees["x"][:1], chunk - real, axis=0)])
        predicted_B = np.asarray(jnp.argmax(predict(params, jnp.asarray(x_BNF))[:real, 0], -1))
        correct += int(np.sum(predicted_B == trees["y"][start : start + real]))
    return correct / count


@pytest.mark.parametrize("arg", ["protocol=benchmark", "protocol=fresh", "barbell"])
def test_evaluation_streams_equal_the_host_loops_they_replaced(arg):
    """Each stream, summed by the core over padded batches on 8 devices, against the host
    evaluation it replaced on the same parameters: accuracies are the same counts (exactly),
    the barbell's MSE the same mean; the keys are those experiment.py reads."""
    from core import train

    task_arg = "task=barbell" if arg == "barbell" else f"task=tree,depth=2,{arg}"
    config = csnn_config.get_config(f"{task_arg},size=smoke")
    session = train.init(config, methods.make(config))
    got = session.evaluate()
    d = config.data
    kw = dict(tree_edges=d.tree_edges, tree_keys=d.tree_keys) if d.task == "tree" else {}
    task = tasks.make_task(d.task, depth=d.depth, **kw)
    cfg = methods.csnn.model_config(config, task)
    predict = jax.jit(lambda params, x_BNF: tasks.forward(cfg, params, task, x_BNF))
    params = jax.device_get(session.state.params)
    if arg == "protocol=benchmark":
        train_trees, test_trees = tasks.benchmark_tree_arrays(d.depth, d.tree_edges, config.seed)
        want = {
            "train/accuracy": _host_tree_accuracy(predict, params, train_trees),
            "test/accuracy": _host_tree_accuracy(predict, params, test_trees),
        }
        # 77 and 19 trees: the two sets' accuracies differ, so a stream reading the other set
        # (or counting a padded tree) cannot match.
        assert want["train/accuracy"] != want["test/accuracy"]
        assert got == want
        return
    fresh = methods.csnn.eval_graphs(task, config.seed, d.eval_graphs)
    out_BNO = predict(params, jnp.asarray(fresh["x"]))
    if arg == "barbell":
        want_mse = float(jnp.mean(jnp.square(out_BNO - fresh["y"])))
        assert set(got) == {"test/mse", "test/constant_mse"}
        # The same float32 squares added in another order (per graph, then per device):
        # ~1e-7 relative; 1e-5 leaves room. A padded graph counted would be off by > 5 %.
        np.testing.assert_allclose(got["test/mse"], want_mse, rtol=1e-5)
        assert got["test/constant_mse"] == tasks.barbell_constant_mse()
        return
    predicted_B = np.asarray(jnp.argmax(out_BNO[:, 0, :], -1))
    assert got == {"test/accuracy": float(np.mean(predicted_B == fresh["y"]))}


def test_minesweeper_keeps_its_host_auroc_and_unknown_splits_are_refused():
    config = csnn_config.get_config("size=smoke")
    assert set(train_session(config).evaluate()) == {"val_auroc", "test_auroc"}
    tree = methods.make(csnn_config.get_config("task=tree,depth=2,size=smoke"))
    with pytest.raises(ConfigError, match="csnn: dataset split 'val'"):
        tree.dataset("val", shard=(0, 1), seed=0)


def train_session(config):
    from core import train

    return train.init(config, methods.make(config), devices=jax.devices()[:1])
