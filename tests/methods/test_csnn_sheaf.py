"""CSNN's sheaf (methods/csnn/sheaf.py) and graph layers (graph_ops.py) against dense matrices
built here: orthogonal Householder maps, conformal scales, the edge-list operators, the
cooperative (listen/broadcast) property and permutation equivariance. float32 against float64
references; tolerances are stated per test."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from methods.csnn import graph_ops, sheaf

D, C = 3, 2
# 7 nodes, node 6 isolated: the edge case where a degree is 0.
UNDIRECTED = [(0, 1), (0, 2), (1, 2), (2, 3), (3, 4), (4, 5), (1, 5)]
NUM_NODES = 7
ATOL = 1e-5  # float32 sums of a handful of O(1) terms


def _edges(undirected, num_nodes):
    """Both directions, sorted by receiver; with the dense adjacency for the references."""
    pairs = sorted({(s, r) for a, b in undirected for s, r in ((a, b), (b, a))}, key=lambda e: e[1])
    senders_E = jnp.array([s for s, _ in pairs], jnp.int32)
    receivers_E = jnp.array([r for _, r in pairs], jnp.int32)
    adjacency_NN = np.zeros((num_nodes, num_nodes))
    for s, r in pairs:
        adjacency_NN[r, s] = 1.0
    return senders_E, receivers_E, adjacency_NN


def _maps(key, num_nodes=NUM_NODES):
    """Random conformal T and S (scales spread around 1) and node states."""
    k_t, k_s, k_x = jax.random.split(key, 3)
    k = sheaf.num_map_params(D)
    T_NDD, cT_N = sheaf.conformal_maps(jax.random.normal(k_t, (num_nodes, k)), D)
    S_NDD, cS_N = sheaf.conformal_maps(jax.random.normal(k_s, (num_nodes, k)), D)
    x_NDC = jax.random.normal(k_x, (num_nodes, D, C))
    return T_NDD, S_NDD, cT_N, cS_N, x_NDC


GRAPH = _edges(UNDIRECTED, NUM_NODES)


@pytest.mark.parametrize("d", [2, 3, 5])
def test_householder_orthogonal_with_finite_gradients(d):
    params_NP = 3.0 * jax.random.normal(jax.random.PRNGKey(d), (16, d * (d - 1) // 2))
    q_NDD = np.asarray(sheaf.householder(params_NP, d), np.float64)
    gram_NDD = np.einsum("nji,njk->nik", q_NDD, q_NDD)
    np.testing.assert_allclose(gram_NDD, np.broadcast_to(np.eye(d), gram_NDD.shape), atol=1e-5)
    np.testing.assert_allclose(np.abs(np.linalg.det(q_NDD)), 1.0, atol=1e-5)
    # Not the identity: the parameters must reach Q (a bug dropping them would pass the above).
    assert (
        np.abs(q_NDD - np.eye(d) * np.sign(np.diagonal(q_NDD, axis1=1, axis2=2))[:, None]).max()
        > 0.1
    )
    loss = lambda p: jnp.sum(sheaf.householder(p, d) * jnp.arange(d * d).reshape(d, d))
    grad_NP = jax.grad(loss)(params_NP)
    assert np.all(np.isfinite(grad_NP)) and np.abs(grad_NP).max() > 0


def test_householder_matches_the_reflections_in_order():
    """Q = H_1 H_2 H_3 with v_k column k of I + lower(params), filled row-major."""
    params_P = np.array([0.3, -0.7, 0.5])
    a = np.eye(3)
    a[1, 0], a[2, 0], a[2, 1] = params_P
    q = np.eye(3)
    for k in range(3):
        v = a[:, k]
        q = q @ (np.eye(3) - 2.0 * np.outer(v, v) / (v @ v))
    got = sheaf.householder(jnp.asarray(params_P[None], jnp.float32), 3)[0]
    np.testing.assert_allclose(got, q, atol=1e-6)


def test_conformal_maps_scale_and_bound():
    raw_NK = jax.random.normal(jax.random.PRNGKey(1), (5, sheaf.num_map_params(D)))
    raw_NK = raw_NK.at[0, -1].set(1e4).at[1, -1].set(-3.0)  # a huge logit, and a small scale
    maps_NDD, c_N = sheaf.conformal_maps(raw_NK, D)
    gram_NDD = jnp.einsum("nji,njk->nik", maps_NDD, maps_NDD)
    np.testing.assert_allclose(gram_NDD, (c_N**2)[:, None, None] * jnp.eye(D), rtol=1e-5, atol=1e-5)
    assert float(c_N.max()) <= 10.0 + 1e-5 and float(c_N[0]) == pytest.approx(10.0, rel=1e-6)
    assert float(c_N[1]) == pytest.approx(np.exp(-3.0), rel=1e-5)

    raw_flat_NK = raw_NK[:, : sheaf.num_orth_params(D)]
    flat_NDD, ones_N = sheaf.conformal_maps(raw_flat_NK, D, conformal=False)
    np.testing.assert_array_equal(ones_N, np.ones(5))
    np.testing.assert_allclose(flat_NDD, maps_NDD / c_N[:, None, None], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError):
        sheaf.conformal_maps(raw_NK, D, conformal=False)


def test_diffusion_matches_dense_operators():
    senders_E, receivers_E, adjacency_NN = GRAPH
    T_NDD, S_NDD, cT_N, cS_N, x_NDC = _maps(jax.random.PRNGKey(2))
    a_MM, b_MM = sheaf.dense_operator(T_NDD, S_NDD, cT_N, cS_N, adjacency_NN)
    x_MC = np.asarray(x_NDC, np.float64).reshape(NUM_NODES * D, C)
    edges = graph_ops.Edges(senders_E, receivers_E)
    got_a = sheaf.operator_a(x_NDC, T_NDD, S_NDD, cT_N, edges)
    np.testing.assert_allclose(np.asarray(got_a).reshape(-1, C), a_MM @ x_MC, atol=ATOL)
    got = sheaf.diffusion(x_NDC, T_NDD, S_NDD, cT_N, cS_N, edges)
    np.testing.assert_allclose(np.asarray(got).reshape(-1, C), b_MM @ a_MM @ x_MC, atol=ATOL)
    # A and B differ (different normalisers) and are not symmetric in T, S: the check has teeth.
    assert np.abs(a_MM - b_MM).max() > 1e-2


def _diffuse(T_NDD, S_NDD, cT_N, cS_N, x_NDC):
    senders_E, receivers_E, _ = GRAPH
    edges = graph_ops.Edges(senders_E, receivers_E)
    return np.asarray(sheaf.diffusion(x_NDC, T_NDD, S_NDD, cT_N, cS_N, edges))


def test_silent_node_is_not_heard_but_still_listens():
    """S_j = 0 (scale 0): no other node's output depends on x_j; j still hears its neighbours."""
    T_NDD, S_NDD, cT_N, cS_N, x_NDC = _maps(jax.random.PRNGKey(3))
    j = 2
    S_NDD, cS_N = S_NDD.at[j].set(0.0), cS_N.at[j].set(0.0)
    base_NDC = _diffuse(T_NDD, S_NDD, cT_N, cS_N, x_NDC)
    bumped_NDC = _diffuse(T_NDD, S_NDD, cT_N, cS_N, x_NDC.at[j].add(1.0))
    others = np.arange(NUM_NODES) != j
    np.testing.assert_allclose(bumped_NDC[others], base_NDC[others], atol=1e-6)
    neighbour_bumped_NDC = _diffuse(T_NDD, S_NDD, cT_N, cS_N, x_NDC.at[3].add(1.0))
    assert np.abs(neighbour_bumped_NDC[j] - base_NDC[j]).max() > 1e-2


def test_deaf_node_hears_only_itself():
    """T_i = 0: node i's output depends on x_i alone (its scale still sets the normaliser)."""
    T_NDD, S_NDD, cT_N, cS_N, x_NDC = _maps(jax.random.PRNGKey(4))
    i = 2
    T_NDD = T_NDD.at[i].set(0.0)
    base_NDC = _diffuse(T_NDD, S_NDD, cT_N, cS_N, x_NDC)
    for neighbour in (0, 1, 3):
        bumped_NDC = _diffuse(T_NDD, S_NDD, cT_N, cS_N, x_NDC.at[neighbour].add(1.0))
        np.testing.assert_allclose(bumped_NDC[i], base_NDC[i], atol=1e-6)
        assert np.abs(bumped_NDC[neighbour] - base_NDC[neighbour]).max() > 1e-2
    self_bumped_NDC = _diffuse(T_NDD, S_NDD, cT_N, cS_N, x_NDC.at[i].add(1.0))
    assert np.abs(self_bumped_NDC[i] - base_NDC[i]).max() > 1e-2


def test_permutation_equivariance():
    T_NDD, S_NDD, cT_N, cS_N, x_NDC = _maps(jax.random.PRNGKey(5))
    base_NDC = _diffuse(T_NDD, S_NDD, cT_N, cS_N, x_NDC)
    perm_N = np.random.default_rng(0).permutation(NUM_NODES)  # new node n is old node perm_N[n]
    new_of_old_N = np.argsort(perm_N)
    relabelled = [(int(new_of_old_N[a]), int(new_of_old_N[b])) for a, b in UNDIRECTED]
    senders_E, receivers_E, _ = _edges(relabelled, NUM_NODES)
    got_NDC = sheaf.diffusion(
        x_NDC[perm_N],
        T_NDD[perm_N],
        S_NDD[perm_N],
        cT_N[perm_N],
        cS_N[perm_N],
        graph_ops.Edges(senders_E, receivers_E),
    )
    np.testing.assert_allclose(got_NDC, base_NDC[perm_N], atol=ATOL)


def test_identity_maps_give_the_psd_normalised_laplacian():
    """T = S = I, c = 1: A = I - (D + I)^-1/2 (Adj + I) (D + I)^-1/2 (kron I_d), PSD."""
    _, _, adjacency_NN = GRAPH
    eye_NDD = jnp.broadcast_to(jnp.eye(D), (NUM_NODES, D, D))
    ones_N = jnp.ones(NUM_NODES)
    a_MM, b_MM = sheaf.dense_operator(eye_NDD, eye_NDD, ones_N, ones_N, adjacency_NN)
    inv_sqrt_N = 1.0 / np.sqrt(adjacency_NN.sum(1) + 1.0)
    lap_NN = (
        np.eye(NUM_NODES) - inv_sqrt_N[:, None] * (adjacency_NN + np.eye(NUM_NODES)) * inv_sqrt_N
    )
    expected_MM = np.kron(lap_NN, np.eye(D))
    np.testing.assert_allclose(a_MM, expected_MM, atol=1e-12)
    np.testing.assert_allclose(b_MM, expected_MM, atol=1e-12)
    assert np.linalg.eigvalsh(a_MM).min() >= -1e-5
    # The edge-list operator agrees with that Laplacian too.
    senders_E, receivers_E, _ = GRAPH
    x_NDC = jax.random.normal(jax.random.PRNGKey(6), (NUM_NODES, D, C))
    got = sheaf.operator_a(x_NDC, eye_NDD, eye_NDD, ones_N, graph_ops.Edges(senders_E, receivers_E))
    want = expected_MM @ np.asarray(x_NDC, np.float64).reshape(-1, C)
    np.testing.assert_allclose(np.asarray(got).reshape(-1, C), want, atol=ATOL)


def test_gcn_and_sage_match_dense():
    senders_E, receivers_E, adjacency_NN = GRAPH
    k_x, k_g, k_s = jax.random.split(jax.random.PRNGKey(7), 3)
    x_NF = jax.random.normal(k_x, (NUM_NODES, 4))
    x64_NF = np.asarray(x_NF, np.float64)
    edges = graph_ops.Edges(senders_E, receivers_E)
    np.testing.assert_array_equal(graph_ops.degree(edges, NUM_NODES), adjacency_NN.sum(1))

    gcn = graph_ops.init_gcn(k_g, 4, 5)
    gcn["b"] = jnp.arange(5.0)  # a nonzero bias, so dropping it fails
    got = graph_ops.gcn_layer(gcn, x_NF, edges, NUM_NODES)
    a_hat_NN = adjacency_NN + np.eye(NUM_NODES)
    inv_sqrt_N = 1.0 / np.sqrt(a_hat_NN.sum(1))
    want = (inv_sqrt_N[:, None] * a_hat_NN * inv_sqrt_N) @ x64_NF @ np.asarray(
        gcn["w"]
    ) + np.arange(5)
    np.testing.assert_allclose(got, want, atol=ATOL)

    sage = graph_ops.init_sage(k_s, 4, 5)
    sage["b"] = jnp.arange(5.0)
    got = graph_ops.sage_layer(sage, x_NF, edges, NUM_NODES)
    mean_NN = adjacency_NN / np.maximum(adjacency_NN.sum(1, keepdims=True), 1.0)
    want = (
        x64_NF @ np.asarray(sage["w_self"])
        + mean_NN @ x64_NF @ np.asarray(sage["w_neigh"])
        + np.arange(5)
    )
    np.testing.assert_allclose(got, want, atol=ATOL)


def test_nsd_laplacian_matches_dense_and_is_psd():
    """One map per (node, edge) incidence; the reverse edge carries the same maps swapped."""
    senders_E, receivers_E, _ = GRAPH
    rng = np.random.default_rng(8)
    incidence = {}  # (node, undirected edge) -> F
    for a, b in UNDIRECTED:
        for node in (a, b):
            incidence[node, (a, b)] = rng.normal(size=(D, D))
    key_of = lambda s, r: (min(s, r), max(s, r))
    pairs = list(zip(senders_E.tolist(), receivers_E.tolist(), strict=True))
    src = np.stack([incidence[s, key_of(s, r)] for s, r in pairs])
    dst = np.stack([incidence[r, key_of(s, r)] for s, r in pairs])

    lap = np.zeros((NUM_NODES, NUM_NODES, D, D))
    for (node, (a, b)), f in incidence.items():
        other = b if node == a else a
        lap[node, node] += f.T @ f
        lap[node, other] -= f.T @ incidence[other, (a, b)]
    inv_sqrt = np.zeros_like(lap[:, 0])
    for n in range(NUM_NODES):
        w, v = np.linalg.eigh(lap[n, n])
        inv_sqrt[n] = (v / np.sqrt(np.maximum(w, 1e-6))) @ v.T
    delta = np.einsum("iab,ijbc,jcd->iajd", inv_sqrt, lap, inv_sqrt).reshape(NUM_NODES * D, -1)
    assert np.linalg.eigvalsh(delta).min() >= -1e-5

    x_NDC = jax.random.normal(jax.random.PRNGKey(9), (NUM_NODES, D, C))
    got = sheaf.nsd_laplacian_apply(
        x_NDC,
        jnp.asarray(src, jnp.float32),
        jnp.asarray(dst, jnp.float32),
        graph_ops.Edges(senders_E, receivers_E),
    )
    want = delta @ np.asarray(x_NDC, np.float64).reshape(-1, C)
    np.testing.assert_allclose(np.asarray(got).reshape(-1, C), want, atol=1e-4)
