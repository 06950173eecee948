"""Flow matching and DDPM: noising paths, schedules and samplers for any model.

Flow (rectified / linear path, DDT's convention): t = 1 is data, t = 0 noise,

    x_t = t x + (1 - t) eps,   target velocity v = dx_t/dt = x - eps,

t drawn "lognorm" (sigmoid of a standard normal, `sample_t`) or "uniform".

DDPM: linear betas, alpha_t = 1 - beta_t, alpha_bar_t = prod_{s <= t} alpha_s (steps indexed
0..T-1, 0 nearly clean); x_t = sqrt(alpha_bar_t) x + sqrt(1 - alpha_bar_t) eps; the model
predicts eps.

Samplers take a model as two functions, not a module, so any network plugs in:

    encode(x_BHWC, t_B, y_B) -> s          (any pytree: per-token conditions, or () )
    decode(x_BHWC, t_B, y_B, s) -> pred    (velocity for `euler`, eps for `ddim` / `ddpm`)

(`core.nn.dit.sampler_fns`; `unsplit(apply)` for a model without the split). Each sampler is
one `lax.scan` over its steps. `share_every = r` recomputes s only every r-th step (encoder
sharing: steps 0, r, 2r, ...; the encoder runs ceil(steps / r) times, skipped at run time by
`lax.cond`) and decodes every step with the current x and t. `Guidance` is classifier-free
guidance, pred = uncond + scale (cond - uncond), applied where t_min <= t <= t_max (in the time
the sampler passes to the model: flow t in [0, 1], DDPM step index) and the conditional
prediction elsewhere. With guidance every step runs the doubled batch (conditional and null
labels together), also outside the interval: the carried s must stay valid for both halves.

With `core.nn.dit.sampler_fns(..., feature_cache=True)` the carried s is every block's branch
outputs, so share_every = N is FORA's feature cache (Q&C). ddim's `correct(x, i) -> (x, aux)` is
applied after each step's update (a post-step correction such as Q&C's variance compensation),
and with `trajectory=True` ddim returns a `Trajectory`: the final x, the sample entering each
step, and correct's aux stacked over steps.
"""

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from core.errors import ConfigError

T_SAMPLERS = ("lognorm", "uniform")


def check_t_sampler(t_sampler: str) -> None:
    if t_sampler not in T_SAMPLERS:
        raise ConfigError(
            f"t_sampler: unknown {t_sampler!r}; expected one of: {', '.join(T_SAMPLERS)}"
        )


def sample_t(rng: jax.Array, shape, t_sampler: str = "lognorm") -> jax.Array:
    """Flow times in (0, 1): "lognorm" sigmoid(N(0, 1)) (mass in the middle), "uniform"."""
    check_t_sampler(t_sampler)
    if t_sampler == "lognorm":
        return jax.nn.sigmoid(jax.random.normal(rng, shape))
    return jax.random.uniform(rng, shape)


def _bcast(t_B, x):
    """t [B] shaped to broadcast against x [B, ...]."""
    return jnp.reshape(t_B, t_B.shape + (1,) * (x.ndim - t_B.ndim)).astype(x.dtype)


def flow_path(x, eps, t_B):
    """x_t = t x + (1 - t) eps (t = 1 data)."""
    t = _bcast(t_B, x)
    return t * x + (1 - t) * eps


def flow_target(x, eps):
    """The path's velocity dx_t/dt = x - eps, the flow model's regression target."""
    return x - eps


class FlowExample(NamedTuple):
    x_t: jax.Array
    t: jax.Array  # [B]
    eps: jax.Array
    target: jax.Array  # x - eps


def flow_noised(rng: jax.Array, x, *, t_sampler: str = "lognorm") -> FlowExample:
    """One (t, eps) per example of x [B, ...]: the model's input and its velocity target."""
    rng_t, rng_eps = jax.random.split(rng)
    t_B = sample_t(rng_t, x.shape[:1], t_sampler)
    eps = jax.random.normal(rng_eps, x.shape, x.dtype)
    return FlowExample(flow_path(x, eps, t_B), t_B, eps, flow_target(x, eps))


class DDPMSchedule(NamedTuple):
    betas: np.ndarray  # float64 [T] (host constants: exact cumulative products)
    alphas: np.ndarray
    alpha_bars: np.ndarray

    @property
    def num_steps(self) -> int:
        return len(self.betas)


def ddpm_schedule(
    num_steps: int = 1000, beta_start: float = 1e-4, beta_end: float = 0.02
) -> DDPMSchedule:
    """Linear betas (Ho et al.); alpha_bar = cumprod(1 - beta), in float64 on the host."""
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ConfigError(f"num_steps must be a positive int, got {num_steps!r}")
    if not 0 < beta_start <= beta_end < 1:
        raise ConfigError(
            f"betas must satisfy 0 < beta_start <= beta_end < 1, got {beta_start}, {beta_end}"
        )
    betas = np.linspace(beta_start, beta_end, num_steps, dtype=np.float64)
    alphas = 1.0 - betas
    return DDPMSchedule(betas, alphas, np.cumprod(alphas))


def ddpm_noised(rng: jax.Array, x, schedule: DDPMSchedule):
    """(x_t, t [B] int32, eps): a uniform step per example, x_t from the closed-form marginal."""
    rng_t, rng_eps = jax.random.split(rng)
    t_B = jax.random.randint(rng_t, x.shape[:1], 0, schedule.num_steps)
    eps = jax.random.normal(rng_eps, x.shape, x.dtype)
    ab = _bcast(jnp.asarray(schedule.alpha_bars, jnp.float32)[t_B], x)
    return jnp.sqrt(ab) * x + jnp.sqrt(1 - ab) * eps, t_B, eps


class Guidance(NamedTuple):
    """Classifier-free guidance: scale (1 = the conditional model), the null label, and the
    closed time interval where it applies."""

    scale: float
    null_label: int
    t_min: float = -math.inf
    t_max: float = math.inf


def unsplit(apply_fn: Callable):
    """(encode, decode) for a model apply(x, t, y) -> pred without a condition encoder."""
    return (lambda x, t, y: ()), (lambda x, t, y, s: apply_fn(x, t, y))


def _check_share_every(share_every):
    if isinstance(share_every, bool) or not isinstance(share_every, int) or share_every < 1:
        raise ConfigError(f"share_every must be a positive int, got {share_every!r}")


class Trajectory(NamedTuple):
    """A sampler's run with `trajectory=True`."""

    x: jax.Array  # the final sample
    inputs: jax.Array  # [steps, B, ...]: the sample entering each step (what the model saw)
    aux: Any  # `correct`'s second output stacked over steps (None without `correct`)


def _scan(
    update,
    encode,
    decode,
    x_init,
    y_B,
    times,
    coeffs,
    *,
    rng,
    guidance,
    share_every,
    correct=None,
    trajectory=False,
):
    """The shared sampling loop: for each step i (one scan), refresh s when i % share_every ==
    0, predict (with guidance), then x = update(x, pred, coeffs[i], key_i), and, with
    `correct`, (x, aux_i) = correct(x, i) (a post-step correction such as Q&C's variance
    compensation). trajectory=True returns a `Trajectory` instead of the final x."""
    _check_share_every(share_every)
    B = x_init.shape[0]
    if guidance is None:
        widen = lambda x: x  # noqa: E731
        y_in = y_B
    else:
        widen = lambda x: jnp.concatenate([x, x])  # noqa: E731
        y_in = jnp.concatenate([y_B, jnp.full_like(y_B, guidance.null_label)])
    t_shape = (y_in.shape[0],)
    s_shape = jax.eval_shape(encode, widen(x_init), jnp.zeros(t_shape, jnp.float32), y_in)
    s_init = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), s_shape)
    rng = jax.random.key(0) if rng is None else rng

    def step(carry, xs):
        x, s = carry
        i, t, coeff = xs
        x_in, t_in = widen(x), jnp.full(t_shape, t, jnp.float32)
        s = lax.cond(i % share_every == 0, lambda: encode(x_in, t_in, y_in), lambda: s)
        pred = decode(x_in, t_in, y_in, s)
        if guidance is not None:
            cond, uncond = pred[:B], pred[B:]
            guided = uncond + guidance.scale * (cond - uncond)
            inside = (guidance.t_min <= t) & (t <= guidance.t_max)
            pred = jnp.where(inside, guided, cond)
        x_next = update(x, pred.astype(x.dtype), coeff, jax.random.fold_in(rng, i))
        aux = None
        if correct is not None:
            x_next, aux = correct(x_next, i)
        return (x_next, s), ((x if trajectory else None), aux)

    steps = len(times)
    xs = (jnp.arange(steps), jnp.asarray(times, jnp.float32), coeffs)
    (x, _), (inputs, aux) = lax.scan(step, (x_init, s_init), xs)
    return Trajectory(x, inputs, aux) if trajectory else x


def euler(encode, decode, x_noise, y_B, *, steps: int, guidance=None, share_every: int = 1):
    """The flow ODE from t = 0 (x_noise) to t = 1 (data) in `steps` uniform Euler steps,
    x += dt v(x, t)."""
    t_grid = np.linspace(0.0, 1.0, steps + 1)
    dt = jnp.asarray(np.diff(t_grid), jnp.float32)
    update = lambda x, v, dt_i, key: x + dt_i * v  # noqa: E731
    return _scan(
        update,
        encode,
        decode,
        x_noise,
        y_B,
        t_grid[:-1],
        dt,
        rng=None,
        guidance=guidance,
        share_every=share_every,
    )


def ddim_timesteps(schedule: DDPMSchedule, steps: int) -> np.ndarray:
    """`steps` step indices from T - 1 down to 0, evenly spaced (all of them when steps = T)."""
    if (
        isinstance(steps, bool)
        or not isinstance(steps, int)
        or not 1 <= steps <= len(schedule.betas)
    ):
        raise ConfigError(f"steps must be an int in [1, {schedule.num_steps}], got {steps!r}")
    return np.round(np.linspace(schedule.num_steps - 1, 0, steps)).astype(np.int64)


def ddim(
    encode,
    decode,
    x_noise,
    y_B,
    schedule: DDPMSchedule,
    *,
    steps: int,
    eta: float = 0.0,
    rng=None,
    guidance=None,
    share_every: int = 1,
    correct=None,
    trajectory: bool = False,
):
    """DDIM (Song et al.) with an eps-predicting model from x_noise at step T - 1 to data: per
    step t -> t_prev (the last to alpha_bar = 1),

        x0 = (x - sqrt(1 - ab_t) eps) / sqrt(ab_t)
        x  = sqrt(ab_prev) x0 + sqrt(1 - ab_prev - sigma^2) eps + sigma z,
        sigma = eta sqrt((1 - ab_prev) / (1 - ab_t) (1 - ab_t / ab_prev)).

    eta = 0 is deterministic (rng unused); eta = 1 over all T steps is DDPM's ancestral sampler
    with the posterior variance (`ddpm`); eta = 1 over fewer steps is respaced DDPM. `correct`
    and `trajectory`: as `_scan`'s (a post-step correction; the per-step inputs returned)."""
    if rng is None and not (isinstance(eta, int | float) and eta == 0):
        raise ValueError("ddim with eta != 0 needs rng")
    taus = ddim_timesteps(schedule, steps)
    ab = schedule.alpha_bars
    ab_t = ab[taus]
    ab_prev = np.concatenate([ab[taus[1:]], [1.0]])
    sigma_unit = np.sqrt((1 - ab_prev) / (1 - ab_t) * (1 - ab_t / ab_prev))
    coeffs = tuple(jnp.asarray(c, jnp.float32) for c in (ab_t, ab_prev, sigma_unit))

    def update(x, eps, coeff, key):
        ab_t, ab_prev, sigma_unit = coeff
        sigma = eta * sigma_unit
        x0 = (x - jnp.sqrt(1 - ab_t) * eps) / jnp.sqrt(ab_t)
        direction = jnp.sqrt(jnp.maximum(1 - ab_prev - sigma**2, 0.0)) * eps
        noise = sigma * jax.random.normal(key, x.shape, x.dtype)
        return jnp.sqrt(ab_prev) * x0 + direction + noise

    return _scan(
        update,
        encode,
        decode,
        x_noise,
        y_B,
        taus.astype(np.float64),
        coeffs,
        rng=rng,
        guidance=guidance,
        share_every=share_every,
        correct=correct,
        trajectory=trajectory,
    )


def ddpm(
    encode, decode, x_noise, y_B, schedule: DDPMSchedule, *, rng, guidance=None, share_every=1
):
    """DDPM's ancestral sampler over all T steps with the posterior variance beta~_t: DDIM with
    eta = 1 (the same update: mean sqrt(ab_prev) x0 + sqrt(1 - ab_prev - beta~) eps)."""
    return ddim(
        encode,
        decode,
        x_noise,
        y_B,
        schedule,
        steps=schedule.num_steps,
        eta=1.0,
        rng=rng,
        guidance=guidance,
        share_every=share_every,
    )
