"""One cached unit of the experiment: a seed's detectors trained, then every verifier on its test
objects.

    row = run(config, run_dir)   # config.exp: what to verify (configs/od_verify.py)

For each of the first `exp.images` test scenes and each eps, per ground-truth object:
- ODPV: Part 1 once per (image, eps), then the status at each tau (`verify.certify`), and the
  certified IoU bound with no refinement (T = 0) and with T refinements (bisection);
- the scalar scenario bound and PGD's IoU;
- on the first `exp.rcp_images` scenes, RCP_N (its own box, the same Part 2, no refinement):
  status, bound and wall time beside ODPV's on the same (image, eps);
- coverage: on the first `exp.coverage_images` scenes, the fraction of `exp.coverage_samples`
  fresh outputs outside Z;
- sample counts at 64x64 and, with a detector trained at 32x32, at 32x32;
- the paper's setting (alpha = beta = 0.0099, N1 = 30k, N2 = 5k, M2 = 2k) on a few objects.
Keys: a seed-derived key per (image, eps) and per part, so every sample set is fresh and the
parts never share samples.
"""

import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from configs import od_verify as od_config
from methods import od_verify as odv
from methods.od_verify import baselines, detector, verify

# Parts' keys: fold_in(key of (image, eps), PART) - disjoint sample sets per part.
PART1, POOL, SCALAR, PGD, RCP, COVER = range(6)


def forwarder(params, config):
    cfg = odv.detector_config(config)
    params = jax.tree.map(jnp.asarray, params)
    return jax.tree_util.Partial(_forward, params, cfg)


def _forward(params, cfg, images_BSS3):
    return detector.forward(params, images_BSS3, cfg)


def _coverage(sampler, z: verify.Z, n: int) -> float:
    outside = 0
    for start in range(0, n, 8192):
        out = sampler.draw(min(8192, n - start))
        outside += int(np.sum(np.any((out < z.lo_N6) | (out > z.hi_N6), axis=(1, 2))))
    return outside / n


def verify_scene(fwd, x0, objects, eps, key, s, exp, with_rcp, with_coverage) -> dict:
    """Every verifier on one (image, eps): per-object records and the timings."""
    sampler = verify.Sampler(fwd, x0, eps, jax.random.fold_in(key, PART1), s.chunk)
    start = time.perf_counter()
    z = verify.part1(sampler, s)
    pool = verify.Pool(verify.Sampler(fwd, x0, eps, jax.random.fold_in(key, POOL), s.chunk), s)
    status = {
        tau: [verify.certify(z, pool, gt, q, tau, s) for gt, q in objects] for tau in exp.taus
    }
    odpv_seconds = time.perf_counter() - start
    rec = {
        "odpv_samples": sampler.count + pool.sampler.count,
        "odpv_seconds": odpv_seconds,
        "c1": z.c1,
        "objects": [],
    }
    if with_rcp:
        rcp_sampler = verify.Sampler(fwd, x0, eps, jax.random.fold_in(key, RCP), s.chunk)
        start = time.perf_counter()
        z_rcp = verify.rcp_box(rcp_sampler, s.alpha, s.beta)
        rcp_status = {
            tau: [verify.certify(z_rcp, None, gt, q, tau, s) for gt, q in objects]
            for tau in exp.taus
        }
        rec |= {"rcp_samples": rcp_sampler.count, "rcp_seconds": time.perf_counter() - start}
    if with_coverage:
        cover = verify.Sampler(fwd, x0, eps, jax.random.fold_in(key, COVER), s.chunk)
        rec["outside"] = _coverage(cover, z, exp.coverage_samples)
    scalar_sampler = verify.Sampler(fwd, x0, eps, jax.random.fold_in(key, SCALAR), s.chunk)
    for k, (gt, q) in enumerate(objects):
        at_x0 = sampler.iou_at_x0(gt, q, s.iota, s.eta)
        t0 = verify.certified_bound(z, pool, gt, q, s, at_x0, refinements=0)
        t1 = verify.certified_bound(z, pool, gt, q, s, at_x0, refinements=s.refinements, lower=t0)
        sampled = baselines.sampled_ious(scalar_sampler, gt, q, s)
        o = {
            "iou_x0": at_x0,
            "odpv_t0": t0,
            "odpv": t1,
            "scalar": float(sampled.min()),
            # The guarantee itself, on fresh samples: P(IoU < bound) <= (1 + T) alpha.
            "below_bound": float(np.mean(sampled < t1 - 1e-6)),
            "pgd": baselines.pgd_iou(
                fwd,
                x0,
                gt,
                q,
                eps,
                jax.random.fold_in(key, PGD + 10 * k),
                steps=exp.pgd_steps,
                restarts=exp.pgd_restarts,
                iota=s.iota,
                eta=s.eta,
            ),
            "status": {f"{tau:g}": status[tau][k].status for tau in exp.taus},
            "spurious": sum(status[tau][k].spurious for tau in exp.taus),
        }
        if with_rcp:
            o["rcp"] = verify.certified_bound(z_rcp, None, gt, q, s, at_x0)
            o["rcp_status"] = {f"{tau:g}": rcp_status[tau][k].status for tau in exp.taus}
        rec["objects"].append(o)
    return rec


def _scene_key(seed, image, eps_index):
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), image), eps_index)


def sample_counts(config, run_dir, s, exp) -> dict:
    """Forward passes per (image, eps) of ODPV's Part 1 and of RCP_N at 64x64 and 32x32."""
    out = {}
    for size in (64, 32):
        c = config
        if size == 32:  # the same size at 32x32 (configs/od_verify.py: its own step count)
            c = od_config.get_config(exp.config32)
            c.seed = config.seed
        params = odv.train_detector(c, os.path.join(run_dir, f"detector{size}"))
        fwd = forwarder(params, c)
        scenes = odv.eval_scenes(c, "test")
        odpv, rcp = [], []
        for i in range(exp.count_images):
            key = _scene_key(config.seed + 1000 * size, i, 0)
            x0 = jnp.asarray(scenes.images_BSS3[i])
            sampler = verify.Sampler(fwd, x0, exp.eps[0], key, s.chunk)
            verify.part1(sampler, s)
            odpv.append(sampler.count)
            rcp_sampler = verify.Sampler(fwd, x0, exp.eps[0], key, s.chunk)
            verify.rcp_box(rcp_sampler, s.alpha, s.beta)
            rcp.append(rcp_sampler.count)
        out |= {
            f"samples/odpv/{size}": float(np.mean(odpv)),
            f"samples/rcp/{size}": float(np.mean(rcp)),
        }
    out["samples/odpv_ratio"] = out["samples/odpv/64"] / out["samples/odpv/32"]
    out["samples/rcp_ratio"] = out["samples/rcp/64"] / out["samples/rcp/32"]
    return out


def paper_setting(fwd, scenes, config, exp) -> dict:
    """ODPV at the paper's configuration on the first `exp.paper_objects` objects (eps =
    exp.paper_eps): its bound (T refinements), forward passes and wall time."""
    s = verify.Settings.from_config(exp.paper)
    bounds, samples, seconds = [], [], []
    firsts = [(i, gt, q) for i in range(len(scenes.images_BSS3)) for gt, q in scenes.objects(i)]
    for i, gt, q in firsts[: exp.paper_objects]:
        key = _scene_key(config.seed + 7, i, 0)
        x0 = jnp.asarray(scenes.images_BSS3[i])
        start = time.perf_counter()
        sampler = verify.Sampler(fwd, x0, exp.paper_eps, key, s.chunk)
        z = verify.part1(sampler, s)
        pool = verify.Pool(
            verify.Sampler(fwd, x0, exp.paper_eps, jax.random.fold_in(key, POOL), s.chunk), s
        )
        at_x0 = sampler.iou_at_x0(gt, q, s.iota, s.eta)
        bounds.append(verify.certified_bound(z, pool, gt, q, s, at_x0, s.refinements))
        samples.append(sampler.count + pool.sampler.count)
        seconds.append(time.perf_counter() - start)
    return {
        "paper/bound": float(np.mean(bounds)),
        "paper/samples": float(np.mean(samples)),
        "paper/seconds": float(np.mean(seconds)),
        "paper/bounds": bounds,
    }


def summarise(scenes_by_eps: dict, exp) -> dict:
    """The row's numbers from the per-(image, eps) records."""
    out, all_objects = {}, []
    rcp_time = odpv_time = 0.0
    for e, recs in scenes_by_eps.items():
        objs = [o for r in recs for o in r["objects"]]
        all_objects += objs
        for name in ("odpv", "odpv_t0", "scalar", "pgd", "iou_x0"):
            out[f"bound/{name}/{e}"] = float(np.mean([o[name] for o in objs]))
        for tau in exp.taus:
            out[f"safe/{e}/tau{tau:g}"] = float(
                np.mean([o["status"][f"{tau:g}"] == "safe" for o in objs])
            )
            out[f"unsafe/{e}/tau{tau:g}"] = float(
                np.mean([o["status"][f"{tau:g}"] == "unsafe" for o in objs])
            )
        with_rcp = [r for r in recs if "rcp_seconds" in r]
        rcp_objs = [o for r in with_rcp for o in r["objects"]]
        if rcp_objs:
            out[f"bound/rcp/{e}"] = float(np.mean([o["rcp"] for o in rcp_objs]))
            out[f"bound/odpv_on_rcp_set/{e}"] = float(np.mean([o["odpv"] for o in rcp_objs]))
        rcp_time += sum(r["rcp_seconds"] for r in with_rcp)
        odpv_time += sum(r["odpv_seconds"] for r in with_rcp)
        outside = [r["outside"] for r in recs if "outside" in r]
        out[f"coverage/outside/{e}"] = float(np.max(outside))
    rcp_all = [o for o in all_objects if "rcp" in o]
    if rcp_all:
        out |= {
            "soundness/rcp_violations": float(sum(o["rcp"] > o["pgd"] + 1e-6 for o in rcp_all)),
            "gap/odpv_minus_rcp": float(np.mean([o["odpv"] - o["rcp"] for o in rcp_all])),
            "gap/pgd_minus_rcp": float(np.mean([o["pgd"] - o["rcp"] for o in rcp_all])),
            "time/odpv": odpv_time,
            "time/rcp": rcp_time,
            "time/ratio": rcp_time / odpv_time,
        }
    out |= {
        "soundness/violations": float(sum(o["odpv"] > o["pgd"] + 1e-6 for o in all_objects)),
        "soundness/sampled_below": float(np.mean([o["below_bound"] for o in all_objects])),
        "soundness/scalar_above_pgd": float(
            np.mean([o["scalar"] > o["pgd"] + 1e-6 for o in all_objects])
        ),
        "refine/raised": float(np.mean([o["odpv"] > o["odpv_t0"] + 1e-6 for o in all_objects])),
        "refine/gain": float(np.mean([o["odpv"] - o["odpv_t0"] for o in all_objects])),
        "gap/pgd_minus_odpv": float(np.mean([o["pgd"] - o["odpv"] for o in all_objects])),
        "gap/pgd_minus_scalar": float(np.mean([o["pgd"] - o["scalar"] for o in all_objects])),
        "spurious": float(sum(o["spurious"] for o in all_objects)),
        "coverage/outside_max": float(max(out[f"coverage/outside/{e}"] for e in scenes_by_eps)),
        "objects": float(len(all_objects) / len(scenes_by_eps)),
    }
    return out


def run(config, run_dir: str) -> dict:
    exp = config.exp
    s = verify.Settings.from_config(config.verify)
    params = odv.train_detector(config, os.path.join(run_dir, "detector64"))
    row = {
        f"detector/map50_{split}": odv.map50(params, config, split)
        for split in ("validation", "test")
    }
    fwd = forwarder(params, config)
    scenes = odv.eval_scenes(config, "test")
    by_eps = {}
    for j, eps_255 in enumerate(exp.eps):
        recs = []
        for i in range(exp.images):
            recs.append(
                verify_scene(
                    fwd,
                    jnp.asarray(scenes.images_BSS3[i]),
                    scenes.objects(i),
                    eps_255 / 255,
                    _scene_key(config.seed, i, j),
                    s,
                    exp,
                    with_rcp=i < exp.rcp_images,
                    with_coverage=i < exp.coverage_images,
                )
            )
            print(f"   eps {eps_255}/255 image {i + 1}/{exp.images}", flush=True)
        by_eps[f"{eps_255:g}"] = recs
    row |= summarise(by_eps, exp)
    if exp.count_images:
        row |= sample_counts(config, run_dir, s, exp)
    if exp.paper_objects:
        row |= paper_setting(fwd, scenes, config, exp)
    row["records"] = by_eps
    return row
