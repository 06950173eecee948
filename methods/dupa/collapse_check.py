"""Does DUPA's alignment loss saturate by collapse (one projector output for every input)?

    python -m methods.dupa.collapse_check --workdir=/tmp/collapse_runs

For each run under --workdir (a folder per run with config.json and a checkpoint, as
`core.train` writes them) whose arm aligns paths (dupa, dupa_sg): the final checkpoint's
`params` (what the alignment loss trains; not the EMA) and the same seed's step-0 params, on
the first NUM_IMAGES test images with the true labels, two independent (t, eps) per image as in
training (`align.paths_forward`), the projected tokens z and, for comparison, the encoder tokens
at the alignment block:

    same       mean token cosine between the two paths of the same image (what the loss sees)
    cross      mean token cosine between different images' path-0 tokens at the same position
    spread     sqrt(sum over dims of the variance across images) / mean token norm, averaged
               over token positions (0: every image gives the same vector)

Collapse: same ~ cross ~ 1 and spread ~ 0.
"""

import functools
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import app, flags
from ml_collections import ConfigDict

import methods.dupa as dupa
from core import digits
from core.train import seed_key
from methods.dupa import align

NUM_IMAGES = 128
ALIGNING_ARMS = ("dupa", "dupa_sg")

_WORKDIR = flags.DEFINE_string("workdir", None, "Folder of run folders (config.json, checkpoints).")


def collapse_metrics(z_KBNP) -> dict[str, float]:
    """same / cross / spread (module docstring) of tokens z [K >= 2, B >= 2, N, P]. NumPy, in
    float64: a few small reductions on the host, nothing worth compiling."""
    z_KBNP = np.asarray(z_KBNP, np.float64)
    B = z_KBNP.shape[1]
    u_KBNP = z_KBNP / (np.linalg.norm(z_KBNP, axis=-1, keepdims=True) + 1e-8)
    same = np.mean(np.sum(u_KBNP[0] * u_KBNP[1], axis=-1))
    gram_NBB = np.einsum("inp,jnp->nij", u_KBNP[0], u_KBNP[0])
    off_diagonal = gram_NBB.sum() - np.trace(gram_NBB, axis1=1, axis2=2).sum()
    cross = off_diagonal / (gram_NBB.shape[0] * B * (B - 1))
    spread_N = np.sqrt(np.var(z_KBNP[0], axis=0).sum(-1))
    norm_N = np.linalg.norm(z_KBNP[0], axis=-1).mean(0)
    spread = np.mean(spread_N / norm_N)
    return {"same": float(same), "cross": float(cross), "spread": float(spread)}


@functools.partial(jax.jit, static_argnames=("cfg", "align_at"))
def tokens(cfg, params, x_BHWC, y_B, rng, *, align_at):
    """Encoder tokens at `align_at` and their projections, two (t, eps) paths per image."""
    out = align.paths_forward(cfg, params["net"], x_BHWC, y_B, rng, paths=2, align_at=align_at)
    features_KBND = out.features_KBND.astype(jnp.float32)
    return features_KBND, align.project(params["projector"], features_KBND)


def measure(config, params, x_BHWC, y_B, rng) -> dict[str, dict[str, float]]:
    """collapse_metrics of the projected tokens and of the encoder tokens they come from."""
    cfg, at = dupa.model_config(config), dupa.align_name(config)
    features_KBND, z_KBNP = tokens(cfg, params, x_BHWC, y_B, rng, align_at=at)
    return {"projected": collapse_metrics(z_KBNP), "encoder": collapse_metrics(features_KBND)}


def initial_params(config):
    """The step-0 params of `config.seed`, drawn as core.train draws them."""
    init_rng, _ = jax.random.split(jnp.asarray(seed_key(config.seed)))
    settings = dupa.Settings(config)
    return dupa.init(dupa.model_config(config), settings, None, init_rng, None)["params"]


def final_params(run_dir: pathlib.Path):
    steps = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    if not steps:
        raise SystemExit(f"{run_dir}: no checkpoint (was it trained with checkpoint_every=0?)")
    state = ocp.StandardCheckpointer().restore(run_dir / "checkpoints" / str(steps[-1]) / "state")
    return steps[-1], state["params"]


def main(argv):
    del argv
    split = digits.load_splits().test
    x_BHWC, y_B = jnp.asarray(split.images[:NUM_IMAGES]), jnp.asarray(split.labels[:NUM_IMAGES])
    rng = jax.random.PRNGKey(0)  # the same (t, eps) draws for every run and checkpoint
    print("arm      seed step tokens    | same   cross  spread")
    for run_dir in sorted(pathlib.Path(_WORKDIR.value).iterdir()):
        if not (run_dir / "config.json").is_file():
            continue
        config = ConfigDict(json.loads((run_dir / "config.json").read_text()))
        if config.dupa.arm not in ALIGNING_ARMS:
            continue
        step, trained = final_params(run_dir)
        for at, params in ((0, initial_params(config)), (step, trained)):
            for tokens, m in measure(config, params, x_BHWC, y_B, rng).items():
                print(
                    f"{config.dupa.arm:8s} {config.seed:4d} {at:4d} {tokens:9s} | "
                    f"{m['same']:.3f}  {m['cross']:.3f}  {m['spread']:.3f}"
                )


if __name__ == "__main__":
    flags.mark_flag_as_required("workdir")
    app.run(main)
