"""Why PGD goes below the certified bound: a diagnostic, no claim.

    python -m methods.od_verify.diagnose --workdir=<out>/workdirs/od_verify

ODPV certifies P_x(safe) >= 1 - alpha for x uniform on the L-inf ball; PGD looks for the worst
x. For the confidence s(x) of each object's best correct candidate at x0, to first order
s(x0 + d) - s(x0) = g . d with g its input gradient. Under the uniform distribution that change
has standard deviation eps ||g||_2 / sqrt(3); the worst case is eps ||g||_1. Their ratio,
sqrt(3) ||g||_1 / ||g||_2, grows like the square root of the input size (12,288 numbers at
64x64x3) when the gradient is spread out. The script measures, per object of the first test
scenes at eps = 2/255 and each seed's trained detector (its workdir from the full run):
the linear ratio, and the same two quantities measured: the confidence drop of one signed
gradient step of size eps, over the standard deviation over 2,000 uniform samples. Rows go to
methods/od_verify/results/diagnosis.json.
"""

import glob
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

import methods.od_verify as odv
from core.experiment_runner import Arm
from methods.od_verify import boxes, experiment, runs, verify

EPS = 2 / 255
IMAGES = 10


def _confidence(fwd, index, q):
    return lambda x_SS3: fwd(x_SS3[None])[0, index, 4 + q]


def object_rows(fwd, scenes, iota=0.25, eta=0.45) -> list[dict]:
    rows = []
    for i in range(IMAGES):
        x0 = jnp.asarray(scenes.images_BSS3[i])
        out0 = fwd(x0[None])[0]
        keep = np.asarray(boxes.nms_keep(out0, iota, eta))
        for gt, q in scenes.objects(i):
            iou = np.asarray(boxes.iou(out0[:, :4], jnp.asarray(gt)))
            correct = keep & (np.asarray(out0[:, 4:]).argmax(1) == q)
            if not correct.any():
                continue
            index = int(np.argmax(np.where(correct, iou, -1)))
            conf = _confidence(fwd, index, q)
            g = np.asarray(jax.grad(conf)(x0)).ravel()
            step = float(conf(x0) - conf(jnp.clip(x0 - EPS * jnp.sign(g.reshape(x0.shape)), 0, 1)))
            noise = verify.perturb(jax.random.key(i), x0, EPS, 2000)
            spread = float(np.std(np.asarray(fwd(noise)[:, index, 4 + q])))
            rows.append({
                "image": i, "confidence": float(conf(x0)),
                "linear_ratio": float(np.sqrt(3) * np.abs(g).sum() / np.linalg.norm(g)),
                "signed_step_drop": step, "uniform_std": spread,
                "measured_ratio": step / max(spread, 1e-12),
            })  # fmt: skip
    return rows


def _seed_of(detector_dir: str) -> int:
    with open(os.path.join(detector_dir, "config.json")) as f:
        return json.load(f)["seed"]


def main(argv: list[str]) -> None:
    workdir = next((a.split("=", 1)[1] for a in argv[1:] if a.startswith("--workdir=")), None)
    if workdir is None:
        raise SystemExit("usage: python -m methods.od_verify.diagnose --workdir=<experiment dir>")
    out = []
    for seed in experiment.SEEDS:
        config = experiment.config_of(Arm("odpv"), {}, seed, quick=False)
        dirs = [d for d in glob.glob(os.path.join(workdir, "runs", "*", "detector64"))
                if _seed_of(d) == seed]  # fmt: skip
        if not dirs:
            raise SystemExit(f"od_verify: no seed-{seed} detector under {workdir}/runs")
        fwd = runs.forwarder(odv.train_detector(config, dirs[0]), config)
        rows = object_rows(fwd, odv.eval_scenes(config, "test"))
        out.append({"seed": seed, "objects": rows})
        ratios = [r["measured_ratio"] for r in rows]
        linear = [r["linear_ratio"] for r in rows]
        print(f"seed {seed}: {len(rows)} objects, measured ratio median {np.median(ratios):.0f}"
              f", linear {np.median(linear):.0f}")  # fmt: skip
    path = os.path.join(os.path.dirname(__file__), "results", "diagnosis.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"eps": EPS, "images": IMAGES, "seeds": out}, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main(sys.argv)
