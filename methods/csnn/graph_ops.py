"""Edge-list graph primitives: gather-sums, degrees, GCN and GraphSAGE layers, and their
receiver-partitioned form for a node set sharded over the mesh.

Graphs are edge lists holding both directions of every undirected edge, sorted by receiver, so
that every aggregation is one `jax.ops.segment_sum(..., indices_are_sorted=True)`; messages flow
sender j -> receiver i. No dense adjacency is built here (tests build their own). An `Edges`
carries the global lists and, optionally, `EdgeShards`: the same edges split by the node shard
that owns their receiver. With shards and a multi-device mesh in context (`core.train` traces
the step under it), `gather_sum` and `degree` run under `jax.shard_map` over the mesh's data
axes: each device all-gathers the node values (N rows, the halo exchange) and sums only its own
receivers' edges, instead of XLA all-reducing an [E, ...] message array. Otherwise they are the
plain segment sums.

    edges = Edges(senders_E, receivers_E)                        # or shards=partition_edges(...)
    agg_NF = gather_sum(x_NF, edges, num_nodes)       # sum_{e: r_e = i} x[s_e]
    agg_NF = aggregate(msg_EF, edges.receivers_E, num_nodes)     # per-edge messages (NSD)
    deg_N = degree(edges, num_nodes)
    h_NH = gcn_layer(init_gcn(key, F, H), x_NF, edges, num_nodes)
    h_NH = sage_layer(init_sage(key, F, H), x_NF, edges, num_nodes)
"""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from core.errors import ConfigError
from core.mesh import data_axes


class EdgeShards(NamedTuple):
    """Edges split by receiver over P node shards of n_p = N / P nodes (shard p owns nodes
    p n_p .. (p + 1) n_p - 1): row p holds the edges whose receiver shard p owns, receiver-sorted,
    senders as global ids, receivers as local ids (receiver - p n_p); padded to the largest
    shard's count E_max with sender 0 and local receiver n_p, a dropped extra segment.
    Both [P, E_max] int32."""

    senders_PE: jax.Array
    receivers_PE: jax.Array


class Edges(NamedTuple):
    """A graph's directed edges (a pytree): the global receiver-sorted lists [E], and `shards`
    (None, or their `partition_edges` split for a node-sharded gather_sum)."""

    senders_E: jax.Array
    receivers_E: jax.Array
    shards: EdgeShards | None = None


def partition_edges(senders_E, receivers_E, num_nodes: int, num_shards: int) -> EdgeShards:
    """Host-side (numpy) split of receiver-sorted edges over `num_shards` equal node shards."""
    if num_shards < 1 or num_nodes % num_shards:
        raise ConfigError(
            f"partition_edges: {num_nodes} nodes do not divide into {num_shards} equal shards"
        )
    senders_E, receivers_E = np.asarray(senders_E), np.asarray(receivers_E)
    n_p = num_nodes // num_shards
    # receivers are sorted, so each shard's edges are one contiguous run
    bounds = np.searchsorted(receivers_E, np.arange(num_shards + 1) * n_p, side="left")
    counts = np.diff(bounds)
    e_max = max(int(counts.max()), 1)
    senders_PE = np.zeros((num_shards, e_max), np.int32)
    receivers_PE = np.full((num_shards, e_max), n_p, np.int32)
    for p in range(num_shards):
        run = slice(bounds[p], bounds[p + 1])
        senders_PE[p, : counts[p]] = senders_E[run]
        receivers_PE[p, : counts[p]] = receivers_E[run] - p * n_p
    return EdgeShards(senders_PE, receivers_PE)


def aggregate(messages_E, receivers_E, num_nodes: int):
    """Sum per-edge messages [E, ...] at their receivers -> [num_nodes, ...]."""
    return jax.ops.segment_sum(
        messages_E, receivers_E, num_segments=num_nodes, indices_are_sorted=True
    )


def _sharded_mesh(shards: EdgeShards | None):
    """(mesh, data axes) when `shards` is set and a mesh whose data axes span > 1 device is in
    context, else None: the caller then takes the plain path."""
    if shards is None:
        return None
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return None
    axes = data_axes(mesh)
    size = math.prod(mesh.shape[a] for a in axes)
    if size == 1:
        return None
    if size != shards.senders_PE.shape[0]:
        raise ValueError(
            f"Edges.shards has {shards.senders_PE.shape[0]} node shards but the mesh's data "
            f"axes {axes} span {size} devices"
        )
    return mesh, axes


def gather_sum(values_N, edges: Edges, num_nodes: int):
    """For each node i, sum over edges e with receiver i of values_N[sender_e]: [num_nodes, ...].

    Plain: `aggregate(values_N[senders_E], receivers_E, num_nodes)`. With `edges.shards` under a
    multi-device mesh: shard_map over the data axes, values split on their node dimension; each
    device all-gathers the values (the halo), gathers its edges' senders and segment-sums into
    its n_p receivers plus the padding's segment, which is dropped.
    """
    sharded = _sharded_mesh(edges.shards)
    if sharded is None:
        return aggregate(values_N[edges.senders_E], edges.receivers_E, num_nodes)
    mesh, axes = sharded
    n_p = num_nodes // edges.shards.senders_PE.shape[0]

    def body(values_local, senders_1E, receivers_1E):
        values_all = jax.lax.all_gather(values_local, axes, tiled=True)
        summed = jax.ops.segment_sum(
            values_all[senders_1E[0]],
            receivers_1E[0],
            num_segments=n_p + 1,
            indices_are_sorted=True,
        )
        return summed[:n_p]

    return jax.shard_map(body, mesh=mesh, in_specs=(P(axes), P(axes), P(axes)), out_specs=P(axes))(
        values_N, edges.shards.senders_PE, edges.shards.receivers_PE
    )


def degree(edges: Edges, num_nodes: int):
    """Number of neighbours of each node (float32; both edge directions are listed); under a
    multi-device mesh with `edges.shards`, each device counts its own receivers'."""
    sharded = _sharded_mesh(edges.shards)
    if sharded is None:
        receivers_E = edges.receivers_E
        if not isinstance(receivers_E, jax.core.Tracer):
            # Concrete edges (constants of the step): counted on the host. XLA would
            # constant-fold the scatter instead, at 1-2 s of compile time per call.
            count_N = np.bincount(np.asarray(receivers_E), minlength=num_nodes)
            return jnp.asarray(count_N[:num_nodes].astype(np.float32))
        return aggregate(jnp.ones(receivers_E.shape, jnp.float32), receivers_E, num_nodes)
    mesh, axes = sharded
    n_p = num_nodes // edges.shards.receivers_PE.shape[0]

    def body(receivers_1E):
        ones_E = jnp.ones(receivers_1E.shape[1:], jnp.float32)
        return aggregate(ones_E, receivers_1E[0], n_p + 1)[:n_p]

    return jax.shard_map(body, mesh=mesh, in_specs=P(axes), out_specs=P(axes))(
        edges.shards.receivers_PE
    )


def _glorot(key, fan_in: int, fan_out: int):
    limit = jnp.sqrt(6.0 / (fan_in + fan_out))
    return jax.random.uniform(key, (fan_in, fan_out), jnp.float32, -limit, limit)


def init_dense(key, in_features: int, out_features: int, bias: bool = True) -> dict:
    """{"w": [F, H] glorot-uniform, "b": [H] zeros (when bias)}: a dense layer, and GCN's."""
    params = {"w": _glorot(key, in_features, out_features)}
    if bias:
        params["b"] = jnp.zeros((out_features,), jnp.float32)
    return params


init_gcn = init_dense  # a GCN layer's parameters are one dense layer's


def init_sage(key, in_features: int, out_features: int, bias: bool = True) -> dict:
    """{"w_self": [F, H], "w_neigh": [F, H], "b": [H] (when bias)}."""
    key_self, key_neigh = jax.random.split(key)
    params = {
        "w_self": _glorot(key_self, in_features, out_features),
        "w_neigh": _glorot(key_neigh, in_features, out_features),
    }
    if bias:
        params["b"] = jnp.zeros((out_features,), jnp.float32)
    return params


def _add_bias(params: dict, h_NH):
    return h_NH + params["b"] if "b" in params else h_NH


def gcn_layer(params: dict, x_NF, edges: Edges, num_nodes: int):
    """D^-1/2 (A + I) D^-1/2 X W (+ b), D = deg + 1 (the self loop), without materialising A + I."""
    xw_NH = x_NF @ params["w"]
    inv_sqrt_N = jax.lax.rsqrt(degree(edges, num_nodes) + 1.0)
    # The sender's factor goes on before the gather, the receiver's after the sum.
    scaled_NH = xw_NH * inv_sqrt_N[:, None]
    neigh_NH = gather_sum(scaled_NH, edges, num_nodes)
    return _add_bias(params, (neigh_NH + scaled_NH) * inv_sqrt_N[:, None])


def sage_layer(params: dict, x_NF, edges: Edges, num_nodes: int):
    """x_i W_self + mean_{j in N(i)} x_j W_neigh (+ b); an isolated node's mean is 0."""
    deg_N = degree(edges, num_nodes)
    sum_NF = gather_sum(x_NF, edges, num_nodes)
    mean_NF = sum_NF / jnp.maximum(deg_N, 1.0)[:, None]
    return _add_bias(params, x_NF @ params["w_self"] + mean_NF @ params["w_neigh"])
