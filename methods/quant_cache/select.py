"""The two choices of the experiment, made on validation data only: which bit setting makes the
Q + C degradation visible, and VC's clamp eps. FD-digits against the validation images, with a
sampling seed (100) disjoint from the test seeds (0, 1, 2); the test split is not read.

    python -m methods.quant_cache.select --workdir=/tmp/qc_select   # writes results/select.json

1. Bits: every setting of BIT_LADDER alone and with a cache interval of 2. Rule: the first rung
   where quantisation alone at least doubles full precision's FD (a degradation a fix can be
   measured against: the effect must be visible before a fix is claimed).
2. eps: Q+C+VC at the chosen bits over EPS_GRID; the lowest FD; it must not sit on the grid's
   edge.
"""

import json
import os
import sys

import jax

from configs import quant_cache as qc_config
from core import cache, results, train
from methods.quant_cache import experiment, make
from methods.quant_cache.experiment import model_dir, train_config

BIT_LADDER = ("w8a8", "w4a8", "w4a6", "w3a8", "w4a4")
EPS_GRID = (0.1, 0.3, 1.0, 3.0, 10.0)
SEED = 100


def _evaluate(settings: str, workdir: str, *, eps: float = 1.0) -> dict:
    c = qc_config.get_config("size=full,stage=transform")
    c.seed, c.quant_cache.eval_split = SEED, "validation"
    c.quant_cache.settings, c.quant_cache.vc_eps = settings, eps
    c.train.init_from = model_dir(c)
    tc = train_config(c)
    for config, where in ((tc, c.train.init_from), (c, _run_dir(workdir, settings, eps))):
        result = train.run(config, make(config), where, devices=jax.devices()[:1])
        if result.preempted:  # a half-trained model must never be scored: stop here
            raise SystemExit(f"preempted in {where}; run the same command again to resume")
    row = result.history[-1]
    return {k.removeprefix("eval/"): v for k, v in row.items() if k.endswith("/fd")}


def _cached_evaluate(settings: str, workdir: str, *, eps: float = 1.0) -> dict:
    """`_evaluate` through the run cache (an interrupted selection reruns only what is new)."""
    code = results.source_hash(experiment.EXPERIMENT.sources)
    key = {"settings": settings, "eps": eps, "seed": SEED, "split": "validation"}
    return cache.cached(
        lambda: _evaluate(settings, workdir, eps=eps),
        config=key,
        code=code,
        root=os.path.join(workdir, "cache"),
    )


def _run_dir(workdir: str, settings: str, eps: float) -> str:
    return os.path.join(workdir, f"{settings.replace('/', '_')}_eps{eps:g}")


def choose(workdir: str) -> dict:
    ladder = "/".join(["fp", "c2", *(s for b in BIT_LADDER for s in (b, f"{b}+c2"))])
    fd = _cached_evaluate(ladder, workdir)
    bits = next((b for b in BIT_LADDER if fd[f"{b}/fd"] >= 2 * fd["fp/fd"]), None)
    if bits is None:
        raise RuntimeError(f"no rung of {BIT_LADDER} doubles FD(fp) = {fd['fp/fd']:.2f}")
    vc = {
        eps: _cached_evaluate(f"{bits}+c2+vc", workdir, eps=eps)[f"{bits}+c2+vc/fd"]
        for eps in EPS_GRID
    }
    eps = min(vc, key=vc.get)
    return {
        "seed": SEED,
        "split": "validation",
        "fd": fd,
        "bits": bits,
        "vc_fd_by_eps": {f"{e:g}": v for e, v in vc.items()},
        "vc_eps": eps,
        "vc_eps_on_edge": eps in (EPS_GRID[0], EPS_GRID[-1]),
    }


def main(argv) -> None:
    workdir = next((a.split("=", 1)[1] for a in argv if a.startswith("--workdir=")), None)
    workdir = workdir or "/tmp/quant_cache_select"
    chosen = choose(workdir)
    path = os.path.join(os.path.dirname(results.path("quant_cache", "full")), "select.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(chosen, f, indent=1)
    print(json.dumps({k: v for k, v in chosen.items() if k != "fd"}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv)
