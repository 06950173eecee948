"""Shared by the methods whose models call a Pallas kernel: train a few steps on a mesh."""

import jax

from core import train


def losses_on_mesh(config, make, *, steps: int = 3) -> tuple[list[float], bool]:
    """(the losses of `steps` training steps of `config` on its mesh over the 8 test devices,
    whether the traced step contains a shard_map)."""
    session = train.init(config, make(config), devices=jax.devices()[:8])
    state = session.state
    jaxpr = str(session.step.trace(state, session.next_batch()).jaxpr)
    losses = []
    for _ in range(steps):
        state, metrics = session.step(state, session.next_batch())
        losses.append(float(metrics["loss"]))
    return losses, "shard_map" in jaxpr
