"""Part 2's exact search: an output z in Z = [lo, hi] where no box survives NMS with class q and
IoU >= tau, as a mixed-integer program with bilinear constraints, solved by SCIP (pyscipopt).

    result = find_counterexample(lo_N6, hi_N6, gt_4, q, tau=0.5, iota=0.25, eta=0.45)
    result.status  # "found" | "none" | "unknown" (time limit); result.z_N6 when found

Only the relevant candidates enter the program: those that could be class q with confidence
>= iota somewhere in Z (`relevant`). Any other candidate is never kept as class q and, NMS being
class-aware, never suppresses one, so its coordinates do not matter (they are set to Z's midpoint
in the returned z). Per relevant candidate i the program has its six coordinates and binaries
p_i (passes: class q and confident), k_i (kept by greedy NMS); per ordered pair o_ij (i outranks
j) and per unordered pair v_ij (IoU > eta). Greedy NMS is encoded exactly given the order:
k_i = p_i and no kept j that outranks i overlaps it; the counterexample condition is k_i = 1 =>
IoU(i, gt) <= tau for every i. IoU > x becomes I > x (A + B - I), bilinear in widths and heights.

The search runs twice at most. First with every test non-strict on the failing side (a box is
dropped at confidence <= iota, loses a tie of class or score either way, is suppressed at IoU
>= eta, is wrong at IoU <= tau): the feasible set then holds every real counterexample, so
"none" is a proof on Z. A point found this way may sit on a boundary (a tie, an IoU of exactly
tau) where NMS in fact keeps the object; NMS on it tells (`confirmed`). Only then, the search
runs again with each strict test kept strict by a margin `STRICT`, which finds real
counterexamples; if that one finds none, the boundary point is returned unconfirmed (the object
is lost only on a set of measure ~0 in Z), and the caller treats it as a counterexample, the
conservative side. Coordinates are normalised (O(1)), so the big-M constants are safe by a wide
margin.
"""

import dataclasses
import itertools

import numpy as np

from methods.od_verify import boxes

BIG = 50.0  # big-M for coordinate and area (in)equalities; |coordinates| stay < 5 on any Z here
# The margin of a strict inequality in the second search: 100x SCIP's feasibility tolerance
# (1e-6), so that a found point stays a counterexample once read back and rounded to float32
# (with 1e-6, a box at IoU 0.500002 came back as "below 0.5").
STRICT = 1e-4


@dataclasses.dataclass
class Search:
    status: str  # "found" | "none" | "unknown"
    z_N6: np.ndarray | None
    relevant: np.ndarray  # indices of the candidates in the program
    seconds: float
    confirmed: bool = False  # a found z whose NMS really loses the object (not a boundary tie)


def relevant(lo_N6, hi_N6, q: int, iota: float) -> np.ndarray:
    sq_hi, so_lo = hi_N6[:, 4 + q], lo_N6[:, 5 - q]
    return np.flatnonzero((sq_hi >= so_lo) & (sq_hi >= iota))


def _width_vars(m, name, lo_a, hi_a, lo_b, hi_b):
    """Variables below and above max(0, b - a) for a in [lo_a, hi_a], b in [lo_b, hi_b]: the
    lower one exact when the solver wants it large, the upper one when it wants it small."""
    top = max(hi_b - lo_a, 0.0)
    low = m.addVar(f"{name}_lo", lb=0.0, ub=top)
    up = m.addVar(f"{name}_up", lb=0.0, ub=top)
    return low, up


def find_counterexample(
    lo_N6, hi_N6, gt_4, q: int, *, tau: float, iota: float, eta: float, exclude=(),
    time_limit: float = 20.0,
) -> Search:  # fmt: skip
    """`exclude`: balls (y_N6, radius) removed from Z (refinement): the search keeps
    ||z_R - y_R||_2 >= radius over the relevant candidates' coordinates."""
    args = (lo_N6, hi_N6, gt_4, q, tau, iota, eta, exclude, time_limit)
    sound = _search(*args, gap=0.0)
    if sound.status != "found" or sound.confirmed:
        return sound
    strict = _search(*args, gap=STRICT)
    if strict.status == "found" and strict.confirmed:
        strict.seconds += sound.seconds
        return strict
    sound.seconds += strict.seconds
    return sound


def _search(lo_N6, hi_N6, gt_4, q, tau, iota, eta, exclude, time_limit, *, gap) -> Search:
    """One search; `gap` 0 (every real counterexample feasible) or STRICT (strict tests)."""
    import pyscipopt

    lo_N6, hi_N6 = np.asarray(lo_N6, np.float64), np.asarray(hi_N6, np.float64)
    gt = [float(v) for v in np.asarray(gt_4)]
    rel = relevant(lo_N6, hi_N6, q, iota)
    mid_N6 = (lo_N6 + hi_N6) / 2
    if rel.size == 0:  # no candidate can ever be kept as class q: every z loses the object
        return Search("found", mid_N6, rel, 0.0, confirmed=True)
    m = pyscipopt.Model()
    m.hideOutput()
    m.setParam("limits/time", time_limit)
    z = {}  # (i, c) -> variable; c in 0..5 (x1, y1, x2, y2, s0, s1)
    for i, c in itertools.product(rel, range(6)):
        z[i, c] = m.addVar(f"z{i}_{c}", lb=lo_N6[i, c], ub=hi_N6[i, c])
    sq = {i: z[i, 4 + q] for i in rel}
    so = {i: z[i, 5 - q] for i in rel}
    area_lo, area_up = {}, {}
    for i in rel:
        w_lo, w_up = _width_vars(m, f"w{i}", lo_N6[i, 0], hi_N6[i, 0], lo_N6[i, 2], hi_N6[i, 2])
        h_lo, h_up = _width_vars(m, f"h{i}", lo_N6[i, 1], hi_N6[i, 1], lo_N6[i, 3], hi_N6[i, 3])
        for wl, wu, a, b in ((w_lo, w_up, z[i, 0], z[i, 2]), (h_lo, h_up, z[i, 1], z[i, 3])):
            m.addCons(wu >= b - a)  # wu >= max(0, b - a)
            d = m.addVar(vtype="B")  # wl <= max(0, b - a): either wl <= b - a, or wl = 0
            m.addCons(wl <= b - a + BIG * d)
            m.addCons(wl <= BIG * (1 - d))
        area_lo[i] = m.addVar(f"alo{i}", lb=0.0)
        area_up[i] = m.addVar(f"aup{i}", lb=0.0)
        m.addCons(area_lo[i] <= w_lo * h_lo)
        m.addCons(area_up[i] >= w_up * h_up)

    def inter_up(name, a, b):
        """A variable >= the intersection area of boxes a and b (4 coordinates each: variables
        or constants): max(0, min(x2) - max(x1)) per axis, min/max chosen by binaries."""
        sides = []
        for lo_c, hi_c in ((0, 2), (1, 3)):
            top = m.addVar(lb=-BIG, ub=BIG)  # >= min(a_hi, b_hi)
            bot = m.addVar(lb=-BIG, ub=BIG)  # <= max(a_lo, b_lo)
            s, t = m.addVar(vtype="B"), m.addVar(vtype="B")
            m.addCons(top >= a[hi_c] - BIG * s)
            m.addCons(top >= b[hi_c] - BIG * (1 - s))
            m.addCons(bot <= a[lo_c] + BIG * t)
            m.addCons(bot <= b[lo_c] + BIG * (1 - t))
            side = m.addVar(lb=0.0, ub=BIG)
            m.addCons(side >= top - bot)
            sides.append(side)
        inter = m.addVar(f"{name}", lb=0.0)
        m.addCons(inter >= sides[0] * sides[1])
        return inter

    def inter_lo(name, a, b, on):
        """A variable <= the intersection of a and b whenever binary `on` is 1 (both sides then
        non-negative: the four differences bound each side from above)."""
        sides = []
        for lo_c, hi_c in ((0, 2), (1, 3)):
            side = m.addVar(lb=0.0, ub=BIG)
            for hi_v, lo_v in itertools.product((a[hi_c], b[hi_c]), (a[lo_c], b[lo_c])):
                m.addCons(side <= hi_v - lo_v + BIG * (1 - on))
            sides.append(side)
        inter = m.addVar(f"{name}", lb=0.0)
        m.addCons(inter <= sides[0] * sides[1])
        return inter

    coords = {i: [z[i, c] for c in range(4)] for i in rel}
    gt_area = max(gt[2] - gt[0], 0.0) * max(gt[3] - gt[1], 0.0)
    keep, passes = {}, {}
    for i in rel:
        passes[i] = m.addVar(f"p{i}", vtype="B")
        keep[i] = m.addVar(f"k{i}", vtype="B")
        m.addCons(sq[i] >= so[i] - BIG * (1 - passes[i]))  # passes => class q ...
        m.addCons(sq[i] >= iota - BIG * (1 - passes[i]))  # ... and confident
        fail_cls = m.addVar(vtype="B")  # not passing => class other or below iota
        tie = gap if q == 0 else 0.0  # argmax gives a tie to class 0
        m.addCons(sq[i] <= so[i] - tie + BIG * (passes[i] + (1 - fail_cls)))
        m.addCons(sq[i] <= iota - gap + BIG * (passes[i] + fail_cls))
        m.addCons(keep[i] <= passes[i])
        # The counterexample: a kept box has IoU(i, gt) < tau, i.e. (1 + t) I <= t (A + G) with
        # t = tau - gap.
        inter = inter_up(f"ig{i}", coords[i], gt)
        t = tau - gap
        m.addCons((1 + t) * inter - t * (area_lo[i] + gt_area) <= BIG * (1 - keep[i]))

    outranks, suppress = {}, {}
    ious = boxes.iou_upper
    for i, j in itertools.combinations(rel, 2):
        for a, b in ((i, j), (j, i)):
            outranks[a, b] = m.addVar(vtype="B")  # at a tie the lower index goes first
            m.addCons(sq[a] >= sq[b] + (0 if a < b else gap) - BIG * (1 - outranks[a, b]))
            m.addCons(sq[a] <= sq[b] - (gap if a < b else 0) + BIG * outranks[a, b])
        m.addCons(outranks[i, j] + outranks[j, i] >= 1)
        could = float(ious(lo_N6[i, :4], hi_N6[i, :4], lo_N6[j, :4], hi_N6[j, :4])) >= eta
        if not could:  # IoU(i, j) <= eta on all of Z: the pair never suppresses
            continue
        over = m.addVar(vtype="B")  # IoU(i, j) > eta when 1, <= eta when 0
        i_lo = inter_lo(f"il{i}_{j}", coords[i], coords[j], over)
        i_up = inter_up(f"iu{i}_{j}", coords[i], coords[j])
        e = eta + gap
        m.addCons((1 + e) * i_lo - e * (area_up[i] + area_up[j]) >= -BIG * (1 - over))
        m.addCons((1 + eta) * i_up - eta * (area_lo[i] + area_lo[j]) <= BIG * over)
        for a, b in ((i, j), (j, i)):  # a suppresses b: a kept, a outranks b, they overlap
            s = suppress[a, b] = m.addVar(vtype="B")
            m.addCons(s <= keep[a])
            m.addCons(s <= outranks[a, b])
            m.addCons(s <= over)
            m.addCons(s >= keep[a] + outranks[a, b] + over - 2)
            m.addCons(keep[b] <= 1 - s)
    for i in rel:  # kept exactly when passing and not suppressed
        m.addCons(
            keep[i] >= passes[i] - pyscipopt.quicksum(s for (a, b), s in suppress.items() if b == i)
        )
    for y_N6, radius in exclude:
        dist2 = pyscipopt.quicksum((z[i, c] - float(y_N6[i, c])) ** 2 for i, c in z)
        m.addCons(dist2 >= float(radius) ** 2)
    m.optimize()
    seconds = float(m.getSolvingTime())
    if m.getNSols() == 0:
        status = "none" if m.getStatus() == "infeasible" else "unknown"
        return Search(status, None, rel, seconds)
    sol = m.getBestSol()
    z_N6 = mid_N6.copy()
    for (i, c), var in z.items():
        z_N6[i, c] = np.clip(m.getSolVal(sol, var), lo_N6[i, c], hi_N6[i, c])
    best = float(boxes.best_iou(z_N6.astype(np.float32), np.asarray(gt, np.float32), q, iota, eta))
    return Search("found", z_N6, rel, seconds, confirmed=best < tau)
