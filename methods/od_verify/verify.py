"""ODPV: Parts 1-3 and the outer loop, on any detector given as `forward(images_BSS3) ->
outputs_BN6` (columns x1, y1, x2, y2, s0, s1; see `boxes`).

    s = Settings.from_config(config.verify)
    sampler = Sampler(forward, x0_SS3, eps, key)         # uniform on the L-inf ball, clipped
    z = part1(sampler, s)                                 # the box Z around F(x0)
    pool = Pool(sampler, s)                               # Part 3's fresh samples, drawn lazily
    status = certify(z, pool, gt_4, q, tau=0.5, s=s)      # "safe" | "unsafe" | "unknown"
    bounds = certified_bound(z, pool, gt_4, q, s)        # the largest tau certified, T=0 and T=T

Part 1 (Proposition 1): v_max, the coordinate-wise largest |F(x) - F(x0)| over N1 samples
(floored: a saturated sigmoid has none), then c1 = max_k max_j |F(x_k) - F(x0)|_j / v_max_j over
N2 fresh samples (the scenario program min c s.t. |F(x_k) - F(x0)| <= c v_max has this as its
solution), Z = F(x0) +- c1 v_max. With N2 >= `n2_bound(alpha, beta)`, P(F(x) in Z) >= 1 - alpha
with confidence 1 - beta, whatever the output dimension.

Part 2: the interval check (`boxes.safe_set`), then the exact search (`mip`).

Part 3 (our reading; the paper's text is the specification and it leaves the order statistics
open): for a counterexample y over the relevant coordinates R, g(x) = ||F(x)_R - y_R||_2.
Stage 1: C, the largest ratio |g(x) - g(x')| / ||F(x)_R - F(x')_R|| over M fresh pairs (how much
an output move shows up in the distance; in [0, 1] by the triangle inequality). Stage 2: B <= A,
the two smallest g over M2 fresh samples; d_min = max((B - C (A - B)) / (1 + 2C), 0). Any
d_min <= B keeps the guarantee: the ball of radius B around y holds none of M2 samples, so its
mass is <= alpha with confidence 1 - (1 - alpha)^M2 (Theorem 2's term). If d_min <= kappa the
counterexample is reachable ("unsafe"); otherwise the ball is cut from Z and Part 2 runs again,
at most T times. "safe" after t refinements holds at level (1 + t) alpha.
"""

import dataclasses
import functools
import math
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from core.errors import ConfigError
from methods.od_verify import boxes, mip


def n2_bound(alpha: float, beta: float) -> int:
    """Proposition 1's sample count for Part 1's scalar scenario program."""
    _check_levels(alpha, beta)
    return math.ceil(2 * math.log(1 / beta) / alpha + 2 + 2 * math.log(2 / alpha) / alpha)


def scenario_count(alpha: float, beta: float, dim: int) -> int:
    """Campi & Garatti's count for a convex scenario program with `dim` decision variables:
    N >= (2 / alpha)(ln(1 / beta) + dim). dim = 1: the scalar baseline; dim = the output size:
    RCP_N (a half-width per output coordinate)."""
    _check_levels(alpha, beta)
    return math.ceil(2 / alpha * (math.log(1 / beta) + dim))


def _check_levels(alpha, beta):
    for name, v in (("alpha", alpha), ("beta", beta)):
        if not 0 < v < 1:
            raise ConfigError(f"od_verify: verify.{name}={v}; a probability in (0, 1)")


@dataclasses.dataclass(frozen=True)
class Settings:
    alpha: float = 0.05
    beta: float = 0.05
    iota: float = 0.25  # NMS confidence threshold (the paper's)
    eta: float = 0.45  # NMS IoU threshold (the paper's)
    n1: int = 2000
    n2: int = 0  # 0: n2_bound(alpha, beta)
    pairs: int = 10  # Part 3 stage 1: M
    m2: int = 500  # Part 3 stage 2
    kappa: float = 0.01  # distance (normalised output units) below which y counts as reachable
    refinements: int = 1  # T
    floor: float = 1e-6  # v_max's floor
    bisect: int = 6  # bisection steps of the certified IoU bound
    chunk: int = 1024  # images per forward call
    time_limit: float = 20.0  # seconds per exact search

    @classmethod
    def from_config(cls, cfg) -> "Settings":
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(cfg) - fields
        if unknown:
            raise ConfigError(f"od_verify: unknown verify fields {sorted(unknown)}")
        s = cls(**dict(cfg))
        n2_bound(s.alpha, s.beta)
        if s.n2 and s.n2 < n2_bound(s.alpha, s.beta):
            raise ConfigError(
                f"od_verify: verify.n2={s.n2} < Proposition 1's "
                f"{n2_bound(s.alpha, s.beta)} for alpha={s.alpha}, beta={s.beta}"
            )
        for name in ("n1", "pairs", "m2", "chunk"):
            if getattr(s, name) < 1:
                raise ConfigError(f"od_verify: verify.{name}={getattr(s, name)}; at least 1")
        return s

    @property
    def n2_used(self) -> int:
        return self.n2 or n2_bound(self.alpha, self.beta)


class Sampler:
    """Outputs of uniform samples from the L-inf ball of radius eps around x0 (clipped to
    [0, 1]), drawn in chunks from a key split per call, counted (`self.count`)."""

    def __init__(self, forward, x0_SS3, eps: float, key, chunk: int = 1024):
        if eps < 0:
            raise ConfigError(f"od_verify: eps={eps}; must be >= 0")
        self.forward, self.x0, self.eps, self.key, self.chunk = forward, x0_SS3, eps, key, chunk
        self.count = 0
        self.seconds = 0.0
        self.out0_N6 = np.asarray(forward(jnp.asarray(x0_SS3)[None]))[0].astype(np.float64)

    def iou_at_x0(self, gt_4, q: int, iota: float, eta: float) -> float:
        """The post-NMS best-box IoU of F(x0), a point of Z (the certified bound's ceiling)."""
        return float(boxes.best_iou(jnp.asarray(self.out0_N6, jnp.float32), gt_4, q, iota, eta))

    def draw(self, n: int) -> np.ndarray:
        start = time.perf_counter()
        self.key, key = jax.random.split(self.key)
        out = []
        # Calls of a power-of-two size up to `chunk`: few compiled shapes, little waste.
        size = min(self.chunk, 1 << max(n - 1, 1).bit_length())
        for k, i in enumerate(range(0, n, size)):
            b = min(size, n - i)
            out.append(
                np.asarray(
                    _perturbed_outputs(
                        self.forward, self.x0, self.eps, jax.random.fold_in(key, k), size
                    )
                )[:b]
            )
        self.count += n
        self.seconds += time.perf_counter() - start
        return np.concatenate(out).astype(np.float64)


def perturb(key, x0_SS3, eps: float, n: int):
    noise = jax.random.uniform(key, (n, *x0_SS3.shape), minval=-eps, maxval=eps)
    return jnp.clip(x0_SS3[None] + noise, 0.0, 1.0)


@functools.partial(jax.jit, static_argnums=(0, 4))
def _perturbed_outputs(forward, x0_SS3, eps, key, n):
    return forward(perturb(key, x0_SS3, eps, n))


class Z(NamedTuple):
    lo_N6: np.ndarray
    hi_N6: np.ndarray
    c1: float


def part1(sampler: Sampler, s: Settings) -> Z:
    out0 = sampler.out0_N6
    v_max = np.maximum(np.abs(sampler.draw(s.n1) - out0).max(0), s.floor)
    c1 = float((np.abs(sampler.draw(s.n2_used) - out0) / v_max).max())
    return Z(out0 - c1 * v_max, out0 + c1 * v_max, c1)


def rcp_box(sampler: Sampler, alpha: float, beta: float) -> Z:
    """RCP_N: a half-width per output coordinate, the max deviation over the scenario count
    for that many variables (the box that ODPV's Z generalises with one scalar)."""
    out0 = sampler.out0_N6
    n = scenario_count(alpha, beta, out0.size)
    half = np.abs(sampler.draw(n) - out0).max(0)
    return Z(out0 - half, out0 + half, float("nan"))


class Pool:
    """Part 3's fresh samples (M pairs, M2 singles), drawn the first time a counterexample
    needs them and shared by every search on the same Z."""

    def __init__(self, sampler: Sampler, s: Settings):
        self.sampler, self.s = sampler, s
        self._pairs = self._singles = None

    def distance(self, y_N6, rel) -> float:
        if self._singles is None:
            self._pairs = self.sampler.draw(2 * self.s.pairs).reshape(2, self.s.pairs, -1, 6)
            self._singles = self.sampler.draw(self.s.m2)
        a_MR, b_MR = (p[:, rel].reshape(self.s.pairs, -1) for p in self._pairs)
        y_R = y_N6[rel].reshape(-1)
        ga, gb = np.linalg.norm(a_MR - y_R, axis=1), np.linalg.norm(b_MR - y_R, axis=1)
        moved = np.linalg.norm(a_MR - b_MR, axis=1)
        c = float(np.max(np.abs(ga - gb) / np.maximum(moved, 1e-12)))
        g = np.sort(np.linalg.norm(self._singles[:, rel].reshape(self.s.m2, -1) - y_R, axis=1))
        b, a = g[0], g[1]
        return max((b - c * (a - b)) / (1 + 2 * c), 0.0)


class Outcome(NamedTuple):
    status: str  # "safe" | "unsafe" | "unknown"
    by: str  # "interval" | "mip" | "refined" | "reachable" | "limit" | "time"
    refinements: int
    spurious: int  # found points whose NMS keeps the object (boundary ties)
    search_seconds: float = 0.0  # the exact searches' solver time


def certify(
    z: Z, pool: Pool | None, gt_4, q: int, tau: float, s: Settings, refinements: int | None = None
) -> Outcome:
    """Parts 2 and 3 at one tau (pool None: no refinement, as RCP_N)."""
    t_max = s.refinements if refinements is None else refinements
    if pool is None:
        t_max = 0
    cert = float(boxes.interval_certificate(z.lo_N6, z.hi_N6, gt_4, q, s.iota, s.eta))
    if cert >= tau:
        return Outcome("safe", "interval", 0, 0)
    exclude, spurious, seconds = [], 0, 0.0
    for t in range(t_max + 1):
        found = mip.find_counterexample(
            z.lo_N6,
            z.hi_N6,
            gt_4,
            q,
            tau=tau,
            iota=s.iota,
            eta=s.eta,
            exclude=exclude,
            time_limit=s.time_limit,
        )
        seconds += found.seconds
        if found.status == "none":
            return Outcome("safe", "mip" if t == 0 else "refined", t, spurious, seconds)
        if found.status == "unknown":
            return Outcome("unknown", "time", t, spurious, seconds)
        spurious += not found.confirmed
        if t == t_max:
            return Outcome("unknown", "limit", t, spurious, seconds)
        d_min = pool.distance(found.z_N6, found.relevant)
        if d_min <= s.kappa:
            return Outcome("unsafe", "reachable", t, spurious, seconds)
        exclude.append((found.z_N6, d_min))
    raise AssertionError("unreachable")


def certified_bound(
    z: Z,
    pool: Pool | None,
    gt_4,
    q: int,
    s: Settings,
    upper: float,
    refinements: int = 0,
    lower: float | None = None,
) -> float:
    """The largest tau certified safe, by bisection between the interval certificate (or
    `lower`, a tau already certified) and `upper` (an IoU some z in Z attains, e.g. F(x0)'s):
    `s.bisect` exact searches at most. Sound at any step: only certified values are returned."""
    lo = float(boxes.interval_certificate(z.lo_N6, z.hi_N6, gt_4, q, s.iota, s.eta))
    lo = max(lo, lower or 0.0)
    hi = upper
    for _ in range(s.bisect):
        if hi - lo < 1e-3:
            break
        mid = (lo + hi) / 2
        if certify(z, pool, gt_4, q, mid, s, refinements=refinements).status == "safe":
            lo = mid
        else:
            hi = mid
    return lo
