"""DUPA's pieces as pure functions: the stacked K-path forward, the alignment heads, the
alignment losses (the dual-path cosine or InfoNCE, and REPA's cosine to a frozen encoder).

    out = paths_forward(cfg, net_params, x_BHWC, y_B, rng, paths=2, align_at="encoder/blocks/1")
    z_KBNP = aligned_tokens("centred", params, out.features_KBND)  # HEADS below
    loss = dual_path_alignment(z_KBNP)          # -1 when every path agrees token by token
    loss = dual_path_infonce(z_KBNP, 0.2)       # 0 when each path picks out its own image

Heads (HEADS, `config.dupa.align_head`): what the loss compares.
- "projector" (the first two studies'): a trainable Linear-SiLU-Linear shared by both paths. Only
  the alignment loss trains it, so it meets the loss by sending every image to one direction.
- "none": the encoder tokens themselves. With the cosine the encoder then adds one direction to
  every token itself.
- "centred" (the re-test's): those tokens minus their mean over both paths and every image, per
  position (BatchNorm's centring, no parameters): a direction shared by every image cancels.
Losses: `dual_path_alignment` (-cos, the first studies') and `dual_path_infonce` (the re-test's:
the other images of the batch are negatives). `paths_forward`'s align_label: the aligned tokens
from a pass with the null label, so they cannot copy the label both paths are given. Each way out
and its numbers: README, "Re-test (issue 47)".
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from core import diffusion
from core.nn import dit


class PathsOutput(NamedTuple):
    velocity_KBHWC: jax.Array
    target_KBHWC: jax.Array
    t_KB: jax.Array
    features_KBND: jax.Array | None  # the residual stream at the alignment block


def paths_forward(
    cfg: dit.DiTConfig, params, x_BHWC, y_B, rng, *, paths: int, align_at=None, align_label=None
):
    """K independent (t, eps) draws per image, all K * B rows through the network as ONE
    stacked forward (path k is rows k*B .. (k+1)*B - 1), split back into [K, B, ...].
    `align_label` (an int, e.g. the null class): the features at `align_at` come from a second
    encoder pass of the same x_t and t with that label for every row (the velocity does not),
    so the aligned tokens cannot carry the label both paths share."""
    B = x_BHWC.shape[0]
    x_MHWC = jnp.tile(x_BHWC, (paths, 1, 1, 1))
    y_M = jnp.tile(y_B, paths)
    noised = diffusion.flow_noised(rng, x_MHWC)  # one t and eps per row: independent paths
    capture = () if align_at is None or align_label is not None else (align_at,)
    v_MHWC, captured = dit.apply(cfg, params, noised.x_t, noised.t, y_M, capture=capture)
    if align_at is not None and align_label is not None:
        # Only the blocks up to align_at feed the loss: XLA drops the rest of this pass.
        label_M = jnp.full_like(y_M, align_label)
        _, captured = dit.encode(cfg, params, noised.x_t, noised.t, label_M, capture=(align_at,))
    split = lambda a: a.reshape(paths, B, *a.shape[1:])  # noqa: E731
    features = None if align_at is None else split(captured[align_at])
    return PathsOutput(split(v_MHWC), split(noised.target), split(noised.t), features)


def init_projector(rng, d_in: int, d_out: int, gain: float) -> dict:
    """Linear(d_in, d_in)-SiLU-Linear(d_in, d_out): Kaiming-normal first layer, Xavier-uniform
    with `gain` after. Never zero: the cosine of a zero vector has no gradient direction, and a
    zero projector would leave every path's projection equal (the loss at its minimum)."""
    k1, k2 = jax.random.split(rng)
    xavier = jax.nn.initializers.variance_scaling(gain**2, "fan_avg", "uniform")
    return {
        "hidden": {
            "w": jax.nn.initializers.he_normal()(k1, (d_in, d_in)),
            "b": jnp.zeros(d_in),
        },
        "out": {"w": xavier(k2, (d_in, d_out)), "b": jnp.zeros(d_out)},
    }


def project(params: dict, z_ND):
    """The projector over the last axis (any leading axes)."""
    h = jax.nn.silu(z_ND @ params["hidden"]["w"] + params["hidden"]["b"])
    return h @ params["out"]["w"] + params["out"]["b"]


HEADS = ("projector", "none", "centred")


def aligned_tokens(head: str, params: dict, features_KBND):
    """The tokens the alignment loss compares (module docstring): the projector's output, the
    encoder tokens unchanged ("none"; the cosine normalises each token) or centred on the batch.
    [K, B, N, D] in, [K, B, N, P] out (P = D without a projector)."""
    if head == "projector":
        return project(params["projector"], features_KBND)
    if head == "none":
        return features_KBND
    if head == "centred":  # the mean over paths and images, per token position (and feature)
        return features_KBND - features_KBND.mean(axis=(0, 1), keepdims=True)
    raise ValueError(f"align head {head!r}; expected one of: {', '.join(HEADS)}")


def token_cosine(a_BNP, b_BNP, eps: float = 1e-8):
    """Cosine similarity per token [B, N] (eps keeps a zero vector finite)."""
    a = a_BNP / (jnp.linalg.norm(a_BNP, axis=-1, keepdims=True) + eps)
    b = b_BNP / (jnp.linalg.norm(b_BNP, axis=-1, keepdims=True) + eps)
    return jnp.sum(a * b, axis=-1)


def dual_path_alignment(z_KBNP, *, stop_gradient: bool = False):
    """-mean over path pairs i < j, tokens and images of cos(z_i, z_j) (DUPA's L_align, in
    [-1, 1]). stop_gradient: path 0 is a fixed target (detached in every pair it is in)."""
    K = z_KBNP.shape[0]
    if K < 2:
        raise ValueError(f"dual-path alignment needs >= 2 paths, got {K}")
    z = list(z_KBNP)
    if stop_gradient:
        z[0] = jax.lax.stop_gradient(z[0])
    pairs = [token_cosine(z[i], z[j]).mean() for i in range(K) for j in range(i + 1, K)]
    return -jnp.mean(jnp.stack(pairs))


def encoder_alignment(z_BNP, target_BNP):
    """REPA: -mean token cosine to a frozen encoder's features (no gradient into the target)."""
    return -token_cosine(z_BNP, jax.lax.stop_gradient(target_BNP)).mean()


def dual_path_infonce(z_KBNP, temperature: float):
    """InfoNCE between paths, token-wise: at each token position, path i's token of image b must
    pick path j's token of the same image b among those of all B images (logits: cosine /
    temperature), both directions, mean over path pairs i < j, positions and images. The other
    images are the negatives: one direction for every image, or a code of what both paths share
    (the label), leaves the positive indistinguishable from them. log B at chance, 0 at best."""
    K, B = z_KBNP.shape[:2]
    u_KBNP = z_KBNP / (jnp.linalg.norm(z_KBNP, axis=-1, keepdims=True) + 1e-8)
    losses = []
    for i in range(K):
        for j in range(i + 1, K):
            logits_NBB = jnp.einsum("anp,bnp->nab", u_KBNP[i], u_KBNP[j]) / temperature
            diagonal = jnp.arange(B)
            for lg in (logits_NBB, jnp.swapaxes(logits_NBB, 1, 2)):
                log_p = jax.nn.log_softmax(lg, axis=-1)[:, diagonal, diagonal]
                losses.append(-log_p.mean())
    return jnp.mean(jnp.stack(losses))
