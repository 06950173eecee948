"""The baselines beside ODPV: a PGD attack (an upper bound on the worst-case IoU) and the scalar
scenario bound on the post-NMS best-box IoU (the reviewers' point). RCP_N is `verify.rcp_box`
followed by the same Part 2.

PGD minimises a smooth stand-in for "the object is still found": a soft maximum over candidates
of IoU(box_i, gt) gated by a soft "class q and confident" (a sigmoid of the margins), with signed
gradient steps inside the L-inf ball, from x0 and from random starts. What it reports is the
exact post-NMS best-box IoU (`boxes.best_iou`) of every iterate, minimised: any input's value is
an IoU the detector really gives, so the minimum is an upper bound on the worst case, and a
certified lower bound above it would be unsound.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from methods.od_verify import boxes, verify

SHARPNESS = 20.0  # of the soft gates and soft maximum: a margin of 0.05 moves a gate by ~0.73


def _surrogate(outputs_N6, gt_4, q, iota):
    sq = outputs_N6[:, 4 + q]
    so = outputs_N6[:, 5 - q]
    gate = jax.nn.sigmoid(SHARPNESS * (sq - iota)) * jax.nn.sigmoid(SHARPNESS * (sq - so))
    goodness_N = gate * boxes.iou(outputs_N6[:, :4], gt_4)
    return jax.nn.logsumexp(SHARPNESS * goodness_N) / SHARPNESS


@functools.partial(jax.jit, static_argnums=(0, 4, 5, 6, 7, 8))
def _pgd(forward, x0_SS3, gt_4, key, q, eps, steps, restarts, nms):
    iota, eta = nms

    def objective(x_SS3):
        return _surrogate(forward(x_SS3[None])[0], gt_4, q, iota)

    def true_iou(x_SS3):
        return boxes.best_iou(forward(x_SS3[None])[0], gt_4, q, iota, eta)

    step_size = 2.5 * eps / steps  # Madry et al.'s rule: the ball crossed 2.5 times

    def attack(start_SS3):
        def body(x_SS3, _):
            g = jax.grad(objective)(x_SS3)
            x_SS3 = jnp.clip(x_SS3 - step_size * jnp.sign(g), x0_SS3 - eps, x0_SS3 + eps)
            x_SS3 = jnp.clip(x_SS3, 0.0, 1.0)
            return x_SS3, true_iou(x_SS3)

        _, ious = jax.lax.scan(body, start_SS3, None, length=steps)
        return jnp.minimum(ious.min(), true_iou(start_SS3))

    starts = [x0_SS3] + [
        jnp.clip(x0_SS3 + jax.random.uniform(k, x0_SS3.shape, minval=-eps, maxval=eps), 0, 1)
        for k in jax.random.split(key, restarts)
    ]
    return jnp.min(jnp.stack([attack(s) for s in starts]))


def pgd_iou(
    forward,
    x0_SS3,
    gt_4,
    q: int,
    eps: float,
    key,
    *,
    steps: int = 40,
    restarts: int = 2,
    iota: float = 0.25,
    eta: float = 0.45,
) -> float:
    """The smallest post-NMS best-box IoU PGD finds (random starts: `restarts`, plus x0)."""
    return float(
        _pgd(
            forward,
            jnp.asarray(x0_SS3),
            jnp.asarray(gt_4, jnp.float32),
            key,
            q,
            float(eps),
            steps,
            restarts,
            (iota, eta),
        )
    )


def sampled_ious(sampler: "verify.Sampler", gt_4, q: int, s: "verify.Settings") -> np.ndarray:
    """The post-NMS best-box IoU of (2 / alpha)(ln(1 / beta) + 1) fresh samples: their minimum
    is the scalar scenario bound (P(IoU < it) <= alpha with confidence 1 - beta)."""
    n = verify.scenario_count(s.alpha, s.beta, 1)
    outs = sampler.draw(n).astype(np.float32)
    return np.asarray(
        _best_ious(jnp.asarray(outs), jnp.asarray(gt_4, jnp.float32), q, s.iota, s.eta)
    )


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def _best_ious(outs_KN6, gt_4, q, iota, eta):
    return jax.vmap(boxes.best_iou, in_axes=(0, None, None, None, None))(
        outs_KN6, gt_4, q, iota, eta
    )
