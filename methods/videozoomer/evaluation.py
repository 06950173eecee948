"""Greedy episodes of a trained policy on held-out videos, the numbers the claims read, and the
perfect reader's accuracy on uniform frames (glance-only, and the agent's frame usage x1, x2).

    episodes = play(cfg, params, batch)     # per-video arrays: correct, zooms, frames, ...
    scores = summary(batch, episodes)       # accuracy per kind, zooms, frames, baselines
"""

import functools

import jax
import numpy as np

from core import multiturn
from methods.videozoomer import env, oracle, policy
from methods.videozoomer import video as v

EVAL_SEED_OFFSET = 2_000_003  # held-out videos come from a stream training never draws
BATCH = 200


def held_out(num_per_kind: int, seed: int) -> dict[str, np.ndarray]:
    """`num_per_kind` videos of each kind, from a seed stream training never draws."""
    rngs = [np.random.default_rng([seed, EVAL_SEED_OFFSET, i]) for i in range(num_per_kind)]
    parts = [v.examples(rngs, kind) for kind in v.KINDS]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


@functools.partial(jax.jit, static_argnames="cfg")
def _greedy(cfg, params, batch):
    state = env.init(batch)
    out = multiturn.rollout(
        policy.policy_of(cfg), params, batch["prompt"], batch["prompt_mask"], env.ENV, state,
        env.LAYOUT, rng=jax.random.key(0), temperature=0.0, pad_id=v.PAD,
    )  # fmt: skip
    correct_R, formed_R = policy.outcome(batch, out.env_state)
    return dict(
        correct=correct_R,
        formed=formed_R,
        zooms=out.env_state.zooms_R,
        frames=out.env_state.frames_R,
        rounds=out.rounds_R,
        tokens=out.tokens_RN,
        mask=out.mask_RN,
        policy_mask=out.policy_mask_RN,
    )


def play(cfg, params, batch) -> dict[str, np.ndarray]:
    """Greedy episodes on every video of `batch`, in slices of BATCH (one compiled shape)."""
    n = len(batch["answer"])
    parts = []
    for lo in range(0, n, BATCH):
        part = {k: x[lo : lo + BATCH] for k, x in batch.items()}
        short = BATCH - len(part["answer"])
        if short:  # pad the last slice with copies; their episodes are dropped below
            part = {k: np.concatenate([x, x[:1].repeat(short, 0)]) for k, x in part.items()}
        out = jax.device_get(_greedy(cfg, params, part))
        parts.append({k: x[: BATCH - short] for k, x in out.items()})
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def summary(batch, episodes) -> dict[str, float]:
    """Accuracy per kind and overall, format, zooms and frames per episode, the share of
    episodes with >= 1 and >= 2 zooms; the perfect reader on 32 uniform frames (glance-only),
    on the agent's mean frames (rounded) and twice that."""
    out = {}
    kinds = batch["kind"]
    mean_frames = float(episodes["frames"].mean())
    budgets = {"glance": v.GLANCE_FRAMES, "uniform_eq": round(mean_frames)}
    budgets["uniform_2x"] = 2 * budgets["uniform_eq"]
    readers = {name: oracle.reader_accuracy(batch, count) for name, count in budgets.items()}
    for k, kind in enumerate(v.KINDS):
        where = kinds == k
        out[f"{kind}/accuracy"] = float(episodes["correct"][where].mean())
        for name, acc in readers.items():
            out[f"{kind}/{name}"] = float(acc[where].mean())
    out["accuracy"] = float(episodes["correct"].mean())
    out["format"] = float(episodes["formed"].mean())
    out["zooms"] = float(episodes["zooms"].mean())
    out["zoomed"] = float((episodes["zooms"] >= 1).mean())
    out["zoomed_twice"] = float((episodes["zooms"] >= 2).mean())
    out["frames"] = mean_frames
    out.update({f"frames/{name}": float(count) for name, count in budgets.items()})
    return out


def transcript(batch, episodes, i: int) -> str:
    """Episode i as text: the question, then every turn (policy tokens marked *), the gold."""
    names = {i: n for n, i in v.TOKENS.items()}
    q = [names[t] for t, m in zip(batch["prompt"][i], batch["prompt_mask"][i], strict=True) if m]
    turns = [
        names[t] + ("*" if p else "")
        for t, m, p in zip(
            episodes["tokens"][i], episodes["mask"][i], episodes["policy_mask"][i], strict=True
        )
        if m
    ]
    gold = names[int(batch["answer"][i])]
    return f"{' '.join(q[:4])} ... | {' '.join(turns)} | gold {gold}"
