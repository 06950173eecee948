"""Edge-list graph primitives: segment-sum aggregation, degrees, GCN and GraphSAGE layers.

Graphs are edge lists holding both directions of every undirected edge, sorted by receiver, so
that every aggregation is one `jax.ops.segment_sum(..., indices_are_sorted=True)`; messages flow
sender j -> receiver i. No dense adjacency is built here (tests build their own).

    agg_NF = aggregate(msg_EF, receivers_E, num_nodes)
    deg_N = degree(receivers_E, num_nodes)
    h_NH = gcn_layer(init_gcn(key, F, H), x_NF, senders_E, receivers_E, num_nodes)
    h_NH = sage_layer(init_sage(key, F, H), x_NF, senders_E, receivers_E, num_nodes)
"""

import jax
import jax.numpy as jnp


def aggregate(messages_E, receivers_E, num_nodes: int):
    """Sum per-edge messages [E, ...] at their receivers -> [num_nodes, ...]."""
    return jax.ops.segment_sum(
        messages_E, receivers_E, num_segments=num_nodes, indices_are_sorted=True
    )


def degree(receivers_E, num_nodes: int):
    """Number of neighbours of each node (float32; both edge directions are listed)."""
    return aggregate(jnp.ones(receivers_E.shape, jnp.float32), receivers_E, num_nodes)


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


def gcn_layer(params: dict, x_NF, senders_E, receivers_E, num_nodes: int):
    """D^-1/2 (A + I) D^-1/2 X W (+ b), D = deg + 1 (the self loop), without materialising A + I."""
    xw_NH = x_NF @ params["w"]
    inv_sqrt_N = jax.lax.rsqrt(degree(receivers_E, num_nodes) + 1.0)
    # The sender's factor goes on before the gather, the receiver's after the sum.
    scaled_NH = xw_NH * inv_sqrt_N[:, None]
    neigh_NH = aggregate(scaled_NH[senders_E], receivers_E, num_nodes)
    return _add_bias(params, (neigh_NH + scaled_NH) * inv_sqrt_N[:, None])


def sage_layer(params: dict, x_NF, senders_E, receivers_E, num_nodes: int):
    """x_i W_self + mean_{j in N(i)} x_j W_neigh (+ b); an isolated node's mean is 0."""
    deg_N = degree(receivers_E, num_nodes)
    sum_NF = aggregate(x_NF[senders_E], receivers_E, num_nodes)
    mean_NF = sum_NF / jnp.maximum(deg_N, 1.0)[:, None]
    return _add_bias(params, x_NF @ params["w_self"] + mean_NF @ params["w_neigh"])
