"""One experiment runner: a method's experiment states its arms, grids, seeds and claims; the loop,
the run cache, validation-only selection with grid-edge checks, paired claims and the results
record are written here once (the workspace's "Experiment protocol").

    EXPERIMENT = Experiment(
        slug="selective_rope",
        arms=(Arm("gla/selective", grid={"lr": (1e-3, 3e-3, 1e-2)}), Arm("gla/rope", grid=...)),
        seeds=(0, 1, 2),
        config_of=parity_config,  # (arm, point, seed, quick) -> the run's config
        run=train_and_evaluate,  # (config, run_dir) -> {"validation/acc": .9, "test/acc": .8}
        select_on="validation/acc",  # each arm's grid point: best mean over seeds ("rule")
        claims=(ClaimSpec("beats", "selective beats RoPE", "test/acc", "gla/selective",
                          margin=0.25, baseline="gla/rope"),),
    )
    record = measure(EXPERIMENT, workdir, quick=False)  # every (arm, point, seed), cached
    claims(EXPERIMENT, record)  # [IntervalClaim], from the record alone (after a JSON round trip)

Every run goes through `core.cache.cached` keyed by its config and the method's run sources
(`results.run_sources(slug)`: not experiment.py), so editing a claim retrains nothing and a
widened grid runs only its new points. The record's config holds the arms, grids, open edges,
seeds and selection settings, so `choices` and `claims` re-derive everything from it.

An arm's choice on its grid's edge (an ordered axis's lowest or highest value) means the grid is
not finished. `measure` still returns the complete record (listing every edge in
record["edges"]); `claims` then refuses a full record with an edge that is neither in the arm's
`open_edges` (with the reason it may stay) nor an arm at chance (`at_chance`: every point's
validation mean on the wrong side of it, a flat grid with no optimum to bracket). Refusing there,
not in `measure`, means the live run and `--from_results` refuse the same records by one code
path, before any claim or figure, while the caller of `measure` can still inspect what ran (and
the cache keeps it). Quick records never refuse: a quick run checks the pipeline, not the grid.
"""

import dataclasses
import itertools
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from core import cache, results, selection
from core.claims import IntervalClaim
from core.errors import ConfigError

PAIRED = ("beats", "no_worse")  # IntervalClaim's forms that subtract a baseline arm, by seed
SINGLE = ("at_least", "at_most")
SIDES = ("low", "high")


@dataclasses.dataclass(frozen=True)
class Arm:
    name: str
    grid: Mapping[str, Sequence] = dataclasses.field(default_factory=dict)  # axis -> values
    # (axis, "low" | "high") -> why a choice may stay on that edge (listed in the record).
    open_edges: Mapping[tuple, str] = dataclasses.field(default_factory=dict)
    settings: Mapping = dataclasses.field(default_factory=dict)  # whatever config_of reads


@dataclasses.dataclass(frozen=True)
class ClaimSpec:
    form: str  # one of PAIRED + SINGLE: IntervalClaim's constructors
    text: str
    metric: str  # a row key, e.g. "test/len64/accuracy", read at each arm's chosen point
    arm: str
    margin: float  # the margin (beats, no_worse) or the target (at_least, at_most)
    baseline: str | None = None  # beats / no_worse: the arm subtracted, paired by seed
    quick_margin: float | None = None  # in quick records (None: `margin`)
    quick_metric: str | None = None  # in quick records (None: `metric`), e.g. another length
    in_quick: bool = True  # False: left out of quick records
    label: str | None = None  # the claim's metric name (default: see `metric_label`)

    def __post_init__(self):
        if self.form not in PAIRED + SINGLE:
            raise ConfigError(f"claim {self.text!r}: form={self.form!r}; one of {PAIRED + SINGLE}")
        if (self.form in PAIRED) != (self.baseline is not None):
            raise ConfigError(
                f"claim {self.text!r}: baseline={self.baseline!r}; {', '.join(PAIRED)} need "
                f"one, {', '.join(SINGLE)} take none"
            )

    def metric_label(self, metric: str) -> str:
        """The claim's metric name: `label`, else "<arm>/<metric>" (at_least, at_most) or
        "<metric>: <arm> - <baseline>" (beats, no_worse)."""
        if self.label:
            return self.label
        if self.baseline is None:
            return f"{self.arm}/{metric}"
        return f"{metric}: {self.arm} - {self.baseline}"


@dataclasses.dataclass(frozen=True)
class Experiment:
    slug: str
    arms: tuple[Arm, ...]
    seeds: tuple[int, ...]
    config_of: Callable[[Arm, dict, int, bool], Any]  # (arm, point, seed, quick) -> config
    run: Callable[[Any, str], Mapping]  # (config, run_dir) -> {metric: value}, JSON-able
    claims: tuple[ClaimSpec, ...] = ()
    select_on: str | None = None  # a validation row key; None: no arm may have a grid
    rule: str = "max"  # or "min": of the mean over seeds (`core.selection`)
    arm_key: str = "arm"  # the rows' field that names the arm
    quick_arms: tuple[Arm, ...] | None = None  # None: `arms`
    quick_seeds: tuple[int, ...] | None = None  # None: `seeds`
    at_chance: float | None = None  # see the module docstring; None: no arm is exempt
    sources: tuple[str, ...] | None = None  # a run's code key; None: results.run_sources(slug)
    part: str = ""  # one part of a method's experiment in several: its record is "full_<part>"

    def run_name(self, quick: bool) -> str:
        """The record's run: "full" / "quick", or "full_<part>" / "quick_<part>"."""
        name = "quick" if quick else "full"
        return f"{name}_{self.part}" if self.part else name

    def __post_init__(self):
        where = f"{self.slug}: Experiment"
        if self.rule not in selection.RULES:
            raise ConfigError(f"{where}.rule={self.rule!r}; one of {', '.join(selection.RULES)}")
        if self.select_on is not None:
            selection.ValidationScores(self.select_on, {})  # refuses a test metric now
        known = set()
        for quick in (False, True):
            arms = self.arms_for(quick)
            names = [a.name for a in arms]
            if len(set(names)) != len(names) or not names:
                raise ConfigError(f"{where}: arm names {names} empty or repeated")
            known |= set(names)
            for arm in arms:
                if arm.grid and self.select_on is None:
                    raise ConfigError(f"{where}: arm {arm.name!r} has a grid but no select_on")
                for axis, side in arm.open_edges:
                    if axis not in arm.grid or side not in SIDES:
                        raise ConfigError(
                            f"{where}: arm {arm.name!r} open edge ({axis!r}, {side!r}): "
                            f"not a grid axis and one of {SIDES}"
                        )
        for spec in self.claims:
            for name in filter(None, (spec.arm, spec.baseline)):
                if name not in known:
                    raise ConfigError(f"{where}: claim {spec.text!r} names no arm {name!r}")

    def arms_for(self, quick: bool) -> tuple[Arm, ...]:
        return tuple(self.quick_arms if quick and self.quick_arms is not None else self.arms)

    def seeds_for(self, quick: bool) -> tuple[int, ...]:
        return tuple(self.quick_seeds if quick and self.quick_seeds is not None else self.seeds)


def points(grid: Mapping[str, Sequence]) -> list[dict]:
    """Every grid point as {axis: value}, in `core.selection.select`'s order."""
    return [dict(zip(grid, p, strict=True)) for p in itertools.product(*grid.values())]


def _jsonable(config: Any) -> Any:
    return config.to_dict() if hasattr(config, "to_dict") else config


def jobs(experiment: Experiment, quick: bool = False) -> list[tuple[Arm, dict, int]]:
    """Every (arm, grid point, seed) of `experiment`, in the order `measure` runs them."""
    e = experiment
    return [
        (a, p, s) for a in e.arms_for(quick) for p in points(a.grid) for s in e.seeds_for(quick)
    ]


def code_key(experiment: Experiment) -> str:
    """A run cache key's code half: the hash of `sources` (default: the run sources)."""
    return results.source_hash(experiment.sources or results.run_sources(experiment.slug))


def job_label(slug: str, arm: str, point: dict, seed: int) -> str:
    values = (f"{a}={v:g}" if isinstance(v, float) else f"{a}={v}" for a, v in point.items())
    return " ".join([f"{slug} {arm}", *values, f"seed {seed}"])


def run_one(experiment: Experiment, config: Any, code: str, workdir: str, label: str) -> dict:
    """One run through the cache, in `<workdir>/runs/<key>`; prints whether it ran and how long."""
    run_dir = os.path.join(workdir, "runs", cache.key(config, code))
    ran = []

    def compute():
        ran.append(True)
        return dict(experiment.run(config, run_dir))

    start = time.perf_counter()
    value = cache.cached(compute, config=config, code=code, root=os.path.join(workdir, "cache"))
    how = "ran" if ran else "cached"
    print(f"-- {label}: {how} ({time.perf_counter() - start:.1f} s)", flush=True)
    return value


def measure(experiment: Experiment, workdir: str, *, quick: bool = False) -> dict:
    """Every (arm, grid point, seed) run (cached) as a results record; its "edges" list every
    arm's choice on a grid edge, open or not (`claims` refuses the unfinished ones)."""
    e = experiment
    arms, seeds = e.arms_for(quick), e.seeds_for(quick)
    code = code_key(e)
    start = time.perf_counter()
    rows, first_configs = [], {}
    for arm, point, seed in jobs(e, quick):
        config = e.config_of(arm, point, seed, quick)
        first_configs.setdefault(arm.name, _jsonable(config))
        label = job_label(e.slug, arm.name, point, seed)
        metrics = run_one(e, config, code, workdir, label)
        where = {e.arm_key: arm.name, **point, "seed": seed}
        if set(where) & set(metrics):
            raise ConfigError(
                f"{e.slug}: run metrics {sorted(set(where) & set(metrics))} clash "
                "with the row's arm, grid axes or seed"
            )
        if e.select_on is not None and e.select_on not in metrics:
            raise ConfigError(
                f"{e.slug}: {label} returned no select_on={e.select_on!r} (it has "
                f"{sorted(metrics)[:6]})"
            )
        rows.append({**where, **metrics})
    config = {
        "quick": quick,
        "seeds": list(seeds),
        "arm_key": e.arm_key,
        "select_on": e.select_on,
        "rule": e.rule,
        "at_chance": e.at_chance,
        "arms": {a.name: _arm_settings(a) for a in arms},
        "run_config": first_configs,  # each arm's first run's; grid values and seed vary
    }
    record = results.record(
        e.slug,
        e.run_name(quick),
        config=config,
        rows=rows,
        run_sources_hash=code,
        seconds=time.perf_counter() - start,
    )
    record["edges"] = edges(record)
    return record


def _arm_settings(arm: Arm) -> dict:
    return {
        "grid": {axis: list(values) for axis, values in arm.grid.items()},
        "open_edges": [[axis, side, why] for (axis, side), why in arm.open_edges.items()],
    }


def _settings(record: dict) -> dict:
    if "arms" not in record.get("config", {}):
        raise ConfigError(
            f"{record.get('method')}: results record without config.arms (not written by "
            "core.experiment_runner.measure; see adopt_older)"
        )
    return record["config"]


def choices(record: dict) -> dict[str, selection.Selection]:
    """arm -> its grid point chosen on the validation metric alone (mean over seeds, the rule);
    an arm without a grid has the one point {}."""
    cfg = _settings(record)
    out = {}
    for name, arm in cfg["arms"].items():
        grid = {axis: tuple(values) for axis, values in arm["grid"].items()}
        if cfg["select_on"] is None:
            n = len(cfg["seeds"])
            out[name] = selection.Selection({}, float("nan"), n, {}, {})
            continue
        by_point = {
            tuple(p.values()): results.by_seed(
                record["rows"], cfg["select_on"], **{cfg["arm_key"]: name, **p}
            )
            for p in points(grid)
        }
        scores = selection.ValidationScores(cfg["select_on"], by_point)
        out[name] = selection.select(grid, scores, rule=cfg["rule"])
    return out


def edges(record: dict) -> list[dict]:
    """Every choice on its grid's edge: {arm, axis, value, side, open}, where `open` is why it may
    stay there (the arm's open edge, or the arm is at chance) or None (the grid is unfinished)."""
    cfg = _settings(record)
    out = []
    for name, sel in choices(record).items():
        if not sel.on_edge:
            continue
        reasons = {(axis, side): why for axis, side, why in cfg["arms"][name]["open_edges"]}
        best, threshold = sel.mean, cfg.get("at_chance")  # sel.mean: the best point's mean
        flat = threshold is not None and (
            best < threshold if cfg["rule"] == "max" else best > threshold
        )
        for axis, side in sel.edges.items():
            if side:
                why = reasons.get((axis, side))
                if why is None and flat:
                    why = f"at chance: best validation mean {best:.4g} vs {threshold:g}"
                out.append(dict(arm=name, axis=axis, value=sel.point[axis], side=side, open=why))
    return out


def unfinished(record: dict) -> list[str]:
    """'arm: axis=value (side)' for each edge choice that is not open."""
    return [
        f"{e['arm']}: {e['axis']}={e['value']!r} ({e['side']})"
        for e in edges(record)
        if e["open"] is None
    ]


def require_finished(record: dict) -> None:
    """One line naming every unfinished edge choice of a full record (quick ones pass)."""
    left = unfinished(record)
    if left and not record["config"]["quick"]:
        raise ConfigError(f"{record['method']}: grid not finished, widen it: {'; '.join(left)}")


def reported(record: dict, arm: str, metric: str, chosen: Mapping | None = None) -> dict:
    """{seed: metric} of the arm's runs at its chosen point (`chosen`: `choices(record)`)."""
    cfg = _settings(record)
    chosen = choices(record) if chosen is None else chosen
    if arm not in chosen:
        raise ConfigError(f"{record['method']}: no arm {arm!r} in the record ({list(chosen)})")
    where = {cfg["arm_key"]: arm, **chosen[arm].point}
    rows = [r for r in record["rows"] if all(r.get(k) == v for k, v in where.items())]
    missing = [r["seed"] for r in rows if metric not in r]
    if missing or not rows:
        raise ConfigError(f"{record['method']}: {where} has no {metric!r} (seeds {missing})")
    return results.by_seed(rows, metric)


def claims(experiment: Experiment, record: dict) -> list[IntervalClaim]:
    """Every claim at the arms' chosen points, from the record alone (quick records: quick
    margins, and claims whose arms did not run or that are not `in_quick` left out)."""
    require_finished(record)
    chosen = choices(record)
    quick = record["config"]["quick"]
    out = []
    for spec in experiment.claims:
        names = [spec.arm] + ([spec.baseline] if spec.baseline else [])
        if quick and (not spec.in_quick or any(n not in chosen for n in names)):
            continue
        margin = spec.quick_margin if quick and spec.quick_margin is not None else spec.margin
        metric = spec.quick_metric if quick and spec.quick_metric is not None else spec.metric
        values = [reported(record, n, metric, chosen) for n in names]
        build = getattr(IntervalClaim, spec.form)
        out.append(build(spec.text, spec.metric_label(metric), *values, margin))
    return out


def adopt_older(experiment: Experiment, record: dict) -> dict:
    """A record written before this runner, as if `measure` had written it: its arms are the
    experiment's arms that have rows, each grid cut to the values its rows hold (what ran). The
    record itself is not changed."""
    if "arms" in record.get("config", {}):
        return record
    cfg = dict(record.get("config", {}))
    quick = bool(cfg.get("quick", False))
    ran = record["rows"]
    arms = {}
    for arm in experiment.arms_for(quick):
        mine = [r for r in ran if r.get(experiment.arm_key) == arm.name]
        if mine:
            grid = {
                a: tuple(v for v in vs if any(r[a] == v for r in mine))
                for a, vs in arm.grid.items()
            }
            arms[arm.name] = _arm_settings(dataclasses.replace(arm, grid=grid))
    cfg.update(
        quick=quick,
        seeds=cfg.get("seeds") or sorted({r["seed"] for r in ran}),
        arm_key=experiment.arm_key,
        select_on=experiment.select_on,
        rule=experiment.rule,
        at_chance=experiment.at_chance,
        arms=arms,
    )
    return {**record, "config": cfg}


def report(
    experiment: Experiment, workdir: str, *, quick: bool = False, plot: Callable | None = None
):
    """An experiment module's `run`: every run measured (cached), the claims from the record, and
    (full runs) `plot(record, workdir) -> [paths]`'s figures, as a protocol `Report`."""
    from core.claims import Report

    record = measure(experiment, workdir, quick=quick)
    return Report.on_protocol(
        method=experiment.slug,
        figures=[] if quick or plot is None else plot(record, workdir),
        claims=claims(experiment, record),
        quick=quick,
        results=record,
    )
