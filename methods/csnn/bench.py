"""CSNN layer throughput (edges/s) against a GCN layer of the same width, at 10k, 100k and 1M edges.

    python -m launch.bench --methods=csnn     # ~10k, 100k, 1M directed edges

One process; for each target edge count E*, a side x side king-move grid (`data.grid_king_edges`
+ `data.undirected`: both directions, sorted by receiver, ~8 directed edges per node) with the
side whose directed edge count is nearest E* (the actual E and N are reported). On it, each time
the median of `repeats` calls after a warm-up (which also compiles), float32, eval mode (no
dropout), freshly initialised params, random normal node states:
  1. one CSNN layer (`model.csnn_layer`): stalk d = 3, C = 32 channels (node width d C = 96),
     MLP map learners (learner="mlp", 2 layers, 64 wide), left weights, no LayerNorm, the two
     sheaf operators B(A(.)) (the model's defaults);
  2. one GCN layer (`graph_ops.gcn_layer`, the bare convolution) with C = 96, the same node
     width, so the ratio is the price of the sheaf maps at equal state size;
each jitted forward alone, and forward + backward (jax.grad of the output's sum w.r.t. the layer
params and the node states). Figures: CSNN time / GCN time, forward and forward + backward. The
JSON also has edges/s (E / seconds) and, as context, the CSNN forward split into its map
learners (`model.csnn_maps` jitted alone) and the two sheaf operators (`sheaf.diffusion` on
fixed maps).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from core.benchmark import Ratio, Result, median_seconds
from methods.csnn import data, graph_ops, model, sheaf

SIZES = (10_000, 100_000, 1_000_000)
STALK, CHANNELS = 3, 32
WIDTH = STALK * CHANNELS  # the GCN's C: the same node width as CSNN's d C
CSNN_CFG = model.ModelConfig(
    kind="csnn",
    in_features=WIDTH,
    out_features=1,
    hidden=CHANNELS,
    stalk=STALK,
    num_layers=1,
    learner="mlp",
    learner_layers=2,
    learner_hidden=64,
)
GCN_CFG = model.ModelConfig(
    kind="gcn", in_features=WIDTH, out_features=1, hidden=WIDTH, num_layers=1
)


def king_directed_edges(side: int) -> int:
    """Directed edges of a side x side king grid: 2 x (2 s (s - 1) + 2 (s - 1)^2)."""
    return 4 * (side - 1) * (2 * side - 1)


def side_for_edges(target_E: int) -> int:
    """The grid side whose directed king-edge count is nearest target_E (at least 2)."""
    approx = int((12 + np.sqrt(144 + 32 * max(target_E - 4, 0))) / 16)
    candidates = [s for s in (approx - 1, approx, approx + 1, approx + 2) if s >= 2]
    return min(candidates, key=lambda s: abs(king_directed_edges(s) - target_E))


def graph(target_E: int) -> tuple[int, graph_ops.Edges]:
    """(N, edges) of the king grid nearest target_E directed edges (plain edge lists)."""
    side = side_for_edges(target_E)
    n = side * side
    senders_E, receivers_E = data.undirected(data.grid_king_edges(side), n)
    return n, graph_ops.Edges(jnp.asarray(senders_E), jnp.asarray(receivers_E))


def layer_fns():
    """(csnn_fn, gcn_fn): (layer params, x, edges) -> the layer's output."""
    csnn_fn = functools.partial(model.csnn_layer, CSNN_CFG)

    def gcn_fn(layer, x_NC, edges):
        return graph_ops.gcn_layer(layer, x_NC, edges, x_NC.shape[0])

    return csnn_fn, gcn_fn


def inputs(n: int, key) -> dict:
    """One layer's params and node states for each model: x_NDC [N, d, C] and x_NC [N, d C]."""
    k_csnn, k_gcn, k_x = jax.random.split(key, 3)
    x_NDC = jax.random.normal(k_x, (n, STALK, CHANNELS), jnp.float32)
    return {
        "csnn": (model.init(CSNN_CFG, k_csnn)["layers"][0], x_NDC),
        "gcn": (model.init(GCN_CFG, k_gcn)["layers"][0], x_NDC.reshape(n, WIDTH)),
    }


def _grad_fn(layer_fn):
    """Forward + backward: the gradient of the output's sum w.r.t. the params and x."""
    loss = lambda layer, x, edges: layer_fn(layer, x, edges).sum()
    return jax.grad(loss, argnums=(0, 1))


def _time(fn, args, repeats: int) -> float:
    jitted = jax.jit(fn)
    return median_seconds(lambda: jax.block_until_ready(jitted(*args)), repeats)


def _split_csnn(layer, x_NDC, edges, repeats: int) -> dict:
    """The CSNN forward's parts: the map learners alone, and the two sheaf operators B(A(.))
    on fixed maps (the mixing and the residual update, both elementwise-cheap, are left out)."""
    maps_fn = functools.partial(model.csnn_maps, CSNN_CFG)
    maps = jax.jit(maps_fn)(layer, x_NDC, edges)
    mixed_NDC = model.mix_channels(layer, x_NDC)
    return {
        "csnn_maps_seconds": _time(maps_fn, (layer, x_NDC, edges), repeats),
        "csnn_operators_seconds": _time(sheaf.diffusion, (mixed_NDC, *maps, edges), repeats),
    }


def _measure_one(target_E: int, repeats: int, key=None) -> dict:
    n, edges = graph(target_E)
    num_E = int(edges.senders_E.shape[0])
    per_model = inputs(n, jax.random.key(0) if key is None else key)
    row = {"target_edges": target_E, "edges": num_E, "nodes": n}
    for name, layer_fn in zip(("csnn", "gcn"), layer_fns(), strict=True):
        args = (*per_model[name], edges)
        row[f"{name}_forward_seconds"] = _time(layer_fn, args, repeats)
        row[f"{name}_fwd_bwd_seconds"] = _time(_grad_fn(layer_fn), args, repeats)
    for phase in ("forward", "fwd_bwd"):
        for name in ("csnn", "gcn"):
            row[f"{name}_{phase}_edges_per_s"] = num_E / row[f"{name}_{phase}_seconds"]
        row[f"csnn_over_gcn_{phase}"] = row[f"csnn_{phase}_seconds"] / row[f"gcn_{phase}_seconds"]
    row.update(_split_csnn(*per_model["csnn"], edges, repeats))
    return row


def measure(*, smoke: bool = False) -> Result:
    sizes, repeats = ((500, 2000), 1) if smoke else (SIZES, 3)
    rows = [_measure_one(target_E, repeats) for target_E in sizes]
    ratios = [
        Ratio(
            f"one layer {label}, E={r['edges']} N={r['nodes']}, width 96, float32",
            f"CSNN (d={STALK}, C={CHANNELS})",
            r[f"csnn_{phase}_seconds"],
            f"GCN (C={WIDTH})",
            r[f"gcn_{phase}_seconds"],
            "s",
        )
        for r in rows
        for phase, label in (("forward", "forward"), ("fwd_bwd", "forward + backward"))
    ]
    configs = {"csnn": dataclasses.asdict(CSNN_CFG), "gcn": dataclasses.asdict(GCN_CFG)}
    return Result(ratios, {"repeats": repeats, "configs": configs, "rows": rows})
