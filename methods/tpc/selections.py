"""TPC's validation choices: prompts' MiniLM layer, each tuned arm's grid point, and the check
that no choice sits on a grid edge (the order of `measure` in experiment.py; every score is
`core.selection.select` on VALIDATION F1 of the first seed).

    layer, info = choose_layer(setting, workdir)          # the linear probe's best layer
    point, info = select_arm(setting, runner, "progressive")
    unfinished([info, ...], setting.open_edges)           # "digits mlp@N: dropout=0.7 (high)"
"""

import itertools
import os
from typing import TYPE_CHECKING

from core import cache, results, selection
from methods.tpc import baselines
from methods.tpc.runs import RUN_SOURCES, Runner

if TYPE_CHECKING:
    from methods.tpc.experiment import Setting

VALIDATION = "val/f1"


def points(grid: dict) -> list[tuple]:
    return list(itertools.product(*grid.values()))  # the order `selection.select` uses


def choose_layer(s: "Setting", workdir: str) -> tuple[int, dict]:
    """prompts' MiniLM layer: the linear probe's validation F1 on the first seed (as every
    grid: the CPU budget)."""
    from methods.tpc import data

    seed = s.seeds[0]
    data.encode_prompt_layers(seed, s.layers)  # one encoder pass fills every layer's cache
    code = results.source_hash(RUN_SOURCES)

    def val_f1(layer):  # cached: the scan's fits are minutes on shared cores
        return lambda: baselines.fit_linear(data.load("prompts", seed=seed, layer=layer)).val_f1

    by_point = {
        (layer,): {
            seed: cache.cached(
                val_f1(layer),
                config={"layer_scan": "linear probe", "seed": seed, "layer": layer},
                code=code,
                root=os.path.join(workdir, "cache"),
            )[0]
        }
        for layer in s.layers
    }
    chosen = selection.select({"layer": s.layers}, selection.ValidationScores(VALIDATION, by_point))
    info = selection_info("prompts", "layer (linear probe)", {"layer": s.layers}, chosen)
    return chosen.point["layer"], info


def selection_info(dataset: str, arm: str, grid: dict, chosen) -> dict:
    return {
        "dataset": dataset,
        "arm": arm,
        "grid": {a: list(v) for a, v in grid.items()},
        "point": chosen.point,
        "val_f1": chosen.mean,
        "seeds": chosen.n,
        "edges": {a: e for a, e in chosen.edges.items() if e},
        "scores": [[*p, m] for p, m in chosen.means.items()],
    }


def select_arm(s: "Setting", runner: Runner, arm: str) -> tuple[dict, dict]:
    """`arm`'s grid point by its validation F1 at the last order (exit), on `runner`'s seed."""
    seed = runner.c.seed
    by_point = {
        p: {seed: runner.run(arm, dict(zip(s.grid, p, strict=True)))["val_f1"][-1]}
        for p in points(s.grid)
    }
    chosen = selection.select(s.grid, selection.ValidationScores(VALIDATION, by_point))
    return chosen.point, selection_info(runner.c.data.dataset, arm, s.grid, chosen)


def unfinished(selections: list[dict], open_edges: dict) -> list[str]:
    return [
        f"{sel['dataset']} {sel['arm']}: {a}={sel['point'][a]!r} ({e})"
        for sel in selections
        for a, e in sel["edges"].items()
        if (a, e) not in open_edges
        and (sel["dataset"], sel["arm"], a, e) not in open_edges
        and a != "layer"  # the layer scan covers every layer
    ]
