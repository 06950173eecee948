"""DUPA's pieces as pure functions: the stacked K-path forward, the projector, the alignment
losses (dual-path cosine and REPA's cosine to a frozen encoder).

    out = paths_forward(cfg, net_params, x_BHWC, y_B, rng, paths=2, align_at="encoder/blocks/1")
    z_KBNP = project(proj_params, out.features_KBND)
    loss = dual_path_alignment(z_KBNP)          # -1 when every path agrees token by token
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


def paths_forward(cfg: dit.DiTConfig, params, x_BHWC, y_B, rng, *, paths: int, align_at=None):
    """K independent (t, eps) draws per image, all K * B rows through the network as ONE
    stacked forward (path k is rows k*B .. (k+1)*B - 1), split back into [K, B, ...]."""
    B = x_BHWC.shape[0]
    x_MHWC = jnp.tile(x_BHWC, (paths, 1, 1, 1))
    y_M = jnp.tile(y_B, paths)
    noised = diffusion.flow_noised(rng, x_MHWC)  # one t and eps per row: independent paths
    capture = () if align_at is None else (align_at,)
    v_MHWC, captured = dit.apply(cfg, params, noised.x_t, noised.t, y_M, capture=capture)
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
