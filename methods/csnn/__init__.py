"""Cooperative sheaf neural networks (paper 15 of PAPERS.md).

- `data.py`: offline graphs: Minesweeper (100 x 100 king grid) and its seeded 50/25/25 splits,
  the barbell "other clique mean" regression, Tree-NeighborsMatch, jraph-style batching.
- `sheaf.py`: Householder conformal maps and the two normalised directed sheaf operators as
  edge-list segment sums; the NSD edge-map Laplacian. `graph_ops.py`: GCN and SAGE layers.
- `model.py`: CSNN (map learners, W_L X W_R, B(A(.)), (1 + tanh eps) residual) and its
  ablations; GCN / SAGE / NSD-style baselines in the same code.
- `tasks.py`: each task's data, loss and batching (disjoint unions of same-shape graphs).
- `experiment.py`: the paper's claims at CPU scale (its runs); `report.py`: the claims, tables
  and figure of its record.
- here: `make(config) -> Method` for `core.train`. Minesweeper trains full-batch: the batch is
  the node set (x, y, train mask; leading dimension N, sharded over the mesh's data axes like any
  batch), the edge lists are constants of the step. On a multi-device mesh its message passing
  is receiver-partitioned (`tasks.task_edges`, `graph_ops.gather_sum`): each device all-gathers
  the node states and sums over the edges into its own nodes. Barbell and tree draw fresh graphs
  every step; the tree under the benchmark's protocol (`data.tree_protocol="benchmark"`) cycles
  through a fixed training set in shuffled epochs, reports its accuracy on that set and on the
  held-out trees, and (`optim.plateau_every`) halves the update when the training accuracy
  stops improving (`plateau_tx`, given the error by `core.steps.gradient_step`).
- Evaluation, in eval mode: the barbell and the tree are named streams (`core.Evaluator`, summed
  by the core over one padded pass of an evaluation split): "test" on `data.eval_graphs` fresh
  graphs (`eval/test/mse`, `eval/test/accuracy`), or under the benchmark's protocol "train" and
  "test" on the fixed tree sets (`eval/<name>/accuracy`). Minesweeper's validation and test
  AUROC need every score at once: a host `evaluate` over one forward (`eval/val_auroc`,
  `eval/test_auroc`).

    python -m launch.train --config=configs/csnn.py --workdir=/tmp/csnn
    python -m launch.train --config=configs/csnn.py:task=tree,model=gcn --workdir=/tmp/tree
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from optax.contrib import reduce_on_plateau

from core import data as core_data
from core import optim, precision, steps
from core.errors import ConfigError
from core.method import Evaluator, Method
from methods.csnn import data, model, tasks

EVAL_STREAM = (15, 15, 15)  # appended to the seed: evaluation graphs never seen in training


def model_config(config, task: tasks.Task) -> model.ModelConfig:
    """config.model's fields (every ModelConfig field but in/out_features, which the task sets)."""
    fields = {f.name for f in dataclasses.fields(model.ModelConfig)}
    given = config.model.to_dict()
    unknown = sorted(set(given) - fields)
    if unknown or "in_features" in given or "out_features" in given:
        raise ConfigError(f"config.model has unknown fields {unknown}; expected some of {fields}")
    return model.ModelConfig(in_features=task.in_features, out_features=task.out_features, **given)


def _graph_batch(task: tasks.Task, batch: dict):
    """Node features [B, N, F]: minesweeper's batch is its one graph's node set."""
    return batch["x"] if task.example is not None else batch["x"][None]


def make_loss(cfg: model.ModelConfig, task: tasks.Task):
    def loss(params, batch, *, rng, extra):
        del extra
        out_BNO = tasks.forward(cfg, params, task, _graph_batch(task, batch), rng=rng, train=True)
        return task.loss(out_BNO, batch)

    return loss


def minesweeper_dataset(split_name, *, shard, seed, graph, train_idx, batch_size: int):
    """The whole node set as every step's batch (full-batch training; no shuffle)."""
    del split_name
    if batch_size != graph.num_nodes:
        raise ConfigError(
            f"train.batch_size={batch_size}: minesweeper trains full-batch; set it to the "
            f"node count {graph.num_nodes}"
        )
    train_N = np.zeros(graph.num_nodes, bool)
    train_N[train_idx] = True
    arrays = {"x": graph.x_NF, "y": graph.y_N, "train": train_N}
    return core_data.in_memory(
        arrays, global_batch=batch_size, seed=seed, shard=shard, shuffle=False
    )


def graph_dataset(split_name, *, shard, seed, task, batch_size: int):
    """Fresh graphs every step: example i of the stream is drawn from default_rng([seed, i])."""
    del split_name
    return core_data.synthetic(task.example, global_batch=batch_size, seed=seed, shard=shard)


def plateau_tx(config) -> optax.GradientTransformationExtraArgs:
    """`core.optim`'s optimiser, its update scaled by optax's reduce_on_plateau on the training
    error of each `plateau_every`-step window (the mean of the steps' batch accuracies, as the
    benchmark schedules on the running training accuracy of its epoch). Scaling Adam's update
    is scaling its learning rate. optax reduces when its count of windows without improvement
    reaches `patience`, torch when it exceeds it: hence patience + 1."""
    o = config.optim
    return optax.chain(
        optim.make(o, config.train.steps),
        reduce_on_plateau(
            factor=o.plateau_factor,
            patience=o.plateau_patience + 1,
            rtol=0.0,
            atol=o.plateau_threshold,
            accumulation_size=o.plateau_every,
        ),
    )


def training_error(value, metrics) -> dict:
    """`core.steps.gradient_step`'s update_args: the batch's training error for the plateau."""
    del value
    return {"value": 1.0 - metrics["accuracy"]}


def plateau_scale(opt_state) -> dict:
    """`core.steps.gradient_step`'s opt_metrics: the plateau's current update scale."""
    return {"lr_scale": opt_state[-1].scale}


def eval_graphs(task: tasks.Task, seed: int, count: int) -> dict:
    return tasks.stack_examples(task, np.random.default_rng([seed, *EVAL_STREAM]), count)


EVAL_CHUNK = 512  # graphs per evaluation batch (at most): one compiled shape per split


def eval_dataset(split_name, *, shard, seed, arrays_of, train):
    """`train` for split "train"; for an evaluation split, one pass of `arrays_of[split](seed)`
    in batches of up to EVAL_CHUNK graphs (the last padded, "mask" False on padding)."""
    if split_name == "train":
        return train(shard=shard, seed=seed)
    if split_name not in arrays_of:
        raise ConfigError(
            f"csnn: dataset split {split_name!r}; expected train or {list(arrays_of)}"
        )
    arrays = arrays_of[split_name](seed)
    # A multiple of the device count, so that every batch splits over any data-parallel mesh.
    per_device = -(-min(EVAL_CHUNK, len(arrays["y"])) // jax.device_count())
    return core_data.one_pass(arrays, global_batch=per_device * jax.device_count(), shard=shard)


def make_eval_step(cfg: model.ModelConfig, task: tasks.Task):
    """In eval mode (no dropout), summed over real graphs: the barbell's squared error over
    every node and output (its weight the element count, so the stream's value is the mean);
    the tree's count of correct root predictions over the tree count (exact integers)."""

    def eval_step(state, batch, *, rng):
        del rng
        out_BNO = tasks.forward(cfg, state.params, task, batch["x"])
        mask_B = batch["mask"]
        if task.name == "barbell":
            sq_B = jnp.sum(jnp.square(out_BNO - batch["y"]), axis=(1, 2))
            per_graph = out_BNO.shape[1] * out_BNO.shape[2]
            return {"mse": (jnp.sum(jnp.where(mask_B, sq_B, 0.0)), jnp.sum(mask_B) * per_graph)}
        correct_B = (jnp.argmax(out_BNO[:, 0, :], -1) == batch["y"]) & mask_B
        count = jnp.sum(mask_B.astype(jnp.int32))
        return {"accuracy": (jnp.sum(correct_B.astype(jnp.int32)), count)}

    return eval_step


def constant_mse(state, *, seed):
    """Beside the barbell's test MSE: the constant predictor's exact MSE."""
    del state, seed
    return {"constant_mse": tasks.barbell_constant_mse()}


def graph_evaluators(cfg, task, config, trees=None) -> tuple[tuple[Evaluator, ...], dict]:
    """The barbell's and the tree's named streams with the evaluation splits they read: "test"
    (`eval/test/mse` or `eval/test/accuracy`) on `data.eval_graphs` fresh graphs, or with
    `trees` = (train, test) fixed sets, "train" and "test" (`eval/<name>/accuracy`) on each."""
    eval_step = make_eval_step(cfg, task)
    if trees is not None:
        arrays_of = {"train_trees": lambda seed: trees[0], "test_trees": lambda seed: trees[1]}
        streams = (
            Evaluator("train", eval_step, split="train_trees"),
            Evaluator("test", eval_step, split="test_trees"),
        )
        return streams, arrays_of
    arrays_of = {"fresh": lambda seed: eval_graphs(task, seed, config.data.eval_graphs)}
    host = constant_mse if task.name == "barbell" else None
    return (Evaluator("test", eval_step, host, split="fresh"),), arrays_of


def minesweeper_evaluate(cfg: model.ModelConfig, task: tasks.Task, graph, split):
    """Validation and test AUROC (each needs every node's score at once, so a host evaluation:
    one eval-mode forward of the graph, both node sets read from it), as `eval/val_auroc` and
    `eval/test_auroc`."""
    predict = jax.jit(lambda params, x_BNF: tasks.forward(cfg, params, task, x_BNF))

    def evaluate(state, *, seed):
        del seed
        score_N = np.asarray(predict(state.params, jnp.asarray(graph.x_NF)[None]))[0, :, 0]
        _, val_idx, test_idx = split
        return {
            "val_auroc": tasks.auroc(graph.y_N[val_idx], score_N[val_idx]),
            "test_auroc": tasks.auroc(graph.y_N[test_idx], score_N[test_idx]),
        }

    return evaluate


def make(config) -> Method:
    precision.compute_dtype(
        config.dtype,
        ("float32",),
        "bfloat16 not implemented: the sheaf maps and normalised operators are float32",
    )
    d = config.data
    if d.task == "minesweeper":
        task, graph = tasks.minesweeper_task(d.graph_seed, d.side)
        if not 0 <= d.split < d.num_splits:
            raise ConfigError(f"data.split={d.split}: expected 0 <= split < {d.num_splits}")
        split = data.minesweeper_splits(d.graph_seed, d.num_splits, d.side)[d.split]
        cfg = model_config(config, task)
        dataset = lambda name, *, shard, seed: minesweeper_dataset(  # noqa: E731
            name,
            shard=shard,
            seed=seed,
            graph=graph,
            train_idx=split[0],
            batch_size=config.train.batch_size,
        )
        evaluate, evaluators = minesweeper_evaluate(cfg, task, graph, split), ()
    else:
        kw = dict(tree_edges=d.tree_edges, tree_keys=d.tree_keys) if d.task == "tree" else {}
        task = tasks.make_task(d.task, depth=d.depth, **kw)
        cfg = model_config(config, task)
        train = lambda *, shard, seed: graph_dataset(  # noqa: E731
            "train", shard=shard, seed=seed, task=task, batch_size=config.train.batch_size
        )
        trees = None
        if d.task == "tree" and d.tree_protocol == "benchmark":
            trees = tasks.benchmark_tree_arrays(d.depth, d.tree_edges, config.seed)
            train = lambda *, shard, seed: core_data.in_memory(  # noqa: E731
                trees[0], global_batch=config.train.batch_size, seed=seed, shard=shard
            )
        evaluators, arrays_of = graph_evaluators(cfg, task, config, trees)
        dataset = functools.partial(eval_dataset, arrays_of=arrays_of, train=train)
        evaluate = None
    loss = make_loss(cfg, task)
    tx = step = None
    if config.optim.plateau_every > 0:
        if d.task != "tree":
            raise ConfigError("optim.plateau_every > 0 schedules on accuracy: task=tree only")
        tx = plateau_tx(config)
        step = steps.gradient_step(loss, tx, update_args=training_error, opt_metrics=plateau_scale)
    return Method(
        init=lambda rng, batch_spec: {"params": model.init(cfg, rng)},
        loss=loss,
        step=step,
        tx=tx,
        dataset=dataset,
        evaluate=evaluate,
        evaluators=evaluators,
    )
