"""Hyperparameter selection on validation data only, and whether the grid is finished.

    grid = {"lr": (1e-4, 3e-4, 1e-3), "model": ("gcn", "sage")}
    scores = ValidationScores(
        metric="val/auroc",
        by_point={(1e-4, "gcn"): {0: .91, 1: .90, 2: .92}, ...},  # point in grid order -> seeds
    )
    chosen = select(grid, scores, rule="max")
    chosen.point             # {"lr": 3e-4, "model": "gcn"}
    chosen.edges             # {"lr": None}: "low"/"high" where the choice sits on the grid's edge
    chosen.require_interior()  # ConfigError if it does: the grid is not finished

Test numbers cannot reach `select` by accident: it takes only a `ValidationScores`, whose
`split` must be "validation" and whose metric name may not mention the test split; a results
row's test numbers have no field there to go into. Every grid point needs scores on the same
seeds (a missing point is an unfinished grid, an extra one is off the grid), so means compare
like with like.

Edges are judged on ordered axes only (numeric values, in the order given); a categorical axis
(strings, e.g. a model kind) has no edge to extend. A 2-value numeric axis is always on its edge.
"""

import dataclasses
import itertools
import numbers
import re
from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from core.errors import ConfigError

RULES = {"max": np.argmax, "min": np.argmin}  # of the mean over seeds; ties: first in the grid
VALIDATION = "validation"
_TEST_NAME = re.compile(r"(^|[^a-z])test($|[^a-z])", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class ValidationScores:
    metric: str  # e.g. "val/auroc"; a name that mentions the test split is refused
    by_point: Mapping[tuple, Mapping[Hashable, float]]  # grid point (axis order) -> seed -> score
    split: str = VALIDATION  # must stay "validation": the one split selection may read

    def __post_init__(self):
        if self.split != VALIDATION:
            raise ConfigError(
                f"selection reads the validation split only; got split={self.split!r}"
            )
        if _TEST_NAME.search(self.metric):
            raise ConfigError(f"selection metric {self.metric!r} names the test split")


@dataclasses.dataclass(frozen=True)
class Selection:
    point: dict  # axis -> chosen value
    mean: float  # its mean validation score over seeds
    n: int  # seeds per point
    means: dict  # every grid point (tuple in axis order) -> mean validation score
    edges: dict  # ordered axis -> None, "low" or "high" (the chosen value is the grid's min/max)

    @property
    def on_edge(self) -> bool:
        return any(self.edges.values())

    def require_interior(self) -> None:
        """Refuse an unfinished grid: one line naming each axis whose choice is on its edge."""
        if self.on_edge:
            where = "; ".join(
                f"{axis}={self.point[axis]!r} is the grid's {edge}est value"
                for axis, edge in self.edges.items()
                if edge
            )
            raise ConfigError(f"grid not finished: {where}; extend it past that value")


def _ordered(values: Sequence) -> bool:
    return all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values)


def select(
    grid: Mapping[str, Sequence], scores: ValidationScores, *, rule: str = "max"
) -> Selection:
    """The grid point with the best mean validation score over seeds (`rule`: max or min)."""
    if not isinstance(scores, ValidationScores):
        raise ConfigError(
            f"select takes ValidationScores, not {type(scores).__name__}: validation data only"
        )
    if rule not in RULES:
        raise ConfigError(f"selection rule={rule!r}; expected one of: {', '.join(RULES)}")
    axes = list(grid)
    for axis, values in grid.items():
        if len(values) == 0 or len(set(values)) != len(values):
            raise ConfigError(f"grid axis {axis!r}: values {list(values)} empty or repeated")
    points = list(itertools.product(*(grid[a] for a in axes)))  # the last axis varies fastest
    missing = [p for p in points if p not in scores.by_point]
    extra = [p for p in scores.by_point if p not in set(points)]
    if missing or extra:
        raise ConfigError(
            f"{scores.metric}: grid points without scores {missing[:3]}, scores off the grid "
            f"{extra[:3]} (points are tuples in axis order {axes})"
        )
    seeds = {frozenset(scores.by_point[p]) for p in points}
    if len(seeds) != 1 or not next(iter(seeds)):
        raise ConfigError(f"{scores.metric}: every grid point needs scores on the same seeds")
    means = [float(np.mean(list(scores.by_point[p].values()))) for p in points]
    if not np.all(np.isfinite(means)):
        bad = [p for p, m in zip(points, means, strict=True) if not np.isfinite(m)]
        raise ConfigError(f"{scores.metric}: non-finite validation scores at {bad[:3]}")
    best = points[int(RULES[rule](means))]
    edges = {}
    for axis, value in zip(axes, best, strict=True):
        values = grid[axis]
        if _ordered(values) and len(values) > 1:
            edges[axis] = (
                "low" if value == min(values) else "high" if value == max(values) else None
            )
    return Selection(
        point=dict(zip(axes, best, strict=True)),
        mean=means[points.index(best)],
        n=len(next(iter(seeds))),
        means=dict(zip(points, means, strict=True)),
        edges=edges,
    )
