"""CSNN datasets (methods/csnn/data.py): Minesweeper, barbell, Tree-NeighborsMatch, batching.

Properties are recomputed independently of data.py where possible (neighbour-mine counts by a
dense 2-D convolution, tree depths by BFS), so a wrong construction cannot check itself.
"""

from collections import deque

import numpy as np
import pytest
from scipy.signal import convolve2d

from methods.csnn import data

SIDE = 100


@pytest.fixture(scope="module")
def mines():
    return data.minesweeper(seed=0, side=SIDE)


def _assert_well_formed(g: data.Graph):
    """Sorted by (receiver, sender), no duplicates, no self loops, symmetric, int32."""
    assert g.senders_E.dtype == np.int32 and g.receivers_E.dtype == np.int32
    key_E = g.receivers_E.astype(np.int64) * g.num_nodes + g.senders_E
    assert np.all(np.diff(key_E) > 0)  # strictly increasing: sorted and duplicate-free
    assert not np.any(g.senders_E == g.receivers_E)
    # Symmetric iff the reversed edges are the same set; a dense [N, N] check costs 400 MB and
    # 4 s at N = 10^4, so it runs only on small graphs.
    np.testing.assert_array_equal(
        np.sort(g.senders_E.astype(np.int64) * g.num_nodes + g.receivers_E), key_E
    )
    if g.num_nodes <= 1000:
        a_NN = data.dense_adjacency(g)
        np.testing.assert_array_equal(a_NN, a_NN.T)


def test_undirected_symmetrises_dedupes_and_sorts():
    senders_E, receivers_E = data.undirected(np.array([[2, 0], [0, 2], [1, 1], [0, 1]]), 3)
    np.testing.assert_array_equal(receivers_E, [0, 0, 1, 2])
    np.testing.assert_array_equal(senders_E, [1, 2, 0, 0])


def test_minesweeper_edges_and_degrees(mines):
    assert mines.num_nodes == SIDE * SIDE
    assert mines.senders_E.size == 2 * 39_402
    _assert_well_formed(mines)
    degree_HW = np.bincount(mines.receivers_E, minlength=mines.num_nodes).reshape(SIDE, SIDE)
    corners = degree_HW[[0, 0, -1, -1], [0, -1, 0, -1]]
    assert np.all(corners == 3)
    border = np.concatenate([degree_HW[0, 1:-1], degree_HW[-1, 1:-1]])
    border = np.concatenate([border, degree_HW[1:-1, 0], degree_HW[1:-1, -1]])
    assert np.all(border == 5)
    assert np.all(degree_HW[1:-1, 1:-1] == 8)


def test_minesweeper_features_match_convolved_counts(mines):
    mine_HW = mines.y_N.reshape(SIDE, SIDE)
    assert mines.y_N.sum() == round(0.2 * mines.num_nodes)
    kernel = np.ones((3, 3))
    kernel[1, 1] = 0  # a node's own mine is not among its neighbours
    count_N = convolve2d(mine_HW, kernel, mode="same").ravel().astype(int)
    revealed_N = mines.x_NF[:, 9] == 0
    assert revealed_N.mean() == pytest.approx(0.5, abs=1e-3)
    assert np.all(mines.x_NF.sum(1) == 1)  # exactly one hot column per node
    np.testing.assert_array_equal(mines.x_NF[revealed_N, :9].argmax(1), count_N[revealed_N])
    # Both mines and safe cells get revealed (the choice ignores the label).
    assert 0 < mines.y_N[revealed_N].mean() < 1


def test_minesweeper_is_seeded():
    a, b, c = (data.minesweeper(seed=s, side=10) for s in (1, 1, 2))
    _assert_well_formed(a)  # small enough for the dense symmetry check
    np.testing.assert_array_equal(a.x_NF, b.x_NF)
    np.testing.assert_array_equal(a.y_N, b.y_N)
    assert not np.array_equal(a.y_N, c.y_N)


def test_splits_partition_and_seeding():
    n = SIDE * SIDE
    split_list = data.minesweeper_splits(seed_graph=0, side=SIDE)
    assert len(split_list) == 10
    for train, val, test in split_list:
        assert (len(train), len(val), len(test)) == (n // 2, n // 4, n // 4)
        np.testing.assert_array_equal(np.sort(np.concatenate([train, val, test])), np.arange(n))
    assert not np.array_equal(split_list[0][0], split_list[1][0])
    again = data.minesweeper_splits(seed_graph=0, num_splits=2, side=SIDE)
    for a, b in zip(split_list[:2], again, strict=True):
        for part_a, part_b in zip(a, b, strict=True):
            np.testing.assert_array_equal(part_a, part_b)
    assert not np.array_equal(data.splits(n, 3)[0], data.splits(n, 4)[0])


@pytest.mark.parametrize("normalise", [True, False])
def test_barbell_structure_and_targets(normalise):
    n, f = 6, 3
    g = data.barbell(np.random.default_rng(0), clique_size=n, features=f, normalise=normalise)
    assert g.num_nodes == 2 * n and g.x_NF.shape == (2 * n, f) and g.y_N.shape == (2 * n, f)
    assert g.senders_E.size == 2 * (n * (n - 1) + 1)
    _assert_well_formed(g)
    a_NN = data.dense_adjacency(g)
    assert a_NN[n - 1, n] == 1 and a_NN[:n, n:].sum() == 1  # the single bridge
    bound = 1.0 if normalise else np.sqrt(72.0)
    assert np.all((g.x_NF[:n] <= 0) & (g.x_NF[:n] >= -bound))
    assert np.all((g.x_NF[n:] >= 0) & (g.x_NF[n:] <= bound))
    np.testing.assert_allclose(g.y_N[:n], np.broadcast_to(g.x_NF[n:].mean(0), (n, f)), rtol=1e-6)
    np.testing.assert_allclose(g.y_N[n:], np.broadcast_to(g.x_NF[:n].mean(0), (n, f)), rtol=1e-6)


@pytest.mark.parametrize("normalise", [True, False])
def test_constant_baseline_matches_monte_carlo(normalise):
    n, f, draws = 6, 3, 5000
    rng = np.random.default_rng(1)
    half = 0.5 if normalise else np.sqrt(72.0) / 2
    err = []
    for _ in range(draws):
        g = data.barbell(rng, clique_size=n, features=f, normalise=normalise)
        pred_NF = np.concatenate([np.full((n, f), half), np.full((n, f), -half)])
        err.append(np.mean((g.y_N - pred_NF) ** 2))
    # Each graph gives 2 f = 6 independent near-Gaussian squared errors (relative std ~sqrt 2),
    # so the estimate's relative std is ~sqrt(2 / 30000) = 0.8 %; 5 % is ~6 sigma, yet a missing
    # 1/n (x6) or normalisation (x72) is far outside it.
    exact = data.constant_baseline_mse(n, f, normalise)
    assert np.mean(err) == pytest.approx(exact, rel=0.05)


def _bfs_depth(g: data.Graph, source: int) -> np.ndarray:
    depth_N = np.full(g.num_nodes, -1)
    depth_N[source] = 0
    queue = deque([source])
    while queue:
        u = queue.popleft()
        for v in g.senders_E[g.receivers_E == u]:
            if depth_N[v] < 0:
                depth_N[v] = depth_N[u] + 1
                queue.append(v)
    return depth_N


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_tree_neighbors_match(depth):
    g = data.tree_neighbors_match(np.random.default_rng(depth), depth)
    n_leaves = 2**depth
    assert g.num_nodes == 2 ** (depth + 1) - 1 and g.x_NF.dtype == np.int32
    assert g.senders_E.size == 2 * (g.num_nodes - 1)
    _assert_well_formed(g)
    leaf_N = g.x_NF[:, 0] == data.NODE_LEAF
    assert leaf_N.sum() == n_leaves and g.x_NF[0, 0] == data.NODE_ROOT
    np.testing.assert_array_equal(np.sort(g.x_NF[leaf_N, 1]), np.arange(n_leaves))
    np.testing.assert_array_equal(np.sort(g.x_NF[leaf_N, 2]), np.arange(n_leaves))
    assert np.all(g.x_NF[~leaf_N, 2] == data.ABSENT)
    match = np.flatnonzero(leaf_N & (g.x_NF[:, 1] == g.x_NF[0, 1]))
    assert match.size == 1 and g.y_N[0] == g.x_NF[match[0], 2]
    assert np.all(g.y_N[1:] == data.ABSENT)
    depth_N = _bfs_depth(g, 0)
    assert np.all(depth_N[leaf_N] == depth) and np.all(depth_N[~leaf_N] < depth)


def test_tree_queries_vary_with_rng():
    rng = np.random.default_rng(0)
    roots = {tuple(data.tree_neighbors_match(rng, 3).x_NF[0]) for _ in range(20)}
    assert len(roots) > 1


def test_batch_offsets_edges_and_roots():
    rng = np.random.default_rng(0)
    graphs = [data.tree_neighbors_match(rng, d) for d in (2, 3, 1)]
    merged, roots_G = data.batch(graphs)
    np.testing.assert_array_equal(roots_G, [0, 7, 22])
    assert merged.num_nodes == 7 + 15 + 3 and merged.senders_E.dtype == np.int32
    _assert_well_formed(merged)
    np.testing.assert_array_equal(merged.y_N[roots_G], [g.y_N[0] for g in graphs])
    a_NN = data.dense_adjacency(merged)
    for g, o in zip(graphs, roots_G, strict=True):
        block = a_NN[o : o + g.num_nodes, o : o + g.num_nodes]
        np.testing.assert_array_equal(block, data.dense_adjacency(g))
    assert a_NN.sum() == sum(data.dense_adjacency(g).sum() for g in graphs)  # no cross edges


@pytest.mark.parametrize("depth", [1, 3])
def test_benchmark_tree_edges_point_child_to_parent(depth):
    """The benchmark's trees send messages up only: one edge per non-root node, from it to its
    parent (heap order: (i - 1) // 2). Undirected edges (2 per node) or reversed ones (parent
    to child) fail here."""
    g = data.tree_neighbors_match(np.random.default_rng(0), depth, edges="child_to_parent")
    assert g.senders_E.dtype == np.int32 and g.receivers_E.dtype == np.int32
    np.testing.assert_array_equal(np.sort(g.senders_E), np.arange(1, g.num_nodes))
    np.testing.assert_array_equal(g.receivers_E, (g.senders_E - 1) // 2)
    key_E = g.receivers_E.astype(np.int64) * g.num_nodes + g.senders_E
    assert np.all(np.diff(key_E) > 0)  # sorted by receiver, as the segment sums need
    assert 0 not in g.senders_E  # the root sends nothing; leaves receive nothing
    leaves = np.flatnonzero(g.x_NF[:, 0] == data.NODE_LEAF)
    assert not np.isin(leaves, g.receivers_E).any()
    # The same tree edges as the undirected graph, one direction of each.
    u = data.tree_neighbors_match(np.random.default_rng(0), depth)
    up_E = u.receivers_E < u.senders_E
    np.testing.assert_array_equal(np.sort(u.senders_E[up_E]), np.sort(g.senders_E))


def test_benchmark_tree_split_sizes_keys_and_balance():
    """The benchmark's dataset: every (label permutation, query) pair, 80 % to train
    (depth 2: all 4! permutations x 4 queries = 96 trees, 77 train; depth 3: 1000 distinct
    permutations x 8 = 8000, 6400 train), disjoint, each label equally often overall."""
    train2, test2 = data.benchmark_tree_split(np.random.default_rng(0), 2)
    assert (len(train2), len(test2)) == (77, 19)
    train3, test3 = data.benchmark_tree_split(np.random.default_rng(0), 3)
    assert (len(train3), len(test3)) == (6400, 1600)
    pairs = {(tuple(p), q) for p, q in train3 + test3}
    assert len(pairs) == 8000 and len({p for p, _ in pairs}) == 1000
    labels = np.bincount([p[q] for p, q in pairs], minlength=8)
    np.testing.assert_array_equal(labels, 1000)
    g = data.tree_graph(3, np.arange(8), np.array(train3[0][0]), train3[0][1], "child_to_parent")
    np.testing.assert_array_equal(g.x_NF[7:, 1], np.arange(8))  # keys by leaf position
    assert g.y_N[0] == train3[0][0][train3[0][1]]
