"""Shared by the methods whose steps must agree across meshes (a Pallas kernel, a global batch's
negatives): train a few steps on a mesh."""

import jax

from core import train


def losses_on_mesh(config, make, *, steps: int = 3, devices=None) -> tuple[list[float], bool]:
    """(the losses of `steps` training steps of `config` on its mesh over `devices` (default:
    the 8 test devices), whether the traced step contains a shard_map)."""
    session = train.init(config, make(config), devices=devices or jax.devices()[:8])
    state = session.state
    jaxpr = str(session.step.trace(state, session.next_batch()).jaxpr)
    losses = []
    for _ in range(steps):
        state, metrics = session.step(state, session.next_batch())
        losses.append(float(metrics["loss"]))
    return losses, "shard_map" in jaxpr
