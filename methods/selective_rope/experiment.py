"""Selective RoPE's state-tracking claim at CPU scale: prefix parity (S2) with per-position labels.

1-layer GLA and 1-layer softmax transformer, each with Selective RoPE, RoPE or no position
encoding at matched parameter counts, trained from scratch at length 64 through `core.train.run`
and tested at 64, 128, 256 and 512 on held-out sequences. Per (model, encoding) the learning rate
is picked from a small sweep on seed 0 by held-out accuracy at the training length; the other
seeds use it. Then MQAR (a 1-layer GLA per encoding, 2 seeds), reported without a claim.

Claims (the paper's, at our scale; `quick` checks only the first two, trained at length 32):
- GLA + Selective RoPE solves parity at the training length, and RoPE / none stay at chance on
  the later positions (where the parity depends on many bits);
- GLA + Selective RoPE extrapolates to longer sequences (measured at 4x and 8x);
- a 1-layer softmax transformer with Selective RoPE learns parity at the training length.
The headline metric is the per-position accuracy on the last quarter of positions ("last_quarter":
chance is 0.5, and a model that only handles short prefixes gets no credit there).
"""

import dataclasses
import math
import os
import time

import jax
import numpy as np

from configs import selective_rope as sr_config
from core import train
from core.claims import Claim, Report
from core.metrics import NonFiniteLossError
from methods.selective_rope import evaluate_lengths, make, model, model_config, parity_flip

POSITIONS = ("selective", "rope", "none")


@dataclasses.dataclass(frozen=True)
class Setting:
    models: tuple[str, ...]
    positions: tuple[str, ...]
    seeds: tuple[int, ...]
    lrs: tuple[float, ...]  # swept on the first seed; the best is used for the others
    steps: dict  # per model
    train_length: int
    test_lengths: tuple[int, ...]
    eval_examples: int
    mqar_steps: int  # 0: no MQAR
    mqar_seeds: tuple[int, ...] = (0, 1)
    weight_decay: float = 0.1  # parity runs (AdamW)


FULL = Setting(
    models=("gla", "transformer"),
    positions=POSITIONS,
    seeds=(0, 1, 2),
    lrs=(1e-3, 3e-3),
    steps={"gla": 1200, "transformer": 700},
    train_length=64,
    test_lengths=(128, 256, 512),
    eval_examples=512,
    mqar_steps=500,
)
QUICK = Setting(
    models=("gla",),
    positions=("selective", "rope"),
    seeds=(0,),
    lrs=(3e-3,),
    # 250 steps at length 32, seeds 0 / 1 / 2: selective beats RoPE by +0.39 / +0.37 / +0.28 at
    # 1x and +0.24 / +0.25 / +0.15 at 2x (the claims need 0.25 / 0.15: seed 2 is at the edge);
    # 500 steps gave +0.49 / +0.35 on seed 0 at twice the time. Batch 32 instead of 64 (half a
    # step's compute) fails seed 2: +0.22 and +0.07.
    steps={"gla": 250},
    train_length=32,
    test_lengths=(64,),
    eval_examples=256,
    mqar_steps=0,
    # 500 steps at length 32: without weight decay selective beats RoPE by +0.49 / +0.35 at 1x /
    # 2x; with 0.1 by +0.43 / +0.19 (it helps longer runs, see FULL), so the check runs without.
    weight_decay=0.0,
)


def parity_config(kind: str, position: str, *, lr: float, seed: int, steps: int, s: Setting):
    c = sr_config.get_config(f"model={kind},position={position},task=parity")
    c.seed = seed
    c.task.length = s.train_length
    # d_model 64, 4 heads (head dim 16, 8 rotation pairs), SwiGLU 128 (+9 for RoPE/none).
    c.model.d_model, c.model.num_heads, c.model.d_ff = 64, 4, 128
    # temp_max = pi (the authors use 1): the angle increments start at exp(0) * pi per step and
    # phi's learned part is scaled by pi, so a pi-flip per 1-bit is reached within our ~10^3
    # steps (with temp_max = 1, GLA + Selective RoPE stayed at chance for 800 steps).
    c.model.temp_max = math.pi
    c.train.steps, c.train.batch_size = steps, 64
    c.train.log_every = max(steps // 4, 1)
    c.train.checkpoint_every, c.train.eval_every = 0, -1
    # AdamW; FULL uses weight decay 0.1, the authors' setting: without it GLA + Selective RoPE
    # reached 0.88 at length 64 and 0.78 at 128 in a 1700-step development run (seed 0), with
    # it 0.97 and 0.93.
    c.optim.name, c.optim.weight_decay = "adamw", s.weight_decay
    c.optim.lr, c.optim.warmup_steps, c.optim.schedule = lr, 50, "cosine"
    c.optim.grad_clip = 1.0
    c.eval.num_examples = s.eval_examples
    c.eval.lengths = s.test_lengths
    return c


def mqar_config(position: str, *, seed: int, steps: int):
    c = sr_config.get_config(f"model=gla,position={position},task=mqar")
    c.seed = seed
    c.task.update(dict(num_pairs=8, num_keys=32, num_values=32, num_queries=8))
    c.model.d_model, c.model.num_heads, c.model.d_ff = 64, 4, 128
    # The authors' recall (MAD) setting: a RoPE-like temperature spectrum (theta 5e5), no bias.
    c.model.temp_theta, c.model.temp_max, c.model.use_bias = 5e5, 1.0, False
    c.train.steps, c.train.batch_size = steps, 64
    c.train.log_every = max(steps // 4, 1)
    c.train.checkpoint_every, c.train.eval_every = 0, -1
    c.optim.weight_decay, c.optim.lr, c.optim.warmup_steps = 0.0, 3e-3, 50
    c.optim.schedule, c.optim.grad_clip = "cosine", 1.0
    c.eval.num_examples = 512
    return c


def train_and_eval(config, workdir: str) -> dict:
    """Train one model (one CPU device) and evaluate it; a diverged run scores chance (0.5)."""
    t0 = time.perf_counter()
    try:
        result = train.run(config, make(config), workdir, devices=jax.devices()[:1])
    except NonFiniteLossError as e:
        print(f"   diverged: {e}", flush=True)
        return {"diverged": 1.0, "seconds": time.perf_counter() - t0}
    cfg = model_config(config)
    metrics = evaluate_lengths(cfg, result.state.params, config, seed=config.seed)
    if config.task.name == "parity" and cfg.position == "selective":
        metrics.update(parity_flip(cfg, result.state.params))
    return {**metrics, "diverged": 0.0, "seconds": time.perf_counter() - t0}


def _get(run: dict, length: int, metric: str = "last_quarter") -> float:
    return run.get(f"len{length}/{metric}", 0.5)  # diverged: chance


def run_parity(workdir: str, s: Setting) -> dict:
    """{model: {position: {"lr", "lr_sweep", "params", "seeds": {seed: metrics}}}}."""
    out = {}
    for kind in s.models:
        out[kind] = {}
        for position in s.positions:
            steps = s.steps[kind]
            sweep, runs = {}, {}
            for lr in s.lrs:  # on the first seed
                c = parity_config(kind, position, lr=lr, seed=s.seeds[0], steps=steps, s=s)
                print(f"-- parity {kind}/{position} lr={lr:g} seed={s.seeds[0]}", flush=True)
                runs[lr] = train_and_eval(c, f"{workdir}/parity/{kind}-{position}-lr{lr:g}-s0")
                sweep[lr] = _get(runs[lr], s.train_length)
            best = max(s.lrs, key=lambda lr: sweep[lr])  # first (smallest) lr wins ties
            seeds = {s.seeds[0]: runs[best]}
            for seed in s.seeds[1:]:
                c = parity_config(kind, position, lr=best, seed=seed, steps=steps, s=s)
                print(f"-- parity {kind}/{position} lr={best:g} seed={seed}", flush=True)
                seeds[seed] = train_and_eval(c, f"{workdir}/parity/{kind}-{position}-s{seed}")
            c = parity_config(kind, position, lr=best, seed=0, steps=steps, s=s)
            out[kind][position] = {
                "lr": best,
                "lr_sweep": {f"{lr:g}": v for lr, v in sweep.items()},
                "params": model.count_params(model_config(c)),
                "d_ff": model_config(c).d_ff,
                "steps": steps,
                "seeds": {str(k): v for k, v in seeds.items()},
            }
    return out


def summarize(parity: dict, s: Setting) -> dict:
    """Means over seeds: {model: {position: {"len{T}/{metric}": mean}}}."""
    lengths = (s.train_length, *s.test_lengths)
    means = {}
    for kind, by_pos in parity.items():
        means[kind] = {}
        for position, r in by_pos.items():
            runs = list(r["seeds"].values())
            means[kind][position] = {
                f"len{T}/{m}": float(np.mean([_get(x, T, m) for x in runs]))
                for T in lengths
                for m in ("last_quarter", "last_half", "final", "accuracy")
            }
    return means


def print_table(parity: dict, means: dict, s: Setting) -> None:
    lengths = (s.train_length, *s.test_lengths)
    print("\nprefix parity: last-quarter per-position accuracy (whole-sequence parity accuracy)")
    head = "".join(f"{'T=' + str(T):>22}" for T in lengths)
    print(f"{'model/position':<22}{'lr':>7}{'params':>8}  seed{head}")
    for kind, by_pos in parity.items():
        for position, r in by_pos.items():
            name = f"{kind}/{position}"
            for seed, run in r["seeds"].items():
                cells = "".join(
                    f"{_get(run, T):>15.3f} ({_get(run, T, 'final'):.3f})" for T in lengths
                )
                print(f"{name:<22}{r['lr']:>7g}{r['params']:>8}  {seed:>4}{cells}")
            flips = [run["flip_error"] for run in r["seeds"].values() if "flip_error" in run]
            if flips:
                print(
                    f"{'':<22}best pair's flip error (rad): " + ", ".join(f"{e:.3f}" for e in flips)
                )
            m = means[kind][position]
            cells = "".join(
                f"{m[f'len{T}/last_quarter']:>15.3f} ({m[f'len{T}/final']:.3f})" for T in lengths
            )
            print(f"{name:<22}{'':>7}{'':>8}  mean{cells}")


def plot(parity: dict, means: dict, s: Setting, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    lengths = (s.train_length, *s.test_lengths)
    fig, axes = plt.subplots(1, len(parity), figsize=(5 * len(parity), 3.6), squeeze=False)
    colors = {"selective": "C0", "rope": "C1", "none": "C2"}
    for ax, (kind, by_pos) in zip(axes[0], parity.items(), strict=True):
        for position, r in by_pos.items():
            for run in r["seeds"].values():
                ax.scatter(lengths, [_get(run, T) for T in lengths], color=colors[position], s=12)
            mean = [means[kind][position][f"len{T}/last_quarter"] for T in lengths]
            ax.plot(lengths, mean, color=colors[position], marker="o", label=position)
        ax.axhline(0.5, color="gray", lw=0.8, ls="--")
        ax.axvline(s.train_length, color="gray", lw=0.8, ls=":")
        ax.set(xscale="log", xlabel="test length (trained at dotted line)", ylim=(0.4, 1.02))
        ax.minorticks_off()
        ax.set_xticks(lengths, [str(T) for T in lengths])
        ax.set_ylabel("accuracy, last quarter of positions")
        ax.set_title(f"1-layer {kind}: prefix parity")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_mqar(workdir: str, s: Setting) -> dict:
    """{position: {"seeds": {seed: metrics}, "accuracy": mean, "exact_match": mean}}."""
    out = {}
    for position in POSITIONS:
        seeds = {}
        for seed in s.mqar_seeds:
            c = mqar_config(position, seed=seed, steps=s.mqar_steps)
            print(f"-- mqar gla/{position} seed={seed}", flush=True)
            seeds[str(seed)] = train_and_eval(c, f"{workdir}/mqar/gla-{position}-s{seed}")
        out[position] = {
            "seeds": seeds,
            **{
                m: float(np.mean([r.get(m, 0.0) for r in seeds.values()]))
                for m in ("accuracy", "exact_match")
            },
        }
    print(
        f"\nMQAR (8 pairs of 32 keys, 1-layer GLA, {s.mqar_steps} steps): accuracy per seed, mean"
    )
    for position, r in out.items():
        per_seed = " ".join(f"{x.get('accuracy', 0.0):.3f}" for x in r["seeds"].values())
        print(f"  {position:<10} {per_seed}  mean {r['accuracy']:.3f}")
    return out


def claims_for(means: dict, s: Setting, quick: bool) -> list[Claim]:
    T0 = s.train_length
    q = lambda kind, pos, T: means[kind][pos][f"len{T}/last_quarter"]  # noqa: E731
    claims = [
        # Chance is 0.5; 256-512 held-out sequences x 16 positions make the standard error of a
        # chance-level model ~0.006, so these margins are far outside noise.
        Claim(
            "GLA: Selective RoPE beats RoPE on parity at the training length",
            f"gla/selective-rope/len{T0}/last_quarter",
            q("gla", "selective", T0) - q("gla", "rope", T0),
            ">=",
            0.25,
        ),
        Claim(
            "GLA: Selective RoPE beats RoPE on parity at 2x the training length",
            f"gla/selective-rope/len{2 * T0}/last_quarter",
            q("gla", "selective", 2 * T0) - q("gla", "rope", 2 * T0),
            ">=",
            0.15,
        ),
    ]
    if quick:
        return claims
    claims += [
        Claim(
            "GLA + Selective RoPE solves parity at the training length",
            f"gla/selective/len{T0}/last_quarter",
            q("gla", "selective", T0),
            ">=",
            0.9,
        ),
        Claim(
            "GLA + RoPE stays near chance on later positions",
            f"gla/rope/len{T0}/last_quarter",
            q("gla", "rope", T0),
            "<=",
            0.6,
        ),
        Claim(
            "GLA + no position encoding stays near chance on later positions",
            f"gla/none/len{T0}/last_quarter",
            q("gla", "none", T0),
            "<=",
            0.6,
        ),
        Claim(
            "GLA + Selective RoPE extrapolates to 4x the training length",
            f"gla/selective/len{4 * T0}/last_quarter",
            q("gla", "selective", 4 * T0),
            ">=",
            0.9,
        ),
        Claim(
            "GLA + Selective RoPE extrapolates to 8x the training length",
            f"gla/selective/len{8 * T0}/last_quarter",
            q("gla", "selective", 8 * T0),
            ">=",
            0.9,
        ),
        Claim(
            "GLA: Selective RoPE beats RoPE at 8x the training length",
            f"gla/selective-rope/len{8 * T0}/last_quarter",
            q("gla", "selective", 8 * T0) - q("gla", "rope", 8 * T0),
            ">=",
            0.1,
        ),
    ]
    if "transformer" in means:
        claims += [
            Claim(
                "a 1-layer softmax transformer with Selective RoPE learns parity",
                f"transformer/selective/len{T0}/last_quarter",
                q("transformer", "selective", T0),
                ">=",
                0.8,
            ),
            Claim(
                "transformer: RoPE stays near chance on later positions",
                f"transformer/rope/len{T0}/last_quarter",
                q("transformer", "rope", T0),
                "<=",
                0.6,
            ),
        ]
    return claims


def run(workdir: str, *, quick: bool = False) -> Report:
    s = QUICK if quick else FULL
    start = time.perf_counter()
    parity = run_parity(workdir, s)
    means = summarize(parity, s)
    print_table(parity, means, s)
    figure = os.path.join(workdir, "selective_rope_parity.png")
    plot(parity, means, s, figure)
    metrics = {"parity": parity, "parity_mean": means}
    claims = claims_for(means, s, quick)
    if s.mqar_steps:
        # Reported, not claimed: at 500 steps MQAR sits before or inside its induction phase
        # change, whose timing varies by seed (no position encoding: 0.28 and 0.50 on two
        # seeds), so no ordering of the encodings held reliably here.
        metrics["mqar"] = run_mqar(workdir, s)
    metrics["seconds"] = time.perf_counter() - start
    return Report(
        method="selective_rope",
        claims=claims,
        metrics=metrics,
        figures=[figure],
        command="python -m launch.reproduce --methods=selective_rope"
        + (" --quick" if quick else ""),
        notes=(
            "Prefix parity, trained at length 64; metric: per-position accuracy on the last "
            "quarter of positions (chance 0.5), mean over seeds "
            f"{list(s.seeds)}; lr per (model, encoding) from {list(s.lrs)} on seed {s.seeds[0]}."
        ),
    )
