"""CSNN's conformal sheaf: Householder maps, conformal scales and the two normalised operators.

Every node i has a target (listen) map T_i and a source (broadcast) map S_i, both conformal:
c Q with Q orthogonal, so T_i^T T_i = c_i^2 I and the sheaf's degree blocks are scalars,
D_i^T = deg_i (c_i^T)^2 and D_i^S = deg_i (c_i^S)^2. One layer's diffusion is B(A(X)):

    (A X)_i = D_i^T / (D_i^T + 1) X_i - sum_{j in N(i)} T_i^T S_j X_j / sqrt((D_i^T + 1)(D_j^T + 1))
    (B Y)_i = D_i^S / (D_i^S + 1) Y_i - sum_{j in N(i)} T_i^T S_j Y_j / sqrt((D_i^S + 1)(D_j^S + 1))

(as the official code's two `propagate` calls). Node j broadcasts only through S_j and node i
listens only through T_i, so S_j = 0 silences j and T_i = 0 deafens i: the cooperative part.

    raw_NK -> conformal_maps(raw_NK, d) -> (T_NDD, cT_N); the same for (S_NDD, cS_N)
    y_NDC = diffusion(x_NDC, T_NDD, S_NDD, cT_N, cS_N, edges)   # edges: graph_ops.Edges
    A_MM, B_MM = dense_operator(T_NDD, S_NDD, cT_N, cS_N, adjacency_NN)   # tests only, M = N d
"""

import jax.numpy as jnp
import numpy as np

from methods.csnn.graph_ops import Edges, aggregate, degree, gather_sum

MAX_LOG_SCALE = float(np.log(10.0))


def num_orth_params(d: int) -> int:
    """Parameters of one d x d Householder map: the strictly lower triangle."""
    return d * (d - 1) // 2


def num_map_params(d: int, conformal: bool = True) -> int:
    """Columns `conformal_maps` expects: the Householder parameters, plus the scale logit."""
    return num_orth_params(d) + int(conformal)


def _reflectors(params_NP, d: int):
    """A = I + strictly-lower(params), filled row-major (as `torch.tril_indices(offset=-1)`)."""
    rows, cols = np.tril_indices(d, k=-1)
    lower_NDD = jnp.zeros(params_NP.shape[:1] + (d, d), params_NP.dtype)
    lower_NDD = lower_NDD.at[:, rows, cols].set(params_NP)
    return lower_NDD + jnp.eye(d, dtype=params_NP.dtype)


def householder(params_NP, d: int):
    """Q = H_1 ... H_d, H_k = I - 2 v_k v_k^T / |v_k|^2 with v_k column k of the reflector matrix.

    An explicit product: `jax.lax.linalg.householder_product` has no autodiff rule. Each v_k has
    a unit entry at k, so |v_k| >= 1 and the division is safe. Returns [N, d, d] orthogonal.
    """
    if params_NP.shape[-1] != num_orth_params(d):
        raise ValueError(
            f"householder: {params_NP.shape[-1]} params, d={d} needs {num_orth_params(d)}"
        )
    v_NDK = _reflectors(params_NP, d)
    q_NDD = jnp.broadcast_to(jnp.eye(d, dtype=params_NP.dtype), v_NDK.shape)
    for k in range(d):
        v_ND = v_NDK[:, :, k]
        # Q H_k = Q - 2 (Q v)(v^T) / |v|^2: right-multiplying keeps the order H_1 ... H_d.
        qv_ND = jnp.einsum("nij,nj->ni", q_NDD, v_ND)
        coef_N = 2.0 / jnp.sum(v_ND * v_ND, axis=-1)
        q_NDD = q_NDD - coef_N[:, None, None] * qv_ND[:, :, None] * v_ND[:, None, :]
    return q_NDD


def conformal_maps(raw_NK, d: int, conformal: bool = True):
    """(maps_NDD = c Q, scale_N = c) from a sheaf learner's raw outputs.

    conformal: K = d(d-1)/2 + 1; tanh of the first columns are the Householder parameters and the
    last is a logit r with c = exp(min(r, ln 10)) in (0, 10]. conformal=False: K = d(d-1)/2 (no
    scale column, as the official ablation) and c = 1.
    """
    expected = num_map_params(d, conformal)
    if raw_NK.shape[-1] != expected:
        raise ValueError(f"conformal_maps: {raw_NK.shape[-1]} columns, expected {expected}")
    q_NDD = householder(jnp.tanh(raw_NK[:, : num_orth_params(d)]), d)
    if conformal:
        scale_N = jnp.exp(jnp.minimum(raw_NK[:, -1], MAX_LOG_SCALE))
    else:
        scale_N = jnp.ones(raw_NK.shape[:1], raw_NK.dtype)
    return scale_N[:, None, None] * q_NDD, scale_N


def normalised_step(x_NDC, T_NDD, S_NDD, diag_N, edges: Edges):
    """(M X)_i = D_i/(D_i+1) X_i - T_i^T sum_{j in N(i)} S_j X_j / sqrt((D_i+1)(D_j+1)).

    S_j X_j is formed once per node before the gather (E >> N), and T_i^T, being the receiver's,
    is applied once after the segment sum (`gather_sum`, node-sharded when `edges.shards` is).
    """
    num_nodes = x_NDC.shape[0]
    inv_sqrt_N = 1.0 / jnp.sqrt(diag_N + 1.0)
    sent_NDC = jnp.einsum("nij,njc->nic", S_NDD, x_NDC) * inv_sqrt_N[:, None, None]
    summed_NDC = gather_sum(sent_NDC, edges, num_nodes)
    heard_NDC = jnp.einsum("nji,njc->nic", T_NDD, summed_NDC) * inv_sqrt_N[:, None, None]
    return (diag_N / (diag_N + 1.0))[:, None, None] * x_NDC - heard_NDC


def operator_a(x_NDC, T_NDD, S_NDD, cT_N, edges: Edges):
    """A: normalised by the target maps' degrees D^T = deg c_T^2."""
    diag_N = degree(edges, x_NDC.shape[0]) * cT_N**2
    return normalised_step(x_NDC, T_NDD, S_NDD, diag_N, edges)


def operator_b(y_NDC, T_NDD, S_NDD, cS_N, edges: Edges):
    """B: normalised by the source maps' degrees D^S = deg c_S^2."""
    diag_N = degree(edges, y_NDC.shape[0]) * cS_N**2
    return normalised_step(y_NDC, T_NDD, S_NDD, diag_N, edges)


def diffusion(x_NDC, T_NDD, S_NDD, cT_N, cS_N, edges: Edges):
    """B(A(X)): one CSNN layer's sheaf diffusion, before its weights and nonlinearity."""
    y_NDC = operator_a(x_NDC, T_NDD, S_NDD, cT_N, edges)
    return operator_b(y_NDC, T_NDD, S_NDD, cS_N, edges)


def _dense_step(T_NDD, S_NDD, diag_N, adjacency_NN):
    n, d = T_NDD.shape[:2]
    inv_sqrt_N = 1.0 / np.sqrt(diag_N + 1.0)
    blocks_NNDD = np.einsum("iab,jac->ijbc", T_NDD, S_NDD)  # T_i^T S_j
    blocks_NNDD *= (adjacency_NN * np.outer(inv_sqrt_N, inv_sqrt_N))[:, :, None, None]
    diag_NNDD = np.einsum("i,ij,bc->ijbc", diag_N / (diag_N + 1.0), np.eye(n), np.eye(d))
    return (diag_NNDD - blocks_NNDD).transpose(0, 2, 1, 3).reshape(n * d, n * d)


def dense_operator(T_NDD, S_NDD, cT_N, cS_N, adjacency_NN):
    """(A, B) as dense (N d) x (N d) float64 matrices on X_NDC.reshape(N d, C). Tests only."""
    T_NDD, S_NDD = np.asarray(T_NDD, np.float64), np.asarray(S_NDD, np.float64)
    adjacency_NN = np.asarray(adjacency_NN, np.float64)
    deg_N = adjacency_NN.sum(axis=1)
    a_MM = _dense_step(T_NDD, S_NDD, deg_N * np.asarray(cT_N, np.float64) ** 2, adjacency_NN)
    b_MM = _dense_step(T_NDD, S_NDD, deg_N * np.asarray(cS_N, np.float64) ** 2, adjacency_NN)
    return a_MM, b_MM


def _inv_sqrt_psd(m_NDD, eps: float):
    """M^-1/2 of symmetric PSD blocks; eigenvalues clipped at eps (an isolated node's D is 0)."""
    w_ND, v_NDD = jnp.linalg.eigh(m_NDD)
    return jnp.einsum("nij,nj,nkj->nik", v_NDD, 1.0 / jnp.sqrt(jnp.maximum(w_ND, eps)), v_NDD)


def nsd_laplacian_apply(x_NDC, F_src_EDD, F_dst_EDD, edges: Edges, eps: float = 1e-6):
    """NSD baseline: Delta X = D^-1/2 L_F D^-1/2 X with one map per (node, edge) incidence.

    For directed edge e = (j -> i): F_dst_EDD[e] = F_{i<e} (the receiver's), F_src_EDD[e] =
    F_{j<e}; the reverse edge must carry the same two maps swapped, which makes L_F symmetric.
    (L_F X)_i = sum_e F_{i<e}^T F_{i<e} X_i - F_{i<e}^T F_{j<e} X_j; D is L_F's block diagonal.
    The messages depend on the edge, so this is always the plain edge-list path (`edges.shards`
    is not used; under a mesh XLA partitions it).
    """
    num_nodes = x_NDC.shape[0]
    senders_E, receivers_E = edges.senders_E, edges.receivers_E
    diag_NDD = aggregate(jnp.einsum("eki,ekj->eij", F_dst_EDD, F_dst_EDD), receivers_E, num_nodes)
    inv_sqrt_NDD = _inv_sqrt_psd(diag_NDD, eps)
    y_NDC = jnp.einsum("nij,njc->nic", inv_sqrt_NDD, x_NDC)
    off_EDC = jnp.einsum("eki,ekl,elc->eic", F_dst_EDD, F_src_EDD, y_NDC[senders_E])
    lap_NDC = jnp.einsum("nij,njc->nic", diag_NDD, y_NDC) - aggregate(
        off_EDC, receivers_E, num_nodes
    )
    return jnp.einsum("nij,njc->nic", inv_sqrt_NDD, lap_NDC)
