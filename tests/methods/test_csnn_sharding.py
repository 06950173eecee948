"""Receiver-partitioned message passing (methods/csnn/graph_ops.py): `partition_edges` covers
every edge once with local receivers, `gather_sum` / `degree` under `jax.shard_map` on 8 devices
equal the plain segment sums, and the compiled 8-device Minesweeper step all-gathers node states
instead of all-reducing per-edge messages."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import methods
from configs import csnn as csnn_config
from core import train
from core.errors import ConfigError
from core.mesh import data_axes
from methods.csnn import graph_ops


def _random_graph(rng, num_nodes: int, num_undirected: int):
    """Both directions of random undirected edges (no self loops), sorted by receiver."""
    a, b = rng.integers(0, num_nodes, (2, num_undirected))
    keep = a != b
    senders = np.concatenate([a[keep], b[keep]])
    receivers = np.concatenate([b[keep], a[keep]])
    order = np.lexsort((senders, receivers))
    return senders[order].astype(np.int32), receivers[order].astype(np.int32)


def test_partition_edges_covers_every_edge_once():
    senders_E, receivers_E = _random_graph(np.random.default_rng(0), 40, 90)
    shards = graph_ops.partition_edges(senders_E, receivers_E, 40, 8)
    n_p = 5
    assert shards.senders_PE.shape == shards.receivers_PE.shape
    assert shards.senders_PE.shape[0] == 8 and shards.senders_PE.dtype == np.int32
    real_PE = shards.receivers_PE < n_p
    assert np.all((shards.receivers_PE >= 0) & (shards.receivers_PE <= n_p))
    # Padding: sender 0, local receiver n_p (the dropped segment); only at the end of each row.
    assert np.all(shards.senders_PE[~real_PE] == 0)
    assert np.all(np.diff(shards.receivers_PE, axis=1) >= 0)  # receiver-sorted, padding last
    shard_P1 = np.arange(8)[:, None]
    global_receivers = (shards.receivers_PE + shard_P1 * n_p)[real_PE]
    pairs = sorted(zip(shards.senders_PE[real_PE].tolist(), global_receivers.tolist(), strict=True))
    assert pairs == sorted(zip(senders_E.tolist(), receivers_E.tolist(), strict=True))
    assert real_PE.sum(1).max() == shards.senders_PE.shape[1]  # padded to the largest shard


def test_partition_edges_needs_equal_shards():
    senders_E, receivers_E = _random_graph(np.random.default_rng(0), 30, 40)
    with pytest.raises(ConfigError, match="30 nodes .* 8 equal shards"):
        graph_ops.partition_edges(senders_E, receivers_E, 30, 8)


def _mesh8():
    return Mesh(
        np.asarray(jax.devices()[:8]).reshape(8, 1, 1),
        ("data", "fsdp", "model"),
        axis_types=(AxisType.Auto,) * 3,
    )


def test_gather_sum_and_degree_sharded_equal_plain():
    num_nodes = 48
    senders_E, receivers_E = _random_graph(np.random.default_rng(1), num_nodes, 150)
    plain = graph_ops.Edges(jnp.asarray(senders_E), jnp.asarray(receivers_E))
    shards = graph_ops.partition_edges(senders_E, receivers_E, num_nodes, 8)
    sharded = plain._replace(shards=graph_ops.EdgeShards(*map(jnp.asarray, shards)))
    values_NDC = jax.random.normal(jax.random.PRNGKey(0), (num_nodes, 3, 4), jnp.float32)
    want_sum = graph_ops.gather_sum(values_NDC, plain, num_nodes)
    want_deg = graph_ops.degree(plain, num_nodes)
    mesh = _mesh8()
    assert data_axes(mesh) == ("data", "fsdp")

    def both(values_NDC, edges):
        return graph_ops.gather_sum(values_NDC, edges, num_nodes), graph_ops.degree(
            edges, num_nodes
        )

    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        fn = jax.jit(both, in_shardings=(NamedSharding(mesh, P(("data", "fsdp"))), None))
        jaxpr = str(jax.make_jaxpr(both)(values_NDC, sharded))
        got_sum, got_deg = fn(values_NDC, sharded)
    assert "shard_map" in jaxpr and "all_gather" in jaxpr
    # The same float32 addends per node, each node's edges summed in the same receiver-sorted
    # order; only XLA's segment-sum schedule may differ, so a few ulps of O(10) sums.
    np.testing.assert_allclose(got_sum, want_sum, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got_deg, want_deg)  # integer counts: exact
    assert np.abs(np.asarray(want_sum)).max() > 1.0  # not vacuous


def test_gather_sum_without_mesh_is_the_plain_sum():
    # Shards set but no multi-device mesh in context: the plain path, bit for bit.
    num_nodes = 16
    senders_E, receivers_E = _random_graph(np.random.default_rng(2), num_nodes, 30)
    plain = graph_ops.Edges(jnp.asarray(senders_E), jnp.asarray(receivers_E))
    sharded = plain._replace(shards=graph_ops.partition_edges(senders_E, receivers_E, num_nodes, 8))
    values_NF = jax.random.normal(jax.random.PRNGKey(1), (num_nodes, 5))
    np.testing.assert_array_equal(
        graph_ops.gather_sum(values_NF, sharded, num_nodes),
        graph_ops.gather_sum(values_NF, plain, num_nodes),
    )


def _collectives(hlo: str) -> list[tuple[str, str]]:
    """(op, result type) of every collective in compiled HLO text."""
    pattern = r"= (.+?) (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)"
    return [(m.group(2), m.group(1)) for m in re.finditer(pattern + r"(?:-start)?\(", hlo)]


def test_minesweeper_step_all_gathers_nodes_not_edge_messages():
    config = csnn_config.get_config("mesh=cpu,size=smoke")
    session = train.init(config, methods.make(config), devices=jax.devices()[:8])
    from methods.csnn import tasks

    task, _ = tasks.minesweeper_task(config.data.graph_seed, config.data.side)
    num_edges = len(task.senders_E)
    hlo = session.step.lower(session.state, session.next_batch()).compile().as_text()
    ops = _collectives(hlo)
    assert any(op == "all-gather" for op, _ in ops), ops
    edge_leading = re.compile(rf"\[{num_edges}[,\]]")
    bad = [(op, shape) for op, shape in ops if op == "all-reduce" and edge_leading.search(shape)]
    assert not bad, bad
