"""ALI-CFM's losses as pure functions: interpolant pretraining, the GAN pair, the regularisers,
the CFM loss on the frozen interpolant, and the baselines' flow-matching losses.

    # Batches as the official code draws them: x0, xt, x1 coupled by OT on the host
    # (core.ot.chain), t the intermediate marginal's time ([B] or a scalar), rng a JAX key.
    loss = pretrain_loss(g, x0_BD, x1_BD, xt_BD, t, rng)
    ld, d_grads = jax.value_and_grad(d_loss)(d, g, x0_BD, x1_BD, xt_BD, t, rng)
    d = update(d, d_grads)                                     # D first, then G against new D
    (lg, aux), g_grads = jax.value_and_grad(g_loss, has_aux=True)(g, d, x0_BD, x1_BD, xt_BD,
                                                                  t, rng, reg="linear")
    loss = cfm_loss(v, g, x0_BD, x1_BD, jax.random.uniform(key, (B,)))   # stage 2
    loss = mmfm_loss(v, knots_KBD, times_K, t_B)                          # a baseline

Follows `ali_cfm/training/training_funcs.py` (cited per function). The one GAN step there:
xt_fake = G(x0, x1, t) once with t-noise; D steps on softplus(D(fake.detach()) - D(real));
then G steps on softplus(D(real) - D(fake)) with the logits recomputed by the updated D, plus
correct_coeff * regulariser. Here `d_loss` and `g_loss` each rebuild xt_fake from the same
`rng` (noise key fold_in(rng, 0)), so passing one key to both is the official single draw;
`g_loss` holds d_params under stop_gradient, and `d_loss` holds G's output there, so neither
loss trains the other network. Means are over every element where the code takes `.mean()`.
"""

import jax
import jax.numpy as jnp

from core.errors import ConfigError
from methods.ali_cfm.nets import (
    T_SMOOTH,
    discriminator,
    interpolant,
    interpolant_with_velocity,
    velocity,
)
from methods.ali_cfm.paths import cubic_spline, linear_path, piecewise_linear

GANS = ("rpgan", "r3gan", "vanilla")
REGULARISERS = ("linear", "piecewise", "second_derivative", "none")
FD_STEP = 1e-3  # nets.py:compute_length_reg_term's h
NUM_T = 3  # `num_t_steps` of every official config that sets it


def _check(name, value, allowed):
    if value not in allowed:
        raise ConfigError(f"{name}={value!r}; expected one of: {', '.join(allowed)}")


def _t_B(t, x_BD):
    return jnp.broadcast_to(jnp.asarray(t, x_BD.dtype), x_BD.shape[:1])


def _fake(g_params, x0_BD, x1_BD, t_B, rng, t_smooth):
    """The step's G sample, its t-noise drawn from fold_in(rng, 0) in d_loss and g_loss alike."""
    return interpolant(g_params, x0_BD, x1_BD, t_B, jax.random.fold_in(rng, 0), t_smooth)


def pretrain_loss(g_params, x0_BD, x1_BD, xt_BD, t_B, rng, t_smooth: float = T_SMOOTH):
    """`pretain_interpolant`: mean((G(x0, x1, t) - xt)^2) over batch and dims. G runs with its
    t-noise there too (`interpolant(x0, x1, t)` with forward's default training=True)."""
    return jnp.mean((interpolant(g_params, x0_BD, x1_BD, t_B, rng, t_smooth) - xt_BD) ** 2)


def _input_grad_sq(d_params, x_BD, t_B):
    """||grad of D's logit w.r.t. its whole input [x, t]||^2 per row (R3GAN's r1, r2)."""
    D_sum = lambda x, t: jnp.sum(discriminator(d_params, x, t))
    gx_BD, gt_B = jax.grad(D_sum, argnums=(0, 1))(x_BD, t_B)
    return jnp.sum(gx_BD**2, axis=-1) + gt_B**2


def d_loss(d_params, g_params, x0_BD, x1_BD, xt_BD, t_B, rng, *, gan="rpgan", t_smooth=T_SMOOTH):
    """The discriminator's loss (`train_interpolant_with_gan`). "rpgan": mean softplus(D(fake) -
    D(real)); "r3gan": the same with 0.5 ||grad D||^2 at real and at fake (grads w.r.t. [x, t])
    added inside the softplus, row by row; "vanilla": mean softplus(-D(real)) + mean
    softplus(D(fake)). G's sample is under stop_gradient (the code's `xt_fake.detach()`)."""
    _check("gan", gan, GANS)
    t_B = _t_B(t_B, x0_BD)
    fake_BD = jax.lax.stop_gradient(_fake(g_params, x0_BD, x1_BD, t_B, rng, t_smooth))
    real_B = discriminator(d_params, xt_BD, t_B)
    fake_B = discriminator(d_params, fake_BD, t_B)
    if gan == "vanilla":
        return jnp.mean(jax.nn.softplus(-real_B)) + jnp.mean(jax.nn.softplus(fake_B))
    penalty_B = 0.0
    if gan == "r3gan":
        # Deviation: the code adds r1 + r2 of shape [B] to logits of shape [B, 1], which
        # broadcasts to [B, B] (row i's logits with row j's penalty); here row i with its own.
        penalty_B = 0.5 * (
            _input_grad_sq(d_params, xt_BD, t_B) + _input_grad_sq(d_params, fake_BD, t_B)
        )
    return jnp.mean(jax.nn.softplus(fake_B - real_B + penalty_B))


def linear_reg(fake_BD, x0_BD, x1_BD, t_B):
    """nets.py:compute_linear_reg_term (metric "l2"): batch mean of the squared distance
    ||G - ((1 - t) x0 + t x1)||^2 summed over dims, G the step's own (t-noised) sample."""
    t = _t_B(t_B, x0_BD)[:, None]
    return jnp.mean(jnp.sum((fake_BD - (t * x1_BD + (1 - t) * x0_BD)) ** 2, axis=-1))


def piecewise_reg(g_params, x0_BD, x1_BD, xt_BD, t_B, s_B):
    """training_funcs.py "picewise_oskar_version" (metric "l2"): mean over batch and dims of
    (G(x0, x1, s) - ref(s))^2, G without t-noise, ref the polyline through (0, x0), (t, xt),
    (1, x1) of each coupled triple, s ~ U[0, 1] drawn by the caller.
    Deviations: the code's knot times are its first three training times, (0, t, 1) only when
    one intermediate marginal is kept (single-cell), and its gather `coupled_x[arange(B), idx]`
    with idx [B, 1] broadcasts to [B, B, D], comparing row j's G with every row's bracket; here
    each row uses its own knots (0, t_b, 1) and its own bracket."""
    t_B = _t_B(t_B, x0_BD)
    knots_KBD = jnp.stack([x0_BD, xt_BD, x1_BD])
    times_BK = jnp.stack([jnp.zeros_like(t_B), t_B, jnp.ones_like(t_B)], axis=1)
    ref_BD, _ = piecewise_linear(knots_KBD, times_BK, s_B)
    return jnp.mean((interpolant(g_params, x0_BD, x1_BD, s_B) - ref_BD) ** 2)


def second_derivative_reg(g_params, x0_BD, x1_BD, s_NB, h: float | None = FD_STEP):
    """nets.py:compute_length_reg_term (metric "l2"): sum over the N time draws and the dims of
    ||d^2 G / dt^2||^2, mean over the batch; G without t-noise. d^2G/dt^2 is the code's central
    difference [G(s+h) + G(s-h) - 2 G(s)] / h^2 with h = 1e-3. In float32 that difference
    cancels ~1e-7 of G into a 1e-6 denominator (~0.1 noise per element); h=None takes the exact
    second derivative instead (forward-over-forward jvp)."""
    G = lambda s_B: interpolant(g_params, x0_BD, x1_BD, s_B)

    def curvature_BD(s_B):
        if h is not None:
            return (G(s_B + h) + G(s_B - h) - 2 * G(s_B)) / h**2
        dG = lambda s: jax.jvp(G, (s,), (jnp.ones_like(s),))[1]
        return jax.jvp(dG, (s_B,), (jnp.ones_like(s_B),))[1]

    return jnp.mean(jnp.sum(jax.vmap(curvature_BD)(s_NB) ** 2, axis=(0, 2)))


def stratified_times(rng, num_t: int, batch: int):
    """[num_t, B] times for `second_derivative_reg`: row n uniform on [n/N, (n+1)/N).
    Deviation: the code draws n/N + U[0, 1), so its times run up to 2, past the endpoint x1 where
    G extrapolates; we keep them in [0, 1) as the regulariser's integral over t in [0, 1]."""
    return (jnp.arange(num_t)[:, None] + jax.random.uniform(rng, (num_t, batch))) / num_t


def g_loss(
    g_params,
    d_params,
    x0_BD,
    x1_BD,
    xt_BD,
    t_B,
    rng,
    *,
    gan="rpgan",
    reg="linear",
    reg_weight: float = 1.0,
    t_smooth: float = T_SMOOTH,
    num_t: int = NUM_T,
    h: float | None = FD_STEP,
):
    """(the generator's loss, {"adv", "reg"}): "rpgan"/"r3gan" mean softplus(D(real) -
    D(fake)), "vanilla" (non-saturating) mean softplus(-D(fake)), plus reg_weight (the code's
    `correct_coeff`: 1 in the 5-D configs) times the regulariser `reg`. Pass the updated D."""
    _check("gan", gan, GANS)
    _check("reg", reg, REGULARISERS)
    d_params = jax.lax.stop_gradient(d_params)  # the G step never moves D
    t_B = _t_B(t_B, x0_BD)
    fake_BD = _fake(g_params, x0_BD, x1_BD, t_B, rng, t_smooth)
    fake_B = discriminator(d_params, fake_BD, t_B)
    if gan == "vanilla":
        adv = jnp.mean(jax.nn.softplus(-fake_B))
    else:
        adv = jnp.mean(jax.nn.softplus(discriminator(d_params, xt_BD, t_B) - fake_B))
    reg_rng = jax.random.fold_in(rng, 1)
    B = x0_BD.shape[0]
    if reg == "linear":
        penalty = linear_reg(fake_BD, x0_BD, x1_BD, t_B)
    elif reg == "piecewise":
        s_B = jax.random.uniform(reg_rng, (B,), x0_BD.dtype)
        penalty = piecewise_reg(g_params, x0_BD, x1_BD, xt_BD, t_B, s_B)
    elif reg == "second_derivative":
        s_NB = stratified_times(reg_rng, num_t, B)
        penalty = second_derivative_reg(g_params, x0_BD, x1_BD, s_NB, h)
    else:
        penalty = jnp.zeros((), x0_BD.dtype)
    return adv + reg_weight * penalty, {"adv": adv, "reg": penalty}


def flow_matching_loss(v_params, x_BD, u_BD, t_B):
    """mean((u_theta([x_t, t]) - u_t)^2) over batch and dims (`train_ot_cfm`'s torch.mean)."""
    return jnp.mean((velocity(v_params, x_BD, t_B) - u_BD) ** 2)


def cfm_loss(v_params, g_params, x0_BD, x1_BD, t_B):
    """Stage 2, `train_ot_cfm`: x_t = G(x0, x1, t) without t-noise, u_t = dG/dt (jvp), t ~
    U[0, 1] drawn by the caller; the interpolant is frozen (stop_gradient on its params)."""
    x_BD, u_BD = interpolant_with_velocity(jax.lax.stop_gradient(g_params), x0_BD, x1_BD, t_B)
    return flow_matching_loss(v_params, x_BD, u_BD, t_B)


def icfm_loss(v_params, x0_BD, x1_BD, t_B, sigma: float = 0.0, eps_BD=None):
    """I-CFM (independent x0, x1) or OT-CFM (x0, x1 paired by core.ot): torchcfm's straight
    path, target x1 - x0, sigma 0 by default (see paths.linear_path)."""
    x_BD, u_BD = linear_path(x0_BD, x1_BD, t_B, sigma, eps_BD)
    return flow_matching_loss(v_params, x_BD, u_BD, t_B)


def piecewise_cfm_loss(v_params, knots_KBD, times_K, t_B):
    """OT-CFM over consecutive marginals (`scripts/train_cfm_st.py:train_ot_cfm`, "linear"):
    straight between the bracketing coupled points, target their difference over the gap."""
    x_BD, u_BD = piecewise_linear(knots_KBD, times_K, t_B)
    return flow_matching_loss(v_params, x_BD, u_BD, t_B)


def mmfm_loss(v_params, knots_KBD, times_K, t_B):
    """MMFM (`cubic_fm.py:MultiMarginalFlowMatcher`, sigma 0, and `train_cfm_st.py` "cubic"):
    the not-a-knot cubic spline through the OT-chained points, target its time derivative."""
    x_BD, u_BD = cubic_spline(knots_KBD, times_K, t_B)
    return flow_matching_loss(v_params, x_BD, u_BD, t_B)
