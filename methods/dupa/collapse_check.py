"""Does DUPA's alignment loss saturate by collapse (one output for every input, or a code of the
label both paths share)? Two uses:

    python -m methods.dupa.collapse_check --workdir=/tmp/collapse_runs    # trained runs
    python -m methods.dupa.collapse_check --gate=none:null:infonce,projector:shared:cosine

--workdir: for each run folder (config.json and a checkpoint, as `core.train` writes them) whose
arm aligns paths (dupa, dupa_sg): the final checkpoint's `params` (what the alignment loss
trains; not the EMA) and the same seed's step-0 params, on the first NUM_IMAGES test images with
the true labels, one (t, eps) draw (key 0). --gate: the gate of tests/methods/test_dupa_gate.py
(`gate`, `passes_gate`) for each form align_head:align_label:align_loss (methods/dupa
ALIGN_OPTIONS) and seed (--seeds, default 0): --steps (default GATE_STEPS) steps from
scratch, then every validation image, GATE_DRAWS draws. Both measure two independent (t, eps)
per image as in training (`align.paths_forward`), the aligned tokens z (what the loss compares)
and, for comparison, the encoder tokens at the alignment block:

    same              mean token cosine between the two paths of the same image
    cross             mean token cosine between different images' path-0 tokens at the same
                      position
    cross_same_class  the same over pairs of different images with the same label
    spread            sqrt(sum over dims of the variance across images) / mean token norm,
                      averaged over token positions (0: every image gives the same vector)

Collapse: same ~ cross ~ 1 and spread ~ 0. A code of the label: same ~ cross_same_class ~ 1
while cross is lower (the gate reads same - cross_same_class, which both make ~0).
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
from configs import dupa as dupa_config
from core import digits, train
from core.nn import dit
from core.train import seed_key
from methods.dupa import align

NUM_IMAGES = 128
ALIGNING_ARMS = ("dupa", "dupa_sg")
# The gate (tests/methods/test_dupa_gate.py; README, "Re-test (issue 47)"): GATE_STEPS steps of
# DUPA at the experiment's size, measured on the validation split over GATE_DRAWS (t, eps) draws.
# GATE_GAP: the collapsed forms give a gap of <= 0.001, the re-test's 0.074-0.088 (seeds 0-2);
# one draw's gap has a sd of ~0.023, the mean of 4 ~0.011: 0.03 is 30x the first and ~4 sd below
# the second (README, "Re-test (issue 47)").
GATE_STEPS = 50
GATE_SIZE = "full"
GATE_DRAWS = 4
GATE_GAP = 0.03

_WORKDIR = flags.DEFINE_string("workdir", None, "Folder of run folders (config.json, checkpoints).")
_GATE = flags.DEFINE_list("gate", None, "Forms align_head:align_label:align_loss to gate.")
_SEEDS = flags.DEFINE_list("seeds", ["0"], "The gate's seeds.")
_STEPS = flags.DEFINE_integer("steps", GATE_STEPS, "The gate's training steps.")


def collapse_metrics(z_KBNP, labels_B=None) -> dict[str, float]:
    """same / cross / spread (module docstring) of tokens z [K >= 2, B >= 2, N, P], and with the
    images' labels cross_same_class. NumPy, in float64: a few small reductions on the host."""
    z_KBNP = np.asarray(z_KBNP, np.float64)
    B = z_KBNP.shape[1]
    u_KBNP = z_KBNP / (np.linalg.norm(z_KBNP, axis=-1, keepdims=True) + 1e-8)
    same = np.mean(np.sum(u_KBNP[0] * u_KBNP[1], axis=-1))
    gram_BB = np.einsum("inp,jnp->ij", u_KBNP[0], u_KBNP[0]) / z_KBNP.shape[2]  # mean over N
    other_BB = ~np.eye(B, dtype=bool)
    out = {"same": float(same), "cross": float(gram_BB[other_BB].mean())}
    if labels_B is not None:
        labels_B = np.asarray(labels_B)
        same_class_BB = (labels_B[:, None] == labels_B[None, :]) & other_BB
        out["cross_same_class"] = float(gram_BB[same_class_BB].mean())
    spread_N = np.sqrt(np.var(z_KBNP[0], axis=0).sum(-1))
    norm_N = np.linalg.norm(z_KBNP[0], axis=-1).mean(0)
    out["spread"] = float(np.mean(spread_N / norm_N))
    return out


@functools.partial(jax.jit, static_argnames=("cfg", "align_at", "head", "align_label"))
def tokens(cfg, params, x_BHWC, y_B, rng, *, align_at, head, align_label=None):
    """Encoder tokens at `align_at` and what the alignment loss compares (`align.aligned_tokens`),
    two (t, eps) paths per image, as the loss computes them (`align_label`: paths_forward's)."""
    out = align.paths_forward(
        cfg, params["net"], x_BHWC, y_B, rng, paths=2, align_at=align_at, align_label=align_label
    )
    features_KBND = out.features_KBND.astype(jnp.float32)
    return features_KBND, align.aligned_tokens(head, params, features_KBND)


def measure(config, params, x_BHWC, y_B, rng) -> dict[str, dict[str, float]]:
    """collapse_metrics of the aligned tokens (what the loss compares) and of the encoder tokens
    they come from, both as the loss computes them (with the null label under align_label
    "null"); cross_same_class from the true labels y_B."""
    cfg, settings = dupa.model_config(config), dupa.Settings(config)
    features_KBND, z_KBNP = tokens(
        cfg,
        params,
        x_BHWC,
        y_B,
        rng,
        align_at=settings.align_at,
        head=settings.align_head,
        align_label=dit.null_label(cfg) if settings.align_null_label else None,
    )
    return {
        "aligned": collapse_metrics(z_KBNP, y_B),
        "encoder": collapse_metrics(features_KBND, y_B),
    }


def gate_config(align: dict, *, size=GATE_SIZE, steps=GATE_STEPS, seed=0):
    """The gate's run: DUPA (lambda 0.5) on the RoPE backbone with the alignment options `align`
    (config.dupa.align_*, e.g. configs/dupa.py ALIGNS["retest"]), `steps` steps, no evaluation."""
    config = dupa_config.get_config(f"size={size},arm=dupa,backbone=rope")
    config.dupa.update(align)
    config.seed, config.train.steps = seed, steps
    config.train.checkpoint_every, config.eval.num_samples = 0, 0
    return config


def measure_draws(config, params, x_BHWC, y_B, draws: int = GATE_DRAWS) -> dict:
    """`measure` averaged over `draws` (t, eps) draws (keys 0 ..; one draw's gap has a sd of
    ~0.02, README), with the gap `passes_gate` reads: aligned same - cross_same_class."""
    each = [measure(config, params, x_BHWC, y_B, jax.random.PRNGKey(k)) for k in range(draws)]
    out = {
        tokens: {name: float(np.mean([d[tokens][name] for d in each])) for name in each[0][tokens]}
        for tokens in each[0]
    }
    return {**out, "gap": out["aligned"]["same"] - out["aligned"]["cross_same_class"]}


def gate(config, x_BHWC, y_B) -> dict:
    """Trains `config` from scratch (one device), then `measure_draws` of its final `params` on
    the images given; adds the last step's alignment loss."""
    session = train.init(config, dupa.make(config), devices=jax.devices()[:1])
    rows = session.train(config.train.steps)
    out = measure_draws(config, session.state.params, x_BHWC, y_B)
    return {**out, "align_loss": rows[-1]["align_loss"]}


def passes_gate(metrics: dict) -> bool:
    """The aligned tokens of the two paths of one image agree more than those of two images of
    the same class, by GATE_GAP: neither one direction for every image nor a code of the label
    (both give a gap of 0.001 or less) meets the alignment loss."""
    return metrics["gap"] >= GATE_GAP


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


def print_gates(forms, seeds, steps: int) -> None:
    """The gate's numbers for each form "align_head:align_label:align_loss" and seed."""
    split = digits.load_splits().validation
    x_BHWC, y_B = jnp.asarray(split.images), jnp.asarray(split.labels)
    print("form                    seed tokens  | same   cross  same-class spread | gap     passes")
    for form in forms:
        align = dict(zip(dupa.ALIGN_OPTIONS, form.split(":"), strict=True))
        for seed in seeds:
            m = gate(gate_config(align, steps=steps, seed=int(seed)), x_BHWC, y_B)
            for tokens in ("aligned", "encoder"):
                t = m[tokens]
                print(
                    f"{form:23s} {seed:>4s} {tokens:7s} | {t['same']:.3f}  "
                    f"{t['cross']:.3f}  {t['cross_same_class']:.3f}      {t['spread']:.3f} | "
                    + (f"{m['gap']:.4f}  {passes_gate(m)}" if tokens == "aligned" else ""),
                    flush=True,
                )


def main(argv):
    del argv
    if _GATE.value:
        print_gates(_GATE.value, _SEEDS.value, _STEPS.value)
        return
    if not _WORKDIR.value:
        raise SystemExit("give --workdir (trained runs) or --gate")
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
    app.run(main)
