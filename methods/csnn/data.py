"""Graph datasets for CSNN, generated exactly and offline (pure numpy, seeded; no downloads).

    g = minesweeper(seed=0)                       # 100 x 100 king-move grid, 20 % mines
    train_idx, val_idx, test_idx = minesweeper_splits(seed_graph=0)[0]
    g = barbell(np.random.default_rng(0))         # two K_6 joined by one edge, regression
    g = tree_neighbors_match(rng, depth=3)        # Alon & Yahav's bottleneck task
    g = tree_neighbors_match(rng, 3, edges="child_to_parent", keys="by_position")  # theirs
    gb, roots_G = batch([g1, g2])                 # jraph-style concatenation

Every `Graph` stores BOTH directions of each undirected edge (the benchmark's trees, with
edges="child_to_parent", one direction only), no self loops, sorted by receiver then sender,
so `jax.ops.segment_sum(m_E, receivers_E, N, indices_are_sorted=True)` is valid.
"""

import itertools
import math
from typing import NamedTuple

import numpy as np

from core.errors import ConfigError

SQRT72 = float(np.sqrt(72.0))

NODE_ROOT, NODE_INTERNAL, NODE_LEAF = 0, 1, 2
ABSENT = -1  # tree-feature id for "no key" / "no label"; models embed id + 1


class Graph(NamedTuple):
    """x_NF [N, F] (float32, or int32 ids for the tree task); senders_E, receivers_E int32 [E];
    y_N int32 [N] (classification) or float32 [N, K] (regression); num_nodes N."""

    x_NF: np.ndarray
    senders_E: np.ndarray
    receivers_E: np.ndarray
    y_N: np.ndarray
    num_nodes: int


def undirected(edges_E2: np.ndarray, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Both directions of each edge, duplicates and self loops dropped, sorted by (receiver,
    sender). Returns (senders_E, receivers_E) int32."""
    edges_E2 = np.asarray(edges_E2, dtype=np.int64).reshape(-1, 2)
    senders = np.concatenate([edges_E2[:, 0], edges_E2[:, 1]])
    receivers = np.concatenate([edges_E2[:, 1], edges_E2[:, 0]])
    keep = senders != receivers
    # One int64 key per directed edge: np.unique both deduplicates and sorts by receiver first.
    key_E = np.unique(receivers[keep] * num_nodes + senders[keep])
    return (key_E % num_nodes).astype(np.int32), (key_E // num_nodes).astype(np.int32)


def dense_adjacency(graph: Graph) -> np.ndarray:
    """A_NN[receiver, sender] = 1 (for tests; symmetric for every graph built here)."""
    a_NN = np.zeros((graph.num_nodes, graph.num_nodes), dtype=np.float32)
    a_NN[graph.receivers_E, graph.senders_E] = 1.0
    return a_NN


# --- Minesweeper -----------------------------------------------------------------------------


def grid_king_edges(side: int) -> np.ndarray:
    """Undirected king-move edges [E, 2] of a side x side grid; node id = row * side + col."""
    rc = np.arange(side * side).reshape(side, side)
    pairs = [
        (rc[:, :-1], rc[:, 1:]),  # right
        (rc[:-1, :], rc[1:, :]),  # down
        (rc[:-1, :-1], rc[1:, 1:]),  # down-right
        (rc[:-1, 1:], rc[1:, :-1]),  # down-left
    ]
    return np.concatenate([np.stack([a.ravel(), b.ravel()], axis=1) for a, b in pairs])


def minesweeper(
    seed: int, side: int = 100, mine_fraction: float = 0.2, revealed_fraction: float = 0.5
) -> Graph:
    """Platonov et al. (2023)'s Minesweeper: y = 1 for a mine (exactly round(mine_fraction N)
    mines, uniform); exactly round(revealed_fraction N) uniformly chosen nodes (mines or not)
    show their neighbour-mine count.

    Features x_NF float32 [N, 10]: columns 0..8 one-hot of the neighbour-mine count (all zero
    when unrevealed), column 9 = 1 for an unrevealed node. This carries the information of
    Platonov et al.'s release; their exact column layout may differ, so the features are not
    claimed bit-identical to theirs.
    """
    rng = np.random.default_rng(seed)
    n = side * side
    senders_E, receivers_E = undirected(grid_king_edges(side), n)
    mine_N = np.zeros(n, dtype=np.int32)
    mine_N[rng.choice(n, size=round(mine_fraction * n), replace=False)] = 1
    count_N = np.bincount(receivers_E, weights=mine_N[senders_E], minlength=n).astype(np.int64)
    revealed_N = np.zeros(n, dtype=bool)
    revealed_N[rng.choice(n, size=round(revealed_fraction * n), replace=False)] = True
    x_NF = np.zeros((n, 10), dtype=np.float32)
    x_NF[revealed_N, count_N[revealed_N]] = 1.0
    x_NF[~revealed_N, 9] = 1.0
    return Graph(x_NF, senders_E, receivers_E, mine_N, n)


def splits(
    num_nodes: int, seed, fractions: tuple[float, float, float] = (0.5, 0.25, 0.25)
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Disjoint (train_idx, val_idx, test_idx) int64 covering all nodes; test takes the
    rounding remainder. `seed`: anything np.random.default_rng accepts."""
    perm_N = np.random.default_rng(seed).permutation(num_nodes)
    n_train = round(fractions[0] * num_nodes)
    n_val = round(fractions[1] * num_nodes)
    return perm_N[:n_train], perm_N[n_train : n_train + n_val], perm_N[n_train + n_val :]


def minesweeper_splits(seed_graph: int, num_splits: int = 10, side: int = 100) -> list[tuple]:
    """The benchmark's `num_splits` random 50/25/25 splits of the graph `minesweeper(seed_graph,
    side)`; split i is seeded by (seed_graph, i), a stream distinct from the graph's own."""
    return [splits(side * side, (seed_graph, i)) for i in range(num_splits)]


# --- Barbell ---------------------------------------------------------------------------------


def barbell(
    rng: np.random.Generator, clique_size: int = 6, features: int = 3, normalise: bool = True
) -> Graph:
    """Two K_n (nodes 0..n-1 left, n..2n-1 right) joined by the edge (n-1, n). Left features
    U(-sqrt72, 0), right U(0, sqrt72) per dim; y_N3 float32 [2n, features] = the mean feature
    vector of the OTHER clique. normalise divides features and targets by sqrt72 (unnormalised
    training was measured to fail)."""
    n = clique_size
    i, j = np.triu_indices(n, k=1)
    edges_E2 = np.concatenate([np.stack([i, j], 1), np.stack([i, j], 1) + n, [[n - 1, n]]])
    senders_E, receivers_E = undirected(edges_E2, 2 * n)
    left = rng.uniform(-SQRT72, 0.0, size=(n, features))
    right = rng.uniform(0.0, SQRT72, size=(n, features))
    x_NF = np.concatenate([left, right])
    y_NF = np.concatenate(
        [
            np.repeat(right.mean(0, keepdims=True), n, 0),
            np.repeat(left.mean(0, keepdims=True), n, 0),
        ]
    )
    scale = SQRT72 if normalise else 1.0
    return Graph(
        (x_NF / scale).astype(np.float32),
        senders_E,
        receivers_E,
        (y_NF / scale).astype(np.float32),
        2 * n,
    )


def constant_baseline_mse(clique_size: int, features: int, normalise: bool) -> float:
    """Exact test MSE (mean over nodes and dims) of the best constant-per-side predictor: the
    other side's expected mean. A target is independent of its own side's features, so this is
    the variance of a mean of n uniforms of width sqrt72: (72 / 12) / n per dim, / 72 when
    normalised. `features` does not change a per-dim mean; it is kept for call symmetry."""
    del features
    var_one = 72.0 / 12.0
    return var_one / clique_size / (72.0 if normalise else 1.0)


# --- Tree-NeighborsMatch ---------------------------------------------------------------------


TREE_EDGES = ("undirected", "child_to_parent")
TREE_KEYS = ("shuffled", "by_position")


def tree_edges(depth: int, edges: str = "undirected") -> tuple[np.ndarray, np.ndarray]:
    """(senders_E, receivers_E) of the heap-ordered binary tree, sorted by receiver.
    "undirected": both directions of every tree edge. "child_to_parent": one edge per child,
    sending to its parent only, as the benchmark's code builds its trees (messages flow up to
    the root; tech-srl/bottleneck, tasks/tree_dataset.py:27-28)."""
    if edges not in TREE_EDGES:
        raise ConfigError(f"data.tree_edges={edges!r}; expected one of: {', '.join(TREE_EDGES)}")
    n = 2 ** (depth + 1) - 1
    child = np.arange(1, n)
    if edges == "undirected":
        return undirected(np.stack([(child - 1) // 2, child], 1), n)
    parent = (child - 1) // 2
    order = np.lexsort((child, parent))  # by receiver (the parent), then sender
    return child[order].astype(np.int32), parent[order].astype(np.int32)


def tree_graph(
    depth: int, key_L: np.ndarray, label_L: np.ndarray, query: int, edges: str = "undirected"
) -> Graph:
    """One Tree-NeighborsMatch tree from its leaves' keys and labels and the root's query."""
    n_leaves = 2**depth
    n = 2 * n_leaves - 1
    senders_E, receivers_E = tree_edges(depth, edges)
    x_NF = np.full((n, 3), ABSENT, dtype=np.int32)
    x_NF[:, 0] = NODE_INTERNAL
    x_NF[0, 0], x_NF[0, 1] = NODE_ROOT, query
    x_NF[n_leaves - 1 :] = np.stack([np.full(n_leaves, NODE_LEAF), key_L, label_L], 1)
    if depth == 0:  # the root is the only leaf; it stays the target and shows its query
        x_NF[0] = [NODE_ROOT, query, ABSENT]
    y_N = np.full(n, ABSENT, dtype=np.int32)
    y_N[0] = label_L[np.flatnonzero(key_L == query)[0]]
    return Graph(x_NF, senders_E, receivers_E, y_N, n)


def tree_neighbors_match(
    rng: np.random.Generator, depth: int, *, edges: str = "undirected", keys: str = "shuffled"
) -> Graph:
    """Alon & Yahav (2021)'s Tree-NeighborsMatch on a complete binary tree of depth r.

    Nodes in heap order: node 0 is the root (target), node i has children 2i+1 and 2i+2, the
    L = 2^r leaves are nodes L-1 .. 2L-2. Leaves carry distinct keys (the paper's "number of
    blue neighbours": a random permutation of 0..L-1, or with keys="by_position" leaf l's key
    is l, as the benchmark's code numbers them, tasks/dictionary_lookup.py:45-46) and distinct
    labels (a random permutation of 0..L-1); the root carries a uniform query key k and
    y_root = the label of the leaf with key k. Edges: `tree_edges(depth, edges)`.

    x_NF int32 [N, 3] integer ids for embedding: column 0 node type (0 root, 1 internal,
    2 leaf), column 1 key (the query for the root, -1 for internal nodes), column 2 label
    (-1 for root and internal nodes). y_N int32 [N]: -1 except at the root.
    """
    if keys not in TREE_KEYS:
        raise ConfigError(f"data.tree_keys={keys!r}; expected one of: {', '.join(TREE_KEYS)}")
    n_leaves = 2**depth
    key_L = rng.permutation(n_leaves) if keys == "shuffled" else np.arange(n_leaves)
    label_L = rng.permutation(n_leaves)
    query = int(rng.integers(n_leaves))
    return tree_graph(depth, key_L, label_L, query, edges)


# The benchmark's dataset (tasks/dictionary_lookup.py:18-27): up to 1000 label permutations
# (all of them when there are fewer; at most 32000 / L trees per depth above 3), each with every
# query key, so labels are balanced; 80 % of the trees train (main.py:16).
BENCH_PERMUTATIONS, BENCH_MAX_TREES, BENCH_TRAIN_FRACTION = 1000, 32000, 0.8


def benchmark_tree_split(rng: np.random.Generator, depth: int) -> tuple[list, list]:
    """The benchmark's fixed Tree-NeighborsMatch dataset as (train, test) lists of
    (label_L, query), keys by position: a shuffled 80/20 split of every (permutation, query)
    pair (the benchmark's split is stratified by label; every permutation brings each label
    once, so a shuffled split is near-balanced too)."""
    n_leaves = 2**depth
    count = min(BENCH_PERMUTATIONS, math.factorial(n_leaves))
    if depth > 3:
        count = min(count, BENCH_MAX_TREES // n_leaves)
    if count == math.factorial(n_leaves):
        perms = [np.array(p) for p in itertools.permutations(range(n_leaves))]
    else:  # distinct draws, as the benchmark's random.sample for depth <= 3
        seen: dict[tuple, np.ndarray] = {}
        while len(seen) < count:
            p = rng.permutation(n_leaves)
            seen.setdefault(tuple(p), p)
        perms = list(seen.values())
    pairs = [(p, q) for p in perms for q in range(n_leaves)]
    order = rng.permutation(len(pairs))
    n_train = round(BENCH_TRAIN_FRACTION * len(pairs))
    return [pairs[i] for i in order[:n_train]], [pairs[i] for i in order[n_train:]]


def batch(graphs) -> tuple[Graph, np.ndarray]:
    """One disjoint-union Graph (jraph style: node ids shifted by each graph's offset, so edges
    stay sorted by receiver) and offsets_G int32 [G], the first node of each graph: the roots
    of tree_neighbors_match graphs, so a loss can read y_N[offsets_G]."""
    sizes_G = np.array([g.num_nodes for g in graphs], dtype=np.int64)
    offsets_G = np.concatenate([[0], np.cumsum(sizes_G)[:-1]]).astype(np.int32)
    merged = Graph(
        np.concatenate([g.x_NF for g in graphs]),
        np.concatenate([g.senders_E + o for g, o in zip(graphs, offsets_G, strict=True)]),
        np.concatenate([g.receivers_E + o for g, o in zip(graphs, offsets_G, strict=True)]),
        np.concatenate([g.y_N for g in graphs]),
        int(sizes_G.sum()),
    )
    return merged, offsets_G
