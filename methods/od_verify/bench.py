"""Where ODPV's time goes, and what vectorising the sampler buys.

    python -m launch.bench --methods=od_verify          # a detector trained at the quick size
    python -m launch.bench --methods=od_verify --smoke  # seconds (an untrained detector)

One process, float32, one device, one 64x64 test scene at eps = 2/255:
1. forward passes per second of the sampler: `jit(forward)` on a chunk of perturbed images
   (what `verify.Sampler` runs) against a Python loop of jitted one-image forwards;
2. the split of one verification (every object of the scene, tau = 0.5 and 0.7) among Part 1's
   sampling, Part 2 (interval check and exact search) and Part 3 (its samples and searches);
3. forward passes ODPV needs against RCP_N at equal (alpha, beta), at the CI setting and the
   paper's: N1 + N2 (+ 2M + M2 when a refinement runs) against (2/alpha)(ln(1/beta) + d).
"""

import os
import tempfile
import time

import jax
import jax.numpy as jnp

import methods.od_verify as odv
from configs import od_verify as od_config
from core.benchmark import Ratio, Result, machine, median_seconds
from methods.od_verify import detector, runs, verify


def _detector(smoke: bool):
    config = od_config.get_config("size=smoke" if smoke else "size=quick")
    if smoke:
        return detector.init(jax.random.key(0), odv.detector_config(config)), config
    with tempfile.TemporaryDirectory() as workdir:
        return odv.train_detector(config, os.path.join(workdir, "detector")), config


def _timed_parts(fwd, x0, objects, s):
    """Seconds of Part 1, Part 2 and Part 3 for every object at tau 0.5 and 0.7."""
    verify.part1(verify.Sampler(fwd, x0, 2 / 255, jax.random.key(0), s.chunk), s)  # compiles
    sampler = verify.Sampler(fwd, x0, 2 / 255, jax.random.key(1), s.chunk)
    start = time.perf_counter()
    z = verify.part1(sampler, s)
    part1 = time.perf_counter() - start
    pool = verify.Pool(verify.Sampler(fwd, x0, 2 / 255, jax.random.key(2), s.chunk), s)
    start = time.perf_counter()
    outcomes = [verify.certify(z, pool, gt, q, tau, s) for gt, q in objects for tau in (0.5, 0.7)]
    rest = time.perf_counter() - start
    part3 = pool.sampler.seconds
    return {
        "part1": part1,
        "part2_interval_and_search": rest - part3,
        "part3_sampling": part3,
        "exact_search_solver": float(sum(o.search_seconds for o in outcomes)),
        "decided_by": [o.by for o in outcomes],
        "statuses": [o.status for o in outcomes],
    }


def measure(*, smoke: bool = False) -> Result:
    params, config = _detector(smoke)
    fwd = runs.forwarder(params, config)
    scenes = odv.eval_scenes(config, "test")
    x0 = jnp.asarray(scenes.images_BSS3[0])
    chunk = 64 if smoke else 1024
    images = verify.perturb(jax.random.key(0), x0, 2 / 255, chunk)
    batched = jax.jit(fwd)
    single = jax.jit(lambda x: fwd(x[None])[0])
    vec_s = median_seconds(lambda: jax.block_until_ready(batched(images)), 3)
    loop_n = 32 if smoke else 256
    loop_s = median_seconds(
        lambda: [jax.block_until_ready(single(images[i])) for i in range(loop_n)], 3
    )
    s = verify.Settings.from_config(config.verify)
    parts = _timed_parts(fwd, x0, scenes.objects(0), s)
    n_out = x0.shape[0] // detector.STRIDE
    d = 6 * n_out * n_out
    paper = verify.Settings(alpha=0.0099, beta=0.0099, n1=30_000, n2=5_000, m2=2_000)
    counts = {}
    for name, st in (("ci", s), ("paper", paper)):
        counts[name] = {
            "odpv": st.n1 + st.n2_used + 2 * st.pairs + st.m2,
            "rcp_n": verify.scenario_count(st.alpha, st.beta, d),
        }
    ratios = [
        Ratio(
            "sampler forward passes/s (64x64, eps 2/255)",
            f"jit over a chunk of {chunk}",
            chunk / vec_s,
            "Python loop of jitted single forwards",
            loop_n / loop_s,
            "images/s",
        ),
        Ratio(
            f"forward passes at equal guarantees, alpha = beta = 0.05 (output d = {d})",
            "RCP_N",
            counts["ci"]["rcp_n"],
            "ODPV (with one refinement's samples)",
            counts["ci"]["odpv"],
            "passes",
        ),
        Ratio(
            "forward passes at the paper's alpha = beta = 0.0099",
            "RCP_N",
            counts["paper"]["rcp_n"],
            "ODPV (N1 30k, N2 5k, M2 2k)",
            counts["paper"]["odpv"],
            "passes",
        ),
        Ratio(
            "one verification: Part 1 sampling vs Parts 2 + 3",
            "Part 1",
            parts["part1"],
            "Parts 2 + 3",
            parts["part2_interval_and_search"] + parts["part3_sampling"],
            "s",
        ),
    ]
    details = {
        "chunk": chunk,
        "vectorised_seconds": vec_s,
        "loop_images": loop_n,
        "loop_seconds": loop_s,
        "parts": parts,
        "counts": counts,
        "output_dim": d,
        "machine": machine(),
    }
    notes = [
        f"decided by {', '.join(parts['decided_by'])}; the exact searches took "
        f"{parts['exact_search_solver']:.2f} s of SCIP time"
    ]
    return Result(ratios, details, notes)
