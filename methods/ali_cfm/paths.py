"""Fixed (not learnt) conditional paths for the flow-matching baselines and the piecewise
regulariser: each returns the point x_t and its time derivative u_t = dx_t/dt.

    x_BD, u_BD = linear_path(x0_BD, x1_BD, t_B)                 # I-CFM / OT-CFM: u = x1 - x0
    x_BD, u_BD = piecewise_linear(knots_KBD, times_K, t_B)      # OT-CFM over consecutive marginals
    x_BD, u_BD = cubic_spline(knots_KBD, times_K, t_B)          # MMFM: not-a-knot cubic spline

`knots_KBD[k, b]` is trajectory b's point at time `times[k]` (marginals coupled on the host with
`core.ot.chain`); `times` is [K] (shared) or [B, K] (one increasing row per trajectory), K >= 2.
A t outside [times[0], times[-1]] extrapolates with the end segment, as scipy does.
u_t is the exact derivative of the returned x_t, by `jax.jvp` along t (not finite differences).
Shape suffixes: B batch, D data dims, K knots (observed times).
"""

import jax
import jax.numpy as jnp


def linear_path(x0_BD, x1_BD, t_B, sigma: float = 0.0, eps_BD=None):
    """torchcfm's `ConditionalFlowMatcher` path: x_t = t x1 + (1 - t) x0 + sigma eps, u_t =
    x1 - x0 (a constant sigma adds nothing to u_t). sigma = 0 is torchcfm's default, and the
    official baselines (`scripts/train_cfm_st.py`, `train_cfm_tracking.py`) add no noise."""
    t = t_B[:, None]
    x_BD = t * x1_BD + (1 - t) * x0_BD
    if sigma:
        x_BD = x_BD + sigma * eps_BD
    return x_BD, x1_BD - x0_BD


def _with_velocity(path, t_B):
    """(path(t), d path / dt) for a path evaluated row-wise: rows don't mix, so the tangent of
    ones gives each row's own derivative."""
    return jax.jvp(path, (t_B,), (jnp.ones_like(t_B),))


def _bracket(times_BK, t_B):
    """Index i of the segment [times[i], times[i+1]] holding t, as the official
    `torch.bucketize(t, times) - 1` clamped to [0, K - 2] (training_funcs.py,
    "picewise_oskar_version"): t in (times[i], times[i+1]] -> i, so a knot time closes the
    segment before it; t <= times[0] -> 0."""
    K = times_BK.shape[1]
    return jnp.clip(jnp.sum(times_BK < t_B[:, None], axis=1) - 1, 0, K - 2)


def _times_BK(times, knots_KBD):
    K, B, _ = knots_KBD.shape
    return jnp.broadcast_to(jnp.asarray(times, knots_KBD.dtype), (B, K))


def _at(values_BK, i_B):
    return jnp.take_along_axis(values_BK, i_B[:, None], axis=1)[:, 0]


def piecewise_linear(knots_KBD, times, t_B):
    """Straight lines between consecutive knots (`scripts/train_cfm_st.py:
    get_ot_interpolant_given_coupling`, `train_cfm_tracking.py:get_ot_interpolant_generalized`):
    x_t = a x_i + b x_{i+1}, a = (t_{i+1} - t) / gap, b = (t - t_i) / gap; u_t = (x_{i+1} - x_i)
    / gap. Written as a, b (not x_i + b (x_{i+1} - x_i)) so that x_t is exactly x_i at t_i."""
    times_BK = _times_BK(times, knots_KBD)
    rows_B = jnp.arange(knots_KBD.shape[1])

    def path(t_B):
        i_B = _bracket(times_BK, t_B)
        ta_B, tb_B = _at(times_BK, i_B), _at(times_BK, i_B + 1)
        a_B, b_B = (tb_B - t_B) / (tb_B - ta_B), (t_B - ta_B) / (tb_B - ta_B)
        return a_B[:, None] * knots_KBD[i_B, rows_B] + b_B[:, None] * knots_KBD[i_B + 1, rows_B]

    return _with_velocity(path, t_B)


def _not_a_knot_slopes(y_KM, times_K):
    """dy/dt at the knots of scipy's `CubicSpline(times, y)` (default bc_type="not-a-knot"):
    C2 at interior knots and a continuous third derivative at times[1] and times[-2]. K = 2 is
    the line and K = 3 the parabola through the points, as scipy special-cases them."""
    K = y_KM.shape[0]
    h_S = jnp.diff(times_K)  # S = K - 1 segments
    delta_SM = jnp.diff(y_KM, axis=0) / h_S[:, None]
    if K == 2:
        return jnp.stack([delta_SM[0], delta_SM[0]])
    if K == 3:  # the parabola: its slope is delta_i at each segment's midpoint
        c_M = 2 * (delta_SM[1] - delta_SM[0]) / (h_S[0] + h_S[1])  # its second derivative
        first = delta_SM[0] - c_M * h_S[0] / 2
        return jnp.stack([first, delta_SM[0] + c_M * h_S[0] / 2, delta_SM[1] + c_M * h_S[1] / 2])
    # scipy.interpolate.CubicSpline's system for the slopes s_k, written densely (K is small).
    k = jnp.arange(1, K - 1)
    A_KK = jnp.zeros((K, K), y_KM.dtype)
    A_KK = A_KK.at[k, k - 1].set(h_S[1:]).at[k, k].set(2 * (h_S[:-1] + h_S[1:]))
    A_KK = A_KK.at[k, k + 1].set(h_S[:-1])
    b_inner = 3 * (h_S[1:, None] * delta_SM[:-1] + h_S[:-1, None] * delta_SM[1:])
    d0, d1 = h_S[0] + h_S[1], h_S[-1] + h_S[-2]
    A_KK = A_KK.at[0, 0].set(h_S[1]).at[0, 1].set(d0)
    A_KK = A_KK.at[-1, -2].set(d1).at[-1, -1].set(h_S[-2])
    b_first = ((h_S[0] + 2 * d0) * h_S[1] * delta_SM[0] + h_S[0] ** 2 * delta_SM[1]) / d0
    b_last = (h_S[-1] ** 2 * delta_SM[-2] + (2 * d1 + h_S[-1]) * h_S[-2] * delta_SM[-1]) / d1
    return jnp.linalg.solve(A_KK, jnp.concatenate([b_first[None], b_inner, b_last[None]]))


def cubic_spline(knots_KBD, times_K, t_B):
    """MMFM's mean path: per trajectory, the not-a-knot cubic spline through its knots at the
    shared times (`cubic_fm.py:CubicSplineInterpolation` and `scripts/train_cfm_st.py`, both
    scipy's `CubicSpline` with its default boundary condition), evaluated as cubic Hermite
    segments; u_t is its derivative. Matches scipy to float32 rounding (see the tests)."""
    K, B, D = knots_KBD.shape
    times_K = jnp.asarray(times_K, knots_KBD.dtype)
    slopes_KBD = _not_a_knot_slopes(knots_KBD.reshape(K, B * D), times_K).reshape(K, B, D)
    times_BK = jnp.broadcast_to(times_K, (B, K))
    rows_B = jnp.arange(B)

    def path(t_B):
        i_B = _bracket(times_BK, t_B)
        h_B = times_K[i_B + 1] - times_K[i_B]
        u = ((t_B - times_K[i_B]) / h_B)[:, None]
        h = h_B[:, None]
        y0, y1 = knots_KBD[i_B, rows_B], knots_KBD[i_B + 1, rows_B]
        s0, s1 = slopes_KBD[i_B, rows_B], slopes_KBD[i_B + 1, rows_B]
        return (
            (2 * u**3 - 3 * u**2 + 1) * y0
            + (u**3 - 2 * u**2 + u) * h * s0
            + (3 * u**2 - 2 * u**3) * y1
            + (u**3 - u**2) * h * s1
        )

    return _with_velocity(path, t_B)
