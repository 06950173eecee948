"""ODPV's verifier: Proposition 1's count, Part 1's scenario solution and coverage, the interval
bounds against sampled boxes, NMS against a plain reference, the exact search, Part 3."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core.errors import ConfigError
from methods.od_verify import boxes, mip, verify

IOTA, ETA = 0.25, 0.45


def test_n2_bound_is_proposition_1():
    # 2 ln(1/b)/a + 2 + 2 ln(2/a)/a, by hand: 932.4 + 2 + 1072.4 at a = b = 0.0099 (the
    # "about 2,010" of the paper's setting), 119.8 + 2 + 147.6 at 0.05 (the CI configuration's 270).
    assert verify.n2_bound(0.0099, 0.0099) == 2007
    assert verify.n2_bound(0.05, 0.05) == 270
    assert verify.scenario_count(0.05, 0.05, 1) == math.ceil(40 * (math.log(20) + 1))
    with pytest.raises(ConfigError, match="verify.alpha=1.5"):
        verify.n2_bound(1.5, 0.05)
    with pytest.raises(ConfigError, match="verify.n2=100 < Proposition 1's 270"):
        verify.Settings.from_config({"n2": 100})
    with pytest.raises(ConfigError, match="unknown verify fields"):
        verify.Settings.from_config({"alpah": 0.1})


class FakeSampler:
    """Outputs drawn from a known distribution (a planted F(x)), as verify.Sampler."""

    def __init__(self, seed, shape=(4, 6)):
        self.rng = np.random.default_rng(seed)
        self.out0_N6 = np.zeros(shape)
        self.scale = np.linspace(0.01, 0.2, np.prod(shape)).reshape(shape)
        self.count = 0

    def draw(self, n):
        self.count += n
        return self.rng.standard_t(5, (n, *self.out0_N6.shape)) * self.scale


def test_part1_c1_is_the_scenario_solution():
    s = verify.Settings(n1=300)
    sampler = FakeSampler(0)
    z = verify.part1(sampler, s)
    # Replay the same draws: v_max from the first N1, the ratio's max over the next N2.
    replay = FakeSampler(0)
    v_max = np.maximum(np.abs(replay.draw(300)).max(0), s.floor)
    second = replay.draw(s.n2_used)
    assert z.c1 == pytest.approx((np.abs(second) / v_max).max(), rel=1e-12)
    # The solution is the smallest feasible c: every N2 sample inside Z, one on its boundary.
    assert np.all((second >= z.lo_N6 - 1e-12) & (second <= z.hi_N6 + 1e-12))
    assert np.isclose(np.abs(second / (z.c1 * v_max)).max(), 1.0)
    assert sampler.count == 300 + 270


def test_part1_coverage_is_at_the_scenario_rate():
    # For a continuous distribution and a fixed v_max, the violation probability of a scalar
    # scenario program with N2 samples is Beta(1, N2): mean 1 / (N2 + 1) = 0.0037 at N2 = 270,
    # and P(violation > alpha) = (1 - alpha)^N2 ~ 1e-6. Over 200 planted repetitions (2,000
    # fresh samples each) the mean is within 4 standard errors (~0.00026 each) of it.
    s = verify.Settings(n1=200)
    rates = []
    for rep in range(200):
        sampler = FakeSampler(rep)
        z = verify.part1(sampler, s)
        fresh = sampler.draw(2000)
        rates.append(np.mean(np.any((fresh < z.lo_N6) | (fresh > z.hi_N6), axis=(1, 2))))
    rates = np.array(rates)
    expected = 1 / (s.n2_used + 1)
    se = np.sqrt(expected * (1 - expected) / 2000 / 200 + expected**2 / 200)
    assert abs(rates.mean() - expected) < 4 * se
    assert rates.max() <= s.alpha


def _random_boxes(rng, n):
    c = rng.uniform(0.2, 0.8, (n, 2))
    wh = rng.uniform(0.05, 0.4, (n, 2))
    return np.concatenate([c - wh / 2, c + wh / 2], -1)


def test_interval_iou_bounds_hold_for_every_box_inside():
    rng = np.random.default_rng(1)
    for _ in range(50):
        a, b = _random_boxes(rng, 2)
        wa, wb = rng.uniform(0, 0.1, 4), rng.uniform(0, 0.1, 4)
        lower = float(boxes.iou_lower_fixed(a - wa, a + wa, b))
        upper = float(boxes.iou_upper(a - wa, a + wa, b - wb, b + wb))
        u = rng.uniform(0, 1, (2000, 4))
        u[:16] = np.array(list(itertools.product((0, 1), repeat=4)))  # the corners too
        inside_a = a - wa + 2 * wa * u
        inside_b = b - wb + 2 * wb * rng.uniform(0, 1, (2000, 4))
        assert float(boxes.iou(inside_a, b).min()) >= lower - 1e-6
        assert float(boxes.iou(inside_a, inside_b).max()) <= upper + 1e-6


def _greedy_nms(out, iota, eta):
    """Plain Python: ultralytics' class-aware greedy NMS."""
    cls, score = out[:, 4:].argmax(1), out[:, 4:].max(1)
    keep = []
    for i in sorted(range(len(out)), key=lambda i: (-score[i], i)):
        if score[i] < iota:
            continue
        if all(cls[k] != cls[i] or boxes.iou(out[k, :4], out[i, :4]) <= eta for k in keep):
            keep.append(i)
    return sorted(keep)


def test_nms_matches_a_plain_greedy_reference():
    rng = np.random.default_rng(2)
    for _ in range(30):
        out = np.concatenate([_random_boxes(rng, 12), rng.uniform(0, 0.6, (12, 2))], 1)
        out = out.astype(np.float32)
        keep = np.flatnonzero(np.asarray(boxes.nms_keep(jnp.asarray(out), IOTA, ETA)))
        assert keep.tolist() == _greedy_nms(out, IOTA, ETA)


def _planted_z(rng, width):
    """A box Z around five candidates: two near the ground truth (class q), three elsewhere."""
    gt = np.array([0.3, 0.3, 0.6, 0.6])
    q = int(rng.integers(2))
    out = np.concatenate([_random_boxes(rng, 5), rng.uniform(0, 1, (5, 2))], 1)
    out[0, :4] = gt + rng.normal(0, 0.03, 4)
    out[0, 4 + q], out[0, 5 - q] = rng.uniform(0.4, 0.9), rng.uniform(0, 0.2)
    out[1, :4] = gt + rng.normal(0, 0.05, 4)
    out[1, 4 + q] = out[0, 4 + q] + rng.normal(0, 0.1)
    w = width * rng.uniform(0.5, 1.5, out.shape)
    return out - w, out + w, gt, q


_best = jax.jit(jax.vmap(boxes.best_iou, in_axes=(0, None, None, None, None)),
                static_argnums=(2, 3, 4))  # fmt: skip


def test_exact_search_and_interval_check_agree_with_sampled_nms():
    # Soundness both ways on random Z: the interval certificate is below every sampled output's
    # post-NMS IoU; the search reports "none" only when no sample (corners included) loses the
    # object, and each point it finds really loses it under NMS.
    rng = np.random.default_rng(3)
    seen = set()
    for _ in range(16):
        lo, hi, gt, q = _planted_z(rng, rng.choice([0.005, 0.02, 0.04]))
        u = rng.uniform(0, 1, (4000, *lo.shape))
        u[:1000] = np.round(u[:1000])
        sampled = np.asarray(_best(jnp.asarray(lo + u * (hi - lo), jnp.float32), gt, q, IOTA, ETA))
        cert = float(boxes.interval_certificate(lo, hi, gt, q, IOTA, ETA))
        assert cert <= sampled.min() + 1e-6
        found = mip.find_counterexample(lo, hi, gt, q, tau=0.5, iota=IOTA, eta=ETA)
        assert found.status in ("none", "found")
        if found.status == "none":
            assert sampled.min() >= 0.5
        else:
            assert found.confirmed
        seen.add(found.status)
    assert seen == {"none", "found"}  # both branches exercised


def test_exact_search_finds_a_planted_counterexample():
    # One good box whose confidence interval reaches below iota: dropping it loses the object;
    # the same box, tighter and with a confidence safely above iota, is proven safe by the
    # interval check and by the search.
    gt = np.array([0.3, 0.3, 0.6, 0.6])
    out = np.array([[0.3, 0.3, 0.6, 0.6, 0.27, 0.05], [0.0, 0.0, 0.1, 0.1, 0.01, 0.01]])
    lo, hi = out - 0.03, out + 0.03
    found = mip.find_counterexample(lo, hi, gt, 0, tau=0.5, iota=IOTA, eta=ETA)
    assert found.status == "found" and found.confirmed
    assert found.z_N6[0, 4] < IOTA
    out[0, 4] = 0.6
    lo, hi = out - 0.01, out + 0.01  # corners within 0.01: IoU >= 0.28^2 / 0.114 = 0.69
    assert float(boxes.interval_certificate(lo, hi, gt, 0, IOTA, ETA)) >= 0.5
    assert mip.find_counterexample(lo, hi, gt, 0, tau=0.5, iota=IOTA, eta=ETA).status == "none"


def test_part3_distance_is_below_the_nearest_sample():
    s = verify.Settings(pairs=4, m2=50)
    sampler = FakeSampler(4)
    pool = verify.Pool(sampler, s)
    y = np.full((4, 6), 0.05)
    rel = np.array([1, 3])
    d = pool.distance(y, rel)
    nearest = np.linalg.norm(pool._singles[:, rel].reshape(50, -1) - y[rel].reshape(-1), axis=1)
    assert 0 <= d <= nearest.min()
    assert sampler.count == 2 * 4 + 50
    pool.distance(y, rel)  # the pool is shared: no new samples
    assert sampler.count == 58


def test_exact_search_finds_suppression_by_a_wrong_box():
    # A wrong box (IoU 0.47 with the truth) that scores higher and overlaps the correct box by
    # IoU 0.47 > eta suppresses it: the object is lost although a correct box passes every
    # threshold. With the wrong box scoring lower, the correct one survives everywhere in Z.
    gt = np.array([0.3, 0.3, 0.6, 0.6])
    out = np.array([[0.3, 0.3, 0.6, 0.6, 0.50, 0.05], [0.36, 0.36, 0.66, 0.66, 0.55, 0.05]])
    lo, hi = out - 0.002, out + 0.002
    found = mip.find_counterexample(lo, hi, gt, 0, tau=0.5, iota=IOTA, eta=ETA)
    assert found.status == "found" and found.confirmed
    ok_N, _ = boxes.safe_set(lo, hi, gt, 0, IOTA, ETA)
    assert not ok_N[0] and ok_N[1]  # condition (d) rules out the correct box, not the wrong one
    out[1, 4] = 0.40
    lo, hi = out - 0.002, out + 0.002
    assert mip.find_counterexample(lo, hi, gt, 0, tau=0.5, iota=IOTA, eta=ETA).status == "none"
