"""The three CSNN tasks as data + loss + evaluation, for `methods.csnn.make` and the experiment.

- `minesweeper`: one fixed 100 x 100 graph; node classification (mine or not), BCE on the train
  nodes of a split, AUROC on its validation and test nodes. The batch is the whole node set
  (full-batch training, as the benchmark is run), node arrays with leading dimension N.
- `barbell`: fresh two-clique graphs every step; MSE regression of the other clique's mean,
  against the exact constant-predictor MSE.
- `tree`: Tree-NeighborsMatch of one depth; fresh trees every step; cross-entropy on the root's
  label, accuracy on fresh trees. Or the benchmark's protocol (`benchmark_tree_arrays`): a
  fixed set of trees with edges from child to parent, accuracy on that set and a held-out one.

Barbell and tree graphs share one topology per task, so a batch is node features [B, N, F] and
the model runs on their disjoint union (`tile_edges`), with no padding. `forward` traced under a
mesh whose data axes span P > 1 devices runs Minesweeper's message passing receiver-partitioned
(`graph_ops.partition_edges`, built when the step is traced); otherwise on the plain edge lists.

    task = make_task("tree", depth=3)
    example = task.example(np.random.default_rng(0))     # {"x": [N, F], "y": ...}
"""

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.metrics import roc_auc_score

from core.errors import ConfigError
from core.mesh import data_axes
from methods.csnn import data, graph_ops, model

TASKS = ("minesweeper", "barbell", "tree")


class Task(NamedTuple):
    """name; senders_E / receivers_E / num_nodes of one graph; in/out features; `example(rng)`
    one graph's {"x", "y"} (graph-batch tasks) or None (minesweeper); `loss(out_BNO, batch)`
    -> (scalar, metrics)."""

    name: str
    senders_E: np.ndarray
    receivers_E: np.ndarray
    num_nodes: int
    in_features: int
    out_features: int
    example: Callable | None
    loss: Callable


def tile_edges(senders_E, receivers_E, num_graphs: int, num_nodes: int):
    """Edges of `num_graphs` disjoint copies of one graph (copy b's nodes b N .. b N + N - 1);
    still sorted by receiver, as the segment sums need."""
    offsets_B1 = (np.arange(num_graphs) * num_nodes)[:, None]
    return (
        (np.asarray(senders_E)[None] + offsets_B1).ravel().astype(np.int32),
        (np.asarray(receivers_E)[None] + offsets_B1).ravel().astype(np.int32),
    )


# --- Minesweeper -----------------------------------------------------------------------------


def minesweeper_task(graph_seed: int = 0, side: int = 100) -> tuple[Task, data.Graph]:
    graph = data.minesweeper(graph_seed, side=side)

    def loss(out_BNO, batch):
        logits_N = out_BNO[0, :, 0]
        bce_N = optax.sigmoid_binary_cross_entropy(logits_N, batch["y"].astype(logits_N.dtype))
        mask_N = batch["train"].astype(logits_N.dtype)
        return jnp.sum(bce_N * mask_N) / jnp.maximum(jnp.sum(mask_N), 1.0), {}

    task = Task(
        "minesweeper",
        graph.senders_E,
        graph.receivers_E,
        graph.num_nodes,
        graph.x_NF.shape[1],
        1,
        None,
        loss,
    )
    return task, graph


def auroc(y_N, score_N) -> float:
    """AUROC, NaN when only one class is present (an undefined metric, not 0.5)."""
    y_N = np.asarray(y_N)
    if y_N.min() == y_N.max():
        return float("nan")
    return float(roc_auc_score(y_N, np.asarray(score_N)))


# --- Barbell ---------------------------------------------------------------------------------


BARBELL_CLIQUE, BARBELL_FEATURES = 6, 3  # networkx barbell_graph(6, 0), 3 features (our plan)


def barbell_constant_mse() -> float:
    """The best constant predictor's exact test MSE on the normalised barbell task."""
    return data.constant_baseline_mse(BARBELL_CLIQUE, BARBELL_FEATURES, normalise=True)


def barbell_task(clique_size: int = BARBELL_CLIQUE, features: int = BARBELL_FEATURES) -> Task:
    template = data.barbell(np.random.default_rng(0), clique_size, features)

    def example(rng):
        g = data.barbell(rng, clique_size, features)
        return {"x": g.x_NF, "y": g.y_N}

    def loss(out_BNO, batch):
        mse = jnp.mean(jnp.square(out_BNO - batch["y"]))
        return mse, {"mse": mse}

    return Task(
        "barbell",
        template.senders_E,
        template.receivers_E,
        template.num_nodes,
        features,
        features,
        example,
        loss,
    )


# --- Tree-NeighborsMatch ---------------------------------------------------------------------


def tree_features(x_NF: np.ndarray, depth: int) -> np.ndarray:
    """One-hot float features of a tree's integer ids: node type (3) | key + 1 (L + 1) | label + 1
    (L + 1), L = 2^depth leaves (id -1, "absent", is slot 0). A linear layer on a one-hot is an
    embedding lookup, so lin_in plays the role of Alon & Yahav's key and label embeddings."""
    slots = 2**depth + 1
    n = x_NF.shape[0]
    out_NF = np.zeros((n, 3 + 2 * slots), np.float32)
    rows = np.arange(n)
    out_NF[rows, x_NF[:, 0]] = 1.0
    out_NF[rows, 3 + x_NF[:, 1] + 1] = 1.0
    out_NF[rows, 3 + slots + x_NF[:, 2] + 1] = 1.0
    return out_NF


def tree_task(depth: int, edges: str = "undirected", keys: str = "shuffled") -> Task:
    if not isinstance(depth, int) or depth < 1:
        raise ConfigError(f"data.depth={depth!r}: Tree-NeighborsMatch needs an int depth >= 1")
    kw = dict(edges=edges, keys=keys)
    template = data.tree_neighbors_match(np.random.default_rng(0), depth, **kw)
    classes = 2**depth

    def example(rng):
        g = data.tree_neighbors_match(rng, depth, **kw)
        return {"x": tree_features(g.x_NF, depth), "y": np.int32(g.y_N[0])}

    def loss(out_BNO, batch):
        logits_BK = out_BNO[:, 0, :]  # node 0 of each tree is its root
        ce = optax.softmax_cross_entropy_with_integer_labels(logits_BK, batch["y"]).mean()
        accuracy = jnp.mean(jnp.argmax(logits_BK, -1) == batch["y"])
        return ce, {"accuracy": accuracy}

    return Task(
        "tree",
        template.senders_E,
        template.receivers_E,
        template.num_nodes,
        3 + 2 * (classes + 1),
        classes,
        example,
        loss,
    )


def benchmark_tree_arrays(depth: int, edges: str, seed: int) -> tuple[dict, dict]:
    """The benchmark's fixed train and test trees (`data.benchmark_tree_split`, keys by
    position) as {"x": [M, N, F], "y": [M]} arrays; the split is drawn from the run's seed."""
    rng = np.random.default_rng([seed, *BENCHMARK_SPLIT_STREAM])
    split = data.benchmark_tree_split(rng, depth)
    n_leaves = 2**depth

    def arrays(pairs):
        graphs = [
            data.tree_graph(depth, np.arange(n_leaves), labels_L, query, edges)
            for labels_L, query in pairs
        ]
        return {
            "x": np.stack([tree_features(g.x_NF, depth) for g in graphs]),
            "y": np.array([g.y_N[0] for g in graphs], np.int32),
        }

    return arrays(split[0]), arrays(split[1])


BENCHMARK_SPLIT_STREAM = (16, 16, 16)  # appended to the seed; distinct from evaluation's


def make_task(
    name: str,
    *,
    depth: int = 3,
    graph_seed: int = 0,
    side: int = 100,
    tree_edges: str = "undirected",
    tree_keys: str = "shuffled",
) -> Task:
    if name == "minesweeper":
        return minesweeper_task(graph_seed, side)[0]
    if name == "barbell":
        return barbell_task()
    if name == "tree":
        return tree_task(depth, tree_edges, tree_keys)
    raise ConfigError(f"data.task={name!r} is unknown; expected one of: {', '.join(TASKS)}")


def stack_examples(task: Task, rng: np.random.Generator, count: int) -> dict:
    """`count` fresh graphs of a graph-batch task as {"x": [B, N, F], "y": [B, ...]}."""
    examples = [task.example(rng) for _ in range(count)]
    return {k: np.stack([e[k] for e in examples]) for k in examples[0]}


def mesh_node_shards() -> int:
    """How many devices the data axes of the mesh in context span (1 without a mesh)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return 1
    return math.prod(mesh.shape[a] for a in data_axes(mesh))


def task_edges(task: Task, num_graphs: int, num_nodes: int) -> graph_ops.Edges:
    """The edges `forward` runs on: the tiled plain lists, plus receiver-partitioned shards for
    minesweeper when the mesh in context splits its node set over more than one device.

    Graph-batch tasks (barbell, tree) keep the plain path: their batch is split over graphs, so
    every device's edges join its own nodes, and the halo exchange of the shards (an all-gather
    of all B N node states) would only move data no device needs; XLA's partitioning of their
    small per-step graphs is left as it was.
    """
    senders_E, receivers_E = tile_edges(task.senders_E, task.receivers_E, num_graphs, num_nodes)
    shards = None
    num_shards = mesh_node_shards()
    if task.example is None and num_graphs == 1 and num_shards > 1:
        # Host numpy, O(E), run once per trace of the step.
        shards = graph_ops.partition_edges(
            task.senders_E, task.receivers_E, task.num_nodes, num_shards
        )
        shards = graph_ops.EdgeShards(*map(jnp.asarray, shards))
    return graph_ops.Edges(jnp.asarray(senders_E), jnp.asarray(receivers_E), shards)


def forward(cfg, params, task: Task, x_BNF, *, rng=None, train: bool = False):
    """Model outputs [B, N, out] of B graphs sharing the task's topology (B = 1 for
    minesweeper): one apply on their disjoint union, with `task_edges`."""
    b, n = x_BNF.shape[:2]
    edges = task_edges(task, b, n)
    out_NO = model.apply(cfg, params, (x_BNF.reshape(b * n, -1), edges), rng=rng, train=train)
    return out_NO.reshape(b, n, -1)
