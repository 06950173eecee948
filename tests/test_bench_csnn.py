"""launch.bench_csnn at tiny sizes: the layers timed are the ones the docstring names, the graphs
have the edge counts reported, and the report is complete (no timing thresholds: the numbers
depend on the machine and its load)."""

import math

import jax
import numpy as np

from launch import bench_csnn as bench
from methods.csnn import data

SIZES = (500, 2000)
NUMBERS = [
    f"{name}_{phase}_{unit}"
    for name in ("csnn", "gcn")
    for phase in ("forward", "fwd_bwd")
    for unit in ("seconds", "edges_per_s")
]
NUMBERS += ["csnn_over_gcn_forward", "csnn_over_gcn_fwd_bwd"]
NUMBERS += ["csnn_maps_seconds", "csnn_operators_seconds"]


def test_side_gives_the_nearest_king_grid():
    for side in (2, 5, 36, 113):
        exact_E = len(data.undirected(data.grid_king_edges(side), side * side)[0])
        assert bench.king_directed_edges(side) == exact_E
    for target_E in (*SIZES, *bench.SIZES):
        side = bench.side_for_edges(target_E)
        gap = abs(bench.king_directed_edges(side) - target_E)
        assert all(gap <= abs(bench.king_directed_edges(s) - target_E) for s in range(2, 400))


def test_layers_take_and_return_the_stated_shapes():
    n, edges = bench.graph(SIZES[0])
    per_model = bench.inputs(n, jax.random.key(1))
    csnn_fn, gcn_fn = bench.layer_fns()
    layer, x_NDC = per_model["csnn"]
    assert x_NDC.shape == (n, 3, 32) and len(layer["phi_t"]["layers"]) == 2
    assert layer["phi_t"]["layers"][0]["w"].shape == (96, 64)  # MLP learner on vec x_i
    out_NDC = csnn_fn(layer, x_NDC, edges)
    assert out_NDC.shape == (n, 3, 32) and np.isfinite(np.asarray(out_NDC)).all()
    layer, x_NC = per_model["gcn"]
    assert x_NC.shape == (n, 96) and layer["w"].shape == (96, 96)
    out_NC = gcn_fn(layer, x_NC, edges)
    assert out_NC.shape == (n, 96) and np.isfinite(np.asarray(out_NC)).all()


def test_report_is_complete():
    rows = bench.measure(sizes=SIZES, repeats=1)
    assert [r["target_edges"] for r in rows] == list(SIZES)
    for r in rows:
        n, edges = bench.graph(r["target_edges"])
        assert (r["nodes"], r["edges"]) == (n, len(edges.senders_E)) == (n, len(edges.receivers_E))
        assert set(r) == {"target_edges", "edges", "nodes", *NUMBERS}
        for key in NUMBERS:
            assert math.isfinite(r[key]) and r[key] > 0, key
    lines = bench.report_lines(rows)
    table_rows = [line for line in lines if line.startswith("| ") and line[2].isdigit()]
    assert [line.split(" | ")[:2] for line in table_rows] == [
        [f"| {r['edges']}", str(r["nodes"])] for r in rows
    ]
