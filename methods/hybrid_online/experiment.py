"""Does FTRL-FW reach sqrt(T) regret where FTL's is linear, at O(T^2) oracle calls, and does
the games corollary's exploitability fall like 1/sqrt(m)? (The paper has no experiments; this
is a numerical study of our own design.)

Main part: X = [0, 1], D = U[0, 1], H = thresholds, R = thresholds and reversed thresholds,
the absolute loss (linear in the prediction, so an improper mixture cannot beat the best fixed
threshold merely by hedging at 1/2, as it does under the squared loss), every learner (FTRL-FW,
FTL, Hedge, FTPL) against every adversary (adaptive anti-learner, two-function FTL-killer,
oblivious random) at each T of the grid, 10 seeds. Each seed fixes the data, the adversary's
fresh samples and the learners' noise (one key). Extra parts, adaptive adversary only:
Beta(2, 5) data, the squared loss, and intervals as H and R. The game: m samples, 10 seeds.

Claims (margins fixed in this file before the first full run), on bootstrap intervals over the
seeds of per-seed numbers:
- slopes are fitted per seed (least squares of log regret on log T), then compared: FTL's slope
  exceeds FTRL-FW's by > 0.3 (paired by seed; quick: > 0.2 at T = 100..400);
- FTRL-FW's slope lies in [0.3, 0.7] (about 0.5); Hedge's below 0.7; FTL's above 0.9;
- regret / sqrt(T log T) of FTRL-FW does not grow: its value at the largest T minus that at
  the smallest stays below 0.1 (per seed);
- the Frank-Wolfe gap is <= epsilon in every round of every FTRL-FW run (a count: 0);
- the fitted exponent of FTRL-FW's total oracle calls against T lies in [1.5, 2.5] (O(T^2));
- the game's exploitability falls like 1/sqrt(m): its fitted slope in log m lies in
  [-0.75, -0.35];
- Beta(2, 5) data: FTL's slope still exceeds FTRL-FW's by > 0.3.

Each learner's one free scale (FTRL-FW: eta's multiplier; Hedge: its rate's; FTPL: its noise's)
is chosen from the same grid (0.25, 0.5, 1, 2) by the mean regret on validation seeds (100-102) at
T = 500 against the adaptive adversary: the same budget and rule for the method and the
baselines. Everything runs in float64 (`jax.enable_x64`): the stopping rule compares gaps of
order 1 to sums of thousands of terms.
"""

import dataclasses
import math
import os
import time

import jax
import numpy as np

from core import results, selection
from core.claims import Claim, IntervalClaim, Report
from methods.hybrid_online import game
from methods.hybrid_online import learner as ftrl
from methods.hybrid_online import simulate as sim

SCALE_GRID = (0.25, 0.5, 1.0, 2.0)
VALIDATION_SEEDS = (100, 101, 102)
TUNED = ("ftrl_fw", "hedge", "ftpl")  # FTL has nothing to tune


@dataclasses.dataclass(frozen=True)
class Settings:
    T_grid: tuple
    seeds: tuple
    learners: tuple
    adversaries: tuple
    extras: bool  # the extra parts (EXTRAS), each with its own T grid
    game_m: tuple  # the game's sample sizes (empty: no game)
    select_T: int  # 0: no selection (scale 1 for every learner)
    slope_margin: float  # FTL slope - FTRL-FW slope


FULL = Settings(
    T_grid=(250, 500, 1000, 2000),
    seeds=tuple(range(10)),
    learners=("ftrl_fw", "ftl", "hedge", "ftpl"),
    adversaries=("adaptive", "two_function", "oblivious"),
    extras=True,
    game_m=(100, 200, 400, 800, 1600),
    select_T=500,
    slope_margin=0.3,
)
# Quick: the headline claim alone at small T, 3 seeds, no selection (scale 1): ~30 s.
QUICK = Settings((100, 200, 400), (0, 1, 2), ("ftrl_fw", "ftl"), ("adaptive",), False, (), 0, 0.2)
EXTRAS = {  # part -> (learners, T grid, Spec fields); adaptive adversary
    "beta25": (("ftrl_fw", "ftl"), (250, 500, 1000), dict(distribution="beta25")),
    # The squared loss's curvature makes Frank-Wolfe need ~10x the calls (35k at T = 250):
    # T = 1000 would cost ~5 minutes here, so this part stops at 500.
    "squared": (("ftrl_fw", "ftl", "hedge"), (250, 500), dict(loss="squared")),
    "intervals": (
        ("ftrl_fw", "ftl"),
        (250, 500, 1000),
        dict(h_class="intervals", r_class="intervals"),
    ),
}


def spec(learner, T, adversary, scales, *, loss="absolute", h_class="thresholds", **fields):
    scale = scales.get(learner, 1.0)
    s = ftrl.settings(
        T, loss=loss, h_class=h_class, eta_scale=scale if learner == "ftrl_fw" else 1.0
    )
    return sim.Spec(learner, s, scale, adversary, **fields)


def play(sp: sim.Spec, seed: int) -> dict:
    """One run's row: regret, losses, oracle calls, and gap / epsilon at its worst round."""
    start = time.perf_counter()
    with jax.enable_x64(True):
        run = jax.device_get(sim.simulate(sp, jax.random.PRNGKey(seed)))
    s = sp.settings
    tolerance = s.eta * s.epsilon
    return {
        "learner": sp.learner,
        "adversary": sp.adversary,
        "T": s.T,
        "seed": seed,
        "regret": float(run.regret),
        "loss": float(np.sum(run.loss_T)),
        "best_fixed": float(run.best_fixed),
        "oracle_calls": int(np.sum(run.calls_T)),
        "gap_over_epsilon": float(np.max(run.gap_T) / tolerance)
        if sp.learner == "ftrl_fw"
        else 0.0,
        "violations": int(np.sum(run.gap_T > tolerance)),
        "eta": s.eta,
        "scale": sp.scale,
        "seconds": time.perf_counter() - start,
    }


def choose_scales(s: Settings) -> tuple[dict, dict]:
    """Each tuned learner's scale from SCALE_GRID by mean validation regret (min)."""
    if not s.select_T:
        return {}, {}
    chosen, info = {}, {}
    for learner in TUNED:
        by_point = {}
        for scale in SCALE_GRID:
            sp = spec(learner, s.select_T, "adaptive", {learner: scale})
            by_point[(scale,)] = {seed: play(sp, seed)["regret"] for seed in VALIDATION_SEEDS}
        scores = selection.ValidationScores("validation/regret", by_point)
        picked = selection.select({"scale": SCALE_GRID}, scores, rule="min")
        chosen[learner] = picked.point["scale"]
        info[learner] = {
            "means": {f"{k[0]:g}": v for k, v in picked.means.items()},
            "edge": picked.edges["scale"],
        }
        print(f"-- hybrid_online: {learner} scale {chosen[learner]:g} {info[learner]}", flush=True)
    return chosen, info


def measure(s: Settings, *, quick: bool) -> dict:
    chosen, info = choose_scales(s)
    rows = []
    for T in s.T_grid:
        for adversary in s.adversaries:
            for learner in s.learners:
                sp = spec(learner, T, adversary, chosen)
                part_rows = [{"part": "main", **play(sp, seed)} for seed in s.seeds]
                rows += part_rows
                mean = np.mean([r["regret"] for r in part_rows])
                print(
                    f"-- hybrid_online: T={T} {adversary} {learner} regret {mean:.1f}", flush=True
                )
    for part, (learners, T_grid, fields) in EXTRAS.items() if s.extras else ():
        for T in T_grid:
            for learner in learners:
                sp = spec(learner, T, "adaptive", chosen, **fields)
                rows += [{"part": part, **play(sp, seed)} for seed in s.seeds]
                print(f"-- hybrid_online: {part} T={T} {learner}", flush=True)
    for m in s.game_m:
        with jax.enable_x64(True):
            q = np.asarray(game.quadrature("uniform"))
            for seed in s.seeds:
                start = time.perf_counter()
                value, calls = jax.device_get(
                    game.play(jax.random.PRNGKey(seed), q, m=m, distribution="uniform")
                )
                rows.append(
                    {"part": "game", "m": m, "seed": seed, "exploitability": float(value),
                     "oracle_calls": int(calls), "seconds": time.perf_counter() - start}
                )  # fmt: skip
    return results.record(
        "hybrid_online",
        "quick" if quick else "full",
        config={
            "quick": quick,
            "settings": dataclasses.asdict(s),
            "extras": {
                k: {"learners": list(v[0]), "T_grid": list(v[1]), **v[2]} for k, v in EXTRAS.items()
            },
            "scale_grid": list(SCALE_GRID),
            "validation_seeds": list(VALIDATION_SEEDS),
            "chosen_scales": chosen,
            "selection": info,
            "fresh_sample": sim.FRESH,
            "game_quadrature": game.QUADRATURE,
        },
        rows=rows,
    )


# ------------------------------------------------------------------------------ claims


def fitted_slopes(rows, y_key: str, x_key: str, **where) -> dict:
    """{seed: least-squares slope of log(row[y_key]) on log(row[x_key])} over the rows matching
    `where`; a seed with a non-positive value has no slope (left out)."""
    by_seed: dict = {}
    for row in rows:
        if all(row.get(k) == v for k, v in where.items()):
            by_seed.setdefault(row["seed"], []).append((row[x_key], row[y_key]))
    slopes = {}
    for seed, points in by_seed.items():
        x, y = np.array(sorted(points), float).T
        if np.all(y > 0) and len(x) >= 2:
            slopes[seed] = float(np.polyfit(np.log(x), np.log(y), 1)[0])
    return slopes


def normalised_growth(rows, learner: str, adversary: str = "adaptive") -> dict:
    """{seed: regret/sqrt(T log T) at the largest T minus at the smallest T}."""
    chosen = [r for r in rows if r.get("part") == "main" and r["learner"] == learner
              and r["adversary"] == adversary]  # fmt: skip
    T_lo, T_hi = min(r["T"] for r in chosen), max(r["T"] for r in chosen)
    ratio = lambda r: r["regret"] / math.sqrt(r["T"] * math.log(r["T"]))
    lo = {r["seed"]: ratio(r) for r in chosen if r["T"] == T_lo}
    return {r["seed"]: ratio(r) - lo[r["seed"]] for r in chosen if r["T"] == T_hi}


def claims_from_results(record: dict) -> list:
    s = record["config"]["settings"]
    rows = record["rows"]
    main = dict(part="main", adversary="adaptive")
    slope = {
        name: fitted_slopes(rows, "regret", "T", learner=name, **main) for name in s["learners"]
    }
    T_range = f"T = {min(s['T_grid'])}..{max(s['T_grid'])}"
    claims = [
        IntervalClaim.beats(
            f"the adaptive adversary makes FTL's regret grow faster than FTRL-FW's: fitted "
            f"log-log slopes differ by > {s['slope_margin']:g} ({T_range}, paired by seed)",
            "regret slope: ftl - ftrl_fw",
            slope["ftl"],
            slope["ftrl_fw"],
            s["slope_margin"],
        ),
    ]
    ftrl_rows = [r for r in rows if r.get("learner") == "ftrl_fw"]
    claims.append(
        Claim(
            "the Frank-Wolfe duality gap is <= epsilon in every round (all FTRL-FW runs)",
            "rounds with gap > epsilon",
            float(sum(r["violations"] for r in ftrl_rows)),
            "<=",
            0.0,
        )
    )
    if record["config"]["quick"]:
        return claims
    claims += [
        IntervalClaim.at_least("FTRL-FW's regret grows like sqrt(T): slope >= 0.3",
                               "ftrl_fw/regret slope", slope["ftrl_fw"], 0.3),
        IntervalClaim.at_most("FTRL-FW's regret grows like sqrt(T): slope <= 0.7",
                              "ftrl_fw/regret slope", slope["ftrl_fw"], 0.7),
        IntervalClaim.at_most("Hedge over a threshold grid: slope <= 0.7",
                              "hedge/regret slope", slope["hedge"], 0.7),
        IntervalClaim.at_least("FTL's regret is linear under the adaptive adversary: slope >= 0.9",
                               "ftl/regret slope", slope["ftl"], 0.9),
        IntervalClaim.at_most(
            f"FTRL-FW's regret / sqrt(T log T) stays bounded: its change from T = "
            f"{min(s['T_grid'])} to {max(s['T_grid'])} is < 0.1",
            "ftrl_fw/regret/sqrt(T log T): largest T - smallest T",
            normalised_growth(rows, "ftrl_fw"),
            0.1,
        ),
    ]  # fmt: skip
    calls = fitted_slopes(rows, "oracle_calls", "T", learner="ftrl_fw", **main)
    claims += [
        IntervalClaim.at_least("FTRL-FW's total oracle calls grow as T^2: exponent >= 1.5",
                               "ftrl_fw/oracle-call exponent", calls, 1.5),
        IntervalClaim.at_most("FTRL-FW's total oracle calls grow as T^2: exponent <= 2.5",
                              "ftrl_fw/oracle-call exponent", calls, 2.5),
    ]  # fmt: skip
    game_slope = fitted_slopes(rows, "exploitability", "m", part="game")
    claims += [
        IntervalClaim.at_most("the game's exploitability falls like 1/sqrt(m): slope <= -0.35",
                              "game/exploitability slope in m", game_slope, -0.35),
        IntervalClaim.at_least("the game's exploitability falls like 1/sqrt(m): slope >= -0.75",
                               "game/exploitability slope in m", game_slope, -0.75),
    ]  # fmt: skip
    beta = dict(part="beta25", adversary="adaptive")
    claims.append(
        IntervalClaim.beats(
            f"on Beta(2, 5) data too, FTL's slope exceeds FTRL-FW's by > {s['slope_margin']:g}",
            "beta25 regret slope: ftl - ftrl_fw",
            fitted_slopes(rows, "regret", "T", learner="ftl", **beta),
            fitted_slopes(rows, "regret", "T", learner="ftrl_fw", **beta),
            s["slope_margin"],
        )
    )
    return claims


# ------------------------------------------------------------------------------ figure


def plot(record: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = record["config"]["settings"]
    rows = [r for r in record["rows"] if r.get("part") == "main"]
    fig, axes = plt.subplots(1, len(s["adversaries"]), figsize=(4.2 * len(s["adversaries"]), 3.6),
                             squeeze=False)  # fmt: skip
    styles = {"ftrl_fw": "C0o-", "ftl": "C3s-", "hedge": "C2^-", "ftpl": "C1v-"}
    for ax, adversary in zip(axes[0], s["adversaries"], strict=True):
        for learner in s["learners"]:
            T = np.array(s["T_grid"], float)
            regret = [[r["regret"] for r in rows if r["learner"] == learner
                       and r["adversary"] == adversary and r["T"] == t] for t in T]  # fmt: skip
            mean = np.array([np.mean(v) for v in regret])
            err = np.array(
                [np.std(v, ddof=1) / np.sqrt(len(v)) if len(v) > 1 else 0 for v in regret]
            )
            shown = mean > 0  # a log axis shows positive mean regret only
            ax.errorbar(T[shown], mean[shown], err[shown], fmt=styles[learner], label=learner,
                        capsize=2, ms=4)  # fmt: skip
        T = np.array(s["T_grid"], float)
        ax.plot(T, 0.5 * T, "k:", lw=0.8, label="slope 1")
        ax.plot(T, 2 * np.sqrt(T), "k--", lw=0.8, label="slope 1/2")
        ax.set(xscale="log", yscale="log", xlabel="T", title=f"adversary: {adversary}")
    axes[0][0].set_ylabel("regret (mean over seeds, +- s.e.)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(workdir: str, *, quick: bool = False) -> Report:
    s = QUICK if quick else FULL
    record = measure(s, quick=quick)
    claims = claims_from_results(record)
    os.makedirs(workdir, exist_ok=True)
    figure = os.path.join(workdir, "hybrid_online_regret.png")
    plot(record, figure)
    return Report(
        method="hybrid_online",
        claims=claims,
        metrics={
            c.metric: (c.interval.to_dict() if hasattr(c, "interval") else c.measured)
            for c in claims
        },  # fmt: skip
        command="python -m launch.reproduce --methods=hybrid_online"
        + (" --quick" if quick else ""),
        figures=[figure],
        results=record,
    )
