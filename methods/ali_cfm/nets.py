"""ALI-CFM's three networks as pure functions over parameter pytrees (nested dicts of arrays).

    g = init_interpolant(key, dim=2)                     # f_phi: [x0, x1, t] -> 64 -> 64 -> D
    x_BD = interpolant(g, x0_BD, x1_BD, t_B)             # deterministic: evaluation, CFM stage
    x_BD = interpolant(g, x0_BD, x1_BD, t_B, rng=key)    # f sees t + N(0, 0.01^2): GAN training
    x_BD, u_BD = interpolant_with_velocity(g, x0_BD, x1_BD, t_B)   # u = dG/dt by jax.jvp
    d = init_discriminator(key, dim=2); logits_B = discriminator(d, x_BD, t_B)
    v = init_velocity(key, dim=2);      v_BD = velocity(v, x_BD, t_B)

As the official code (github.com/mmacosha/adversarially-learned-interpolants, `ali_cfm/nets.py`):
- `TrainableInterpolant.forward`: G(x0, x1, t) = (1 - t) x0 + t x1 + t (1 - t) f([x0, x1, t~]),
  f an ELU MLP 2D+1 -> h -> h -> D; t~ = t + t_smooth * N(0, 1) in training only, and only in
  f's input, so G(t=0) = x0 and G(t=1) = x1 exactly whatever f and the noise.
- `Discriminator` (apply_sigmoid=False, as the training scripts build it): ELU MLP on [x, t],
  D+1 -> w -> w -> 1, returning logits.
- `MLP(time_varying=True)`: the velocity u_theta, SELU MLP on [x, t], D+1 -> w -> w -> w -> D.
- Layers start as torch's `nn.Linear` default (weights and biases U(-1/sqrt(fan_in), +)): the
  repo's `init_weights` is never called. Kernels are stored [in, out] (torch's transposed).
t_B may also be a scalar (one time for the batch, as in the official GAN batches).
Shape suffixes: B batch, D data dims.
"""

import math

import jax
import jax.numpy as jnp

T_SMOOTH = 0.01  # every official config's `t_smooth`


def init_mlp(rng, sizes) -> dict:
    """{"dense_i": {"kernel": [sizes[i], sizes[i+1]], "bias": [sizes[i+1]]}}, torch's default
    `nn.Linear` initialisation."""
    params = {}
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        rng, k_w, k_b = jax.random.split(rng, 3)
        bound = 1 / math.sqrt(n_in)
        params[f"dense_{i}"] = {
            "kernel": jax.random.uniform(k_w, (n_in, n_out), jnp.float32, -bound, bound),
            "bias": jax.random.uniform(k_b, (n_out,), jnp.float32, -bound, bound),
        }
    return params


def mlp(params: dict, x, activation):
    """The MLP of `init_mlp`: `activation` after every layer but the last."""
    n = len(params)
    for i in range(n):
        x = x @ params[f"dense_{i}"]["kernel"] + params[f"dense_{i}"]["bias"]
        if i < n - 1:
            x = activation(x)
    return x


def _times_B(t, x_BD):
    """t as [B] in x's dtype (a scalar is one time for every row)."""
    return jnp.broadcast_to(jnp.asarray(t, x_BD.dtype), x_BD.shape[:1])


def _with_t(x_BF, t_B):
    return jnp.concatenate([x_BF, t_B[:, None]], axis=-1)


def init_interpolant(rng, dim: int, hidden: int = 64) -> dict:
    """f_phi's parameters (`interpolant_dim` = 64 in the low-D configs, 1024 for 50-100D)."""
    return init_mlp(rng, (2 * dim + 1, hidden, hidden, dim))


def interpolant(params, x0_BD, x1_BD, t_B, rng=None, t_smooth: float = T_SMOOTH):
    """G_phi(x0, x1, t) [B, D]. With `rng` (training) f reads t + t_smooth * N(0, 1) instead
    of t (`forward(training=True)`); without it G is deterministic (`training=False`)."""
    t_B = _times_B(t_B, x0_BD)
    t_in_B = t_B
    if rng is not None:
        t_in_B = t_B + t_smooth * jax.random.normal(rng, t_B.shape, t_B.dtype)
    f_BD = mlp(params, _with_t(jnp.concatenate([x0_BD, x1_BD], -1), t_in_B), jax.nn.elu)
    t = t_B[:, None]
    # (1 - t) x0 + t x1, not x0 + t (x1 - x0): the latter misses x1 by rounding at t = 1.
    return t * x1_BD + (1 - t) * x0_BD + t * (1 - t) * f_BD


def interpolant_with_velocity(params, x0_BD, x1_BD, t_B):
    """(G(x0, x1, t), dG/dt) with no t-noise, the CFM stage's (x_t, u_t). The derivative is
    forward-mode along t (the official `TrainableInterpolant.dI_dt` takes f's jacobian in t by
    `jacrev` and adds (x1 - x0) + (1 - 2t) f: the same quantity). Rows don't mix, so a tangent
    of ones gives each row's own derivative."""
    t_B = _times_B(t_B, x0_BD)
    G = lambda t: interpolant(params, x0_BD, x1_BD, t)
    return jax.jvp(G, (t_B,), (jnp.ones_like(t_B),))


def init_discriminator(rng, dim: int, width: int = 64) -> dict:
    """D_gamma's parameters (`disc_dim` = 64 low-D, 1024 for 50-100D)."""
    return init_mlp(rng, (dim + 1, width, width, 1))


def discriminator(params, x_BD, t_B):
    """D_gamma(x, t): logits [B] (no sigmoid; the losses take softplus of logit differences)."""
    return mlp(params, _with_t(x_BD, _times_B(t_B, x_BD)), jax.nn.elu)[:, 0]


def init_velocity(rng, dim: int, width: int = 64) -> dict:
    """u_theta's parameters (`cfm_dim` = 64 low-D, 1024 for 50-100D)."""
    return init_mlp(rng, (dim + 1, width, width, width, dim))


def velocity(params, x_BD, t_B):
    """u_theta(x, t) [B, D]: the learned vector field, integrated by `core.ode.solve`."""
    return mlp(params, _with_t(x_BD, _times_B(t_B, x_BD)), jax.nn.selu)
