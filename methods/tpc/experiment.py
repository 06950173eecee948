"""TPC's claims at CPU scale, on MiniLM activations of interaction prompts and on digits.

Per dataset and seed (the seed draws the data split, and for prompts the held-out templates,
as well as the initialisation), every trained arm gets the same number of passes over the
training set, (N - 1) x `epochs`:
- linear: the sklearn probe (C by validation F1), TPC's frozen order 1;
- progressive: TPC order by order, earlier orders frozen (the paper), `epochs` per order;
- joint_all: every order at once on the mean loss over every truncation (the released code's
  "train_all"): the joint arm that does train the intermediate truncations;
- joint: every order at once on the order-N loss alone (the released code's "max"), reported
  beside with progressive's hyperparameters (in no claim: its truncations are never trained);
- mlp@n: one hidden layer matched to TPC's parameters at order n (n = 2 and N), with dropout.

Every choice is `core.selection.select` on VALIDATION F1 (test numbers choose nothing):
- prompts' MiniLM layer: every layer 0..6 (no edge can be extended), scored by the linear
  probe's validation F1 on the first seed (the probe every other arm builds on or is compared
  with);
- each trained arm's hyperparameters: its own grid (TPC and the MLPs the same axes, values and
  rule: lr x weight decay x dropout, term dropout for TPC, unit dropout for the MLPs; one grid per
  MLP width), scored on the first seed's validation F1 at the last order, then used for every
  seed (the paper selects once and trains its seeds). A choice on a grid edge stops the run once
  every grid is scored, naming each, unless `Setting.open_edges` allows it with its reason;
- the cascade's tau, per seed, from a grid below 1 (so every row may exit early): the cheapest
  tau whose validation F1 is within CASCADE_VAL_TOL of the full order's; without one, the
  highest validation F1.

Every run is cached by its config and the training code (`runs.py`: `core.cache.cached_run`);
the layer and grid choices are `selections.py`'s; the rows go into one `core.results` record,
from which `claims_from_results` and `report.table` re-derive every number (`python -m
launch.reproduce --methods=tpc --from_results`).

Not `core.experiment_runner`: it selects each arm on the mean over every seed and records one
row per (arm, point, seed); here the layer is chosen first, each grid on the first seed alone,
and tau per seed on validation, which the runner cannot state without changing those choices.

Claims (IntervalClaims over the seeds, paired by seed; margins fixed before the rerun that
`results/full.json` records), per dataset:
- progressive training keeps the truncations usable: its mean test F1 over orders 2..N-1 is no
  worse (margin MATCH_TOL) than joint_all's, which trains every truncation. It replaces
  "progressive - joint > 0", which could hardly fail: "joint" never trains orders 2..N-1;
- the cascade, at a tau < 1 chosen on validation, is no worse than the full order (MATCH_TOL)
  ... and costs at most COST_BOUND of its parameters. It replaces "the cascade matches the full
  order" at a tau from {..., 1}, which held by construction when tau = 1 was chosen;
- TPC at order N is no worse than the parameter-matched MLP (MATCH_TOL), each tuned alike;
- order 2 beats the linear probe by ORDER2_GAP.
The quick run (QUICK) is a smoke check with its own claims (`quick_claims_from_results`): what
holds at 5 epochs per order and fails for a broken pipeline (above chance, the cascade's cost,
joint_all no worse than the MLP, progressive's higher orders above its frozen order 1).
"""

import dataclasses
import itertools
import time

import numpy as np

from core import results, selection
from core.claims import IntervalClaim, Report
from core.errors import ConfigError
from methods.tpc import baselines, cascade, model
from methods.tpc.report import derived, per_seed, plot, table
from methods.tpc.runs import RUN_SOURCES, Runner, linear_f1
from methods.tpc.selections import choose_layer, select_arm, unfinished

# A cascade tau qualifies on validation when its F1 is within this of the full order's: about
# one misclassified positive in digits' 200-row validation split.
CASCADE_VAL_TOL = 0.005
# Margins, fixed before the full run. "No worse" on test: 0.01 F1, about two test errors in
# digits' 540 rows, below the seed-to-seed spread of every arm measured before.
MATCH_TOL = 0.01
COST_BOUND = 0.5  # "a fraction of the cost": at most half of the full order's parameters
# Order 2 over the linear probe: the earlier run measured +.06 to +.07 (digits) and +.05 to
# +.29 (prompts) per seed; 0.02 is four digits test errors.
ORDER2_GAP = 0.02
# tau < 1 only: at tau = 1 no row exits and the cascade is the full order by construction.
# tau = .5 would exit every row at order 1 (the linear probe).
TAUS = (0.55, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999)
LAYERS = tuple(range(7))  # MiniLM-L6: 0 the embeddings, 6 the last layer
TUNED = ("progressive", "joint_all", "mlp@2", "mlp@N")  # arms with their own grid


@dataclasses.dataclass(frozen=True)
class Setting:
    datasets: tuple[str, ...]
    seeds: tuple[int, ...]
    epochs: int  # per order of the progressive schedule
    grid: dict  # axis -> values, the same for every tuned arm (dropout: term or unit dropout)
    require_interior: bool
    # (axis, side) or (dataset, arm, axis, side) -> why a choice may sit on that edge (side:
    # "low" | "high"); any other edge stops the run.
    open_edges: dict = dataclasses.field(default_factory=dict)
    size: str = "small"  # configs/tpc.py: N = 5, R = 16, batch 128
    layers: tuple = LAYERS  # prompts' MiniLM layer grid
    context_arms: bool = True  # joint ("max"): reported beside, in no claim
    tuned: tuple = TUNED  # the arms with their own grid (the quick run: those claims read)


DROPOUT_FLOOR = "p = 0 is no dropout; there is nothing below it"
FULL = Setting(
    datasets=("digits", "prompts"),
    seeds=(0, 1, 2),
    epochs=40,  # NOTES 18's CPU run (the paper: 50)
    # The paper's dropout values; its lr {1e-3, 5e-4, 1e-4} and weight decay {1, .1, .01} axes
    # are fixed at 1e-3 and .01 (NOTES 18's CPU run) for every arm: on 2 CPU cores shared by
    # six jobs (load average ~35) a 40-epoch run took 2-4 minutes, and 9 points per arm did
    # not fit the budget.
    # Dropout .7 was added for every arm when prompts' joint_all chose .5 (the grid's top) in
    # the first pass: the cache reran only the new points.
    grid={"lr": (1e-3,), "weight_decay": (0.01,), "dropout": (0.0, 0.2, 0.5, 0.7)},
    require_interior=True,
    open_edges={
        ("dropout", "low"): DROPOUT_FLOOR,
        ("digits", "progressive", "dropout", "high"): (
            "digits' 200-row validation split saturates: p = .7 beat p = 0 by 1e-4 F1 (val F1"
            " .9883 against .9882); not widened further (CPU budget)"
        ),
    },
    # joint ("max") is not rerun: on 2 CPU cores shared by six jobs (load average ~30) the
    # grids above took the budget; the earlier run's numbers for it are in the README.
    context_arms=False,
)
QUICK = Setting(  # three seeds (an interval needs three), short stages, one grid point
    datasets=("digits",),
    seeds=(0, 1, 2),
    epochs=5,
    grid={"lr": (1e-3,), "weight_decay": (0.01,), "dropout": (0.0,)},
    require_interior=False,
    context_arms=False,
    tuned=("progressive", "joint_all", "mlp@N"),
)


def choose_tau(Y_val, y_val, counts_N) -> tuple[float, dict]:
    """The cheapest tau whose validation F1 is within CASCADE_VAL_TOL of the full order's (score:
    its cost fraction); taus outside it score 1 + their F1 shortfall, so without any qualifying
    tau the best validation F1 wins."""
    full = model.f1_score(y_val, Y_val[:, -1])
    by_point = {}
    for tau in TAUS:
        r = cascade.cascade_from_logits(Y_val, y_val, tau, counts_N)
        short = full - r.f1
        cost = r.mean_params / float(counts_N[-1])
        by_point[(tau,)] = {0: cost if short <= CASCADE_VAL_TOL else 1.0 + short}
    metric = "val/cascade cost (1 + F1 shortfall when over the tolerance)"
    chosen = selection.select(
        {"tau": TAUS}, selection.ValidationScores(metric, by_point), rule="min"
    )
    return chosen.point["tau"], chosen.edges


def cascade_row(fit: dict, splits, counts_N) -> dict:
    Y_val, Y_test = np.asarray(fit["Y_val"]), np.asarray(fit["Y_test"])
    tau, edges = choose_tau(Y_val, splits.y_val, counts_N)
    val = cascade.cascade_from_logits(Y_val, splits.y_val, tau, counts_N)
    test = cascade.cascade_from_logits(Y_test, splits.y_test, tau, counts_N)
    curve = [cascade.cascade_from_logits(Y_test, splits.y_test, t, counts_N) for t in TAUS]
    return {
        "arm": "cascade",
        "tau": tau,
        "tau_edge": next(iter(edges.values())),
        "val_f1": [val.f1],
        "test_f1": [test.f1],
        "cost_fraction": test.mean_params / float(counts_N[-1]),
        "val_cost_fraction": val.mean_params / float(counts_N[-1]),
        "mean_params": test.mean_params,
        "mean_exit_order": test.mean_exit_order,
        "exit_fraction": test.exit_fraction.tolist(),
        "curve": [[t, r.f1, r.mean_params] for t, r in zip(TAUS, curve, strict=True)],
    }


def measure(workdir: str, *, quick: bool = False, setting=None, grids_only: bool = False):
    """The results record; `setting` overrides the quick / full one and `grids_only` stops
    after the grids (None): several processes may score parts of the grids into the shared
    cache (e.g. one dataset or a few arms each) before one run assembles the record."""
    s = setting or (QUICK if quick else FULL)
    start = time.perf_counter()
    code = results.source_hash(RUN_SOURCES)
    layer, layer_info = (None, None)
    selections, hp = [], {}
    if "prompts" in s.datasets:
        layer, layer_info = choose_layer(s, workdir)
        selections.append(layer_info)
    layers = {d: (layer if d == "prompts" else None) for d in s.datasets}
    runners = {}
    # Phase 1: every grid on the first seed's validation split; edges checked before any other
    # seed trains.
    for dataset in s.datasets:
        first = Runner(s, dataset, s.seeds[0], layers[dataset], workdir, code)
        runners[(dataset, s.seeds[0])] = first
        for arm in s.tuned:
            hp[(dataset, arm)], info = select_arm(s, first, arm)
            selections.append(info)
        hp[(dataset, "joint")] = hp.get((dataset, "progressive"))
    if grids_only:
        return None
    edges = unfinished(selections, {})
    if s.require_interior and unfinished(selections, s.open_edges):
        raise ConfigError(
            f"grid not finished, widen it: {'; '.join(unfinished(selections, s.open_edges))}"
        )
    # Phase 2: every seed at the chosen points (the first seed's runs come from the cache).
    rows = []
    for dataset, seed in itertools.product(s.datasets, s.seeds):
        key = (dataset, seed)
        runner = runners.get(key) or Runner(s, dataset, seed, layers[dataset], workdir, code)
        where = {"dataset": dataset, "seed": seed}
        lin = linear_f1(runner, workdir)
        rows.append({**where, "arm": "linear", **lin})
        arms = (*s.tuned, "joint") if s.context_arms else s.tuned
        for arm in arms:
            point = hp[(dataset, arm)]
            out = runner.run(arm, point)
            row = {**where, "arm": arm, "val_f1": out["val_f1"], "test_f1": out["test_f1"]}
            rows.append({**row, **{f"chosen_{a}": v for a, v in point.items()}})
            if arm in runner.hidden:
                rows[-1]["hidden"] = runner.hidden[arm]
            if arm == "progressive":
                rows.append({**where, **cascade_row(out, runner.splits, runner.counts)})
    datasets = {}
    for dataset in s.datasets:
        r = runners.get((dataset, s.seeds[0]))
        D = r.splits.x_train.shape[1]
        datasets[dataset] = {
            "D": D,
            "layer": layers[dataset],
            "counts": r.counts.tolist(),
            "mlp_hidden": r.hidden,
            "mlp_params": {a: baselines.mlp_params(D, h) for a, h in r.hidden.items()},
        }
    return results.record(
        "tpc",
        "quick" if quick else "full",
        config={"quick": quick, **_jsonable(s)},
        rows=rows,
        selections=selections,
        datasets=datasets,
        edges=edges,
        code=results.code_version("tpc") | {"run_sources_hash": code},
        seconds=time.perf_counter() - start,
    )


def _jsonable(s: Setting) -> dict:
    out = dataclasses.asdict(s)
    out["grid"] = {a: list(v) for a, v in s.grid.items()}
    out["open_edges"] = [[*edge, why] for edge, why in s.open_edges.items()]
    out["margins"] = {
        "MATCH_TOL": MATCH_TOL,
        "COST_BOUND": COST_BOUND,
        "ORDER2_GAP": ORDER2_GAP,
        "CASCADE_VAL_TOL": CASCADE_VAL_TOL,
    }
    out["taus"] = list(TAUS)
    return out


# The quick run's smoke checks (digits only). Chance: digits' test split is stratified, 273 of
# 540 rows positive (odd) on every seed, so predicting "positive" everywhere scores F1 =
# 2p / (1 + p) = 0.672; a broken pipeline (flipped or shuffled labels, an untrained probe) sits
# at or below it. "Far above" is 0.2 over it: the linear probe alone measured .90 to .92.
CHANCE_F1 = {"digits": 0.672}
ABOVE_CHANCE = 0.2
# Higher orders learned: progressive's order 1 is the frozen linear probe, so with its higher
# terms untrained order N - linear is ~0; 0.005 F1 is about three digits test errors.
HIGHER_ORDER_GAP = 0.005


def quick_claims_from_results(record: dict) -> list[IntervalClaim]:
    """Smoke checks that hold at quick size (5 epochs per order, one grid point) and fail for a
    broken pipeline; the full claims need the full schedule (progressive is under-trained at 5
    epochs per order, so its comparisons with joint_all and the MLP do not hold there)."""
    claims = []
    for dataset in record["config"]["datasets"]:
        d = derived(record, dataset)
        chance = CHANCE_F1[dataset]
        arms = [per_seed(record, dataset, a) for a in ("progressive", "joint_all")]
        lowest = {s: min(min(f1[s][1:-1]) for f1 in arms) for s in arms[0]}  # orders 2..N-1
        joint_N = {s: v[-1] for s, v in arms[1].items()}
        claims += [
            IntervalClaim.at_least(
                f"smoke: {dataset}: every truncation learned: the lowest test F1 of progressive"
                f" and joint_all over orders 2..N-1 is above the all-positive predictor's"
                f" ({chance:g}) by > {ABOVE_CHANCE:g}",
                f"{dataset} min f1[2..N-1] over progressive, joint_all",
                lowest,
                chance + ABOVE_CHANCE,
            ),
            IntervalClaim.at_least(
                f"smoke: {dataset}: the cascade (tau < 1 from validation) is above the"
                f" all-positive predictor's test F1 ({chance:g}) by > {ABOVE_CHANCE:g}",
                f"{dataset} f1: cascade",
                d["cascade"],
                chance + ABOVE_CHANCE,
            ),
            cost_claim(dataset, d),
            IntervalClaim.no_worse(
                f"smoke: {dataset}: TPC trained jointly (joint_all) at order N is no worse than"
                f" the parameter-matched MLP (margin {MATCH_TOL:g})",
                f"{dataset} f1: joint_all order N - mlp@N",
                joint_N,
                d["mlp@N"],
                MATCH_TOL,
            ),
            IntervalClaim.beats(
                f"smoke: {dataset}: progressive's higher orders learned: order N beats the"
                f" linear probe (its frozen order 1) by {HIGHER_ORDER_GAP:g}",
                f"{dataset} f1: progressive order N - linear",
                d["progressive order N"],
                d["linear"],
                HIGHER_ORDER_GAP,
            ),
        ]
    return claims


def cost_claim(dataset: str, d: dict) -> IntervalClaim:
    """The cascade's cost: the same claim in full and quick runs (so the two rows pair)."""
    return IntervalClaim.at_most(
        f"{dataset}: ... at most {COST_BOUND:g} of the full order's parameters",
        f"{dataset} cascade mean parameters / order N's",
        d["cascade cost fraction"],
        COST_BOUND,
    )


def claims_from_results(record: dict) -> list[IntervalClaim]:
    if record["config"].get("quick"):
        return quick_claims_from_results(record)
    claims = []
    for dataset in record["config"]["datasets"]:
        d = derived(record, dataset)
        claims += [
            IntervalClaim.no_worse(
                f"{dataset}: progressive truncations are no worse than joint training of every "
                f"truncation (mean test F1, orders 2..N-1; margin {MATCH_TOL:g})",
                f"{dataset} f1[2..N-1]: progressive - joint_all",
                d["progressive, mean F1 orders 2..N-1"],
                d["joint_all, mean F1 orders 2..N-1"],
                MATCH_TOL,
            ),
            IntervalClaim.no_worse(
                f"{dataset}: the cascade (tau < 1 from validation) is no worse than the full "
                f"order (margin {MATCH_TOL:g})",
                f"{dataset} f1: cascade - order N",
                d["cascade"],
                d["progressive order N"],
                MATCH_TOL,
            ),
            cost_claim(dataset, d),
            IntervalClaim.no_worse(
                f"{dataset}: TPC at order N is no worse than the parameter-matched MLP, each "
                f"tuned on validation (margin {MATCH_TOL:g})",
                f"{dataset} f1: order N - mlp@N",
                d["progressive order N"],
                d["mlp@N"],
                MATCH_TOL,
            ),
            IntervalClaim.beats(
                f"{dataset}: order 2 beats the linear probe by {ORDER2_GAP:g}",
                f"{dataset} f1: order 2 - linear",
                d["progressive order 2"],
                d["linear"],
                ORDER2_GAP,
            ),
        ]
    return claims


def run(workdir: str, *, quick: bool = False) -> Report:
    return Report.from_record(
        measure(workdir, quick=quick),
        claims_from_results=claims_from_results,
        table=table,
        plots={"tpc_f1_vs_cost.png": plot},
        workdir=workdir,
        quick=quick,
    )


if __name__ == "__main__":  # the README's tables from the committed results
    print(table(results.load("tpc", "full")))
