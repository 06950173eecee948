"""Boxes, greedy NMS and the interval bounds of Part 2, as jnp functions (jit- and vmap-friendly).

A detector output is `outputs_N6`: N candidates, columns (x1, y1, x2, y2, s0, s1), corners
normalised by the image side, s_c the class-c confidence (objectness x class probability).
A candidate's class is argmax_c s_c and its score max_c s_c (YOLOv5 / ultralytics); NMS drops
candidates below the confidence threshold `iota` first, then keeps greedily by score, suppressing
a lower-scoring candidate of the same class whose IoU with a kept one exceeds `eta`.

Degenerate boxes (x2 < x1) are allowed, with zero width: the over-approximation Z of Part 1 can
hold such points even though the detector never outputs them, and the bounds below stay sound.
"""

import functools

import jax
import jax.numpy as jnp

BOX, SCORES = slice(0, 4), slice(4, 6)


def area(box_4):
    return jnp.maximum(box_4[..., 2] - box_4[..., 0], 0) * jnp.maximum(
        box_4[..., 3] - box_4[..., 1], 0
    )


def iou(a_4, b_4):
    """IoU of corner boxes, broadcasting over leading axes (0 where both areas are 0)."""
    w = jnp.minimum(a_4[..., 2], b_4[..., 2]) - jnp.maximum(a_4[..., 0], b_4[..., 0])
    h = jnp.minimum(a_4[..., 3], b_4[..., 3]) - jnp.maximum(a_4[..., 1], b_4[..., 1])
    inter = jnp.maximum(w, 0) * jnp.maximum(h, 0)
    union = area(a_4) + area(b_4) - inter
    return jnp.where(union > 0, inter / jnp.where(union > 0, union, 1), 0.0)


def nms_keep(outputs_N6, iota: float, eta: float):
    """Class-aware greedy NMS: which candidates survive (bool [N]). Ties in score are broken by
    the lower index, as a stable sort does."""
    n = outputs_N6.shape[0]
    scores_N = outputs_N6[:, SCORES].max(-1)
    cls_N = outputs_N6[:, SCORES].argmax(-1)
    order_N = jnp.argsort(-scores_N, stable=True)
    boxes_N4 = outputs_N6[order_N, BOX]
    same_NN = cls_N[order_N][:, None] == cls_N[order_N][None, :]
    overlap_NN = (iou(boxes_N4[:, None], boxes_N4[None, :]) > eta) & same_NN
    alive0_N = scores_N[order_N] >= iota

    def visit(k, alive_N):
        # Candidate k (in score order) suppresses every later one it overlaps, if it survived.
        later_N = jnp.arange(n) > k
        return alive_N & ~(alive_N[k] & overlap_NN[k] & later_N)

    alive_N = jax.lax.fori_loop(0, n, visit, alive0_N)
    return jnp.zeros(n, bool).at[order_N].set(alive_N)


def best_iou(outputs_N6, gt_4, q, iota: float, eta: float):
    """The largest IoU with the ground truth among boxes that survive NMS with class q (0 when
    none does): the object is safe at threshold tau iff this is >= tau."""
    keep_N = nms_keep(outputs_N6, iota, eta)
    correct_N = keep_N & (outputs_N6[:, SCORES].argmax(-1) == q)
    return jnp.max(jnp.where(correct_N, iou(outputs_N6[:, BOX], gt_4), 0.0))


# Interval bounds over a box Z = [lo, hi] of outputs (Part 2's sound check).


def iou_lower_fixed(lo_4, hi_4, gt_4):
    """A lower bound of IoU(b, gt) over corner boxes b in [lo, hi]: the smallest intersection
    over the largest union term (IoU = I / (A + G - I) rises with I and falls with A; the two
    extremes may sit at different b, so the bound is sound, not always attained)."""
    w = jnp.minimum(lo_4[..., 2], gt_4[..., 2]) - jnp.maximum(hi_4[..., 0], gt_4[..., 0])
    h = jnp.minimum(lo_4[..., 3], gt_4[..., 3]) - jnp.maximum(hi_4[..., 1], gt_4[..., 1])
    inter = jnp.maximum(w, 0) * jnp.maximum(h, 0)
    biggest = jnp.maximum(hi_4[..., 2] - lo_4[..., 0], 0) * jnp.maximum(
        hi_4[..., 3] - lo_4[..., 1], 0
    )
    union = biggest + area(gt_4) - inter
    return jnp.where(union > 0, inter / jnp.where(union > 0, union, 1), 0.0)


def iou_upper(lo_a4, hi_a4, lo_b4, hi_b4):
    """An upper bound of IoU(a, b) over a in [lo_a, hi_a] and b in [lo_b, hi_b]: the largest
    intersection over the smallest union the areas allow (1 when that union can be 0)."""
    w = jnp.minimum(hi_a4[..., 2], hi_b4[..., 2]) - jnp.maximum(lo_a4[..., 0], lo_b4[..., 0])
    h = jnp.minimum(hi_a4[..., 3], hi_b4[..., 3]) - jnp.maximum(lo_a4[..., 1], lo_b4[..., 1])
    inter = jnp.maximum(w, 0) * jnp.maximum(h, 0)

    def smallest_area(lo_4, hi_4):
        return jnp.maximum(lo_4[..., 2] - hi_4[..., 0], 0) * jnp.maximum(
            lo_4[..., 3] - hi_4[..., 1], 0
        )

    # The union is at least max(area a, area b) and at least A + B - I with I at its largest.
    union = jnp.maximum(
        smallest_area(lo_a4, hi_a4) + smallest_area(lo_b4, hi_b4) - inter,
        jnp.maximum(smallest_area(lo_a4, hi_a4), smallest_area(lo_b4, hi_b4)),
    )
    return jnp.where(union > 0, jnp.minimum(inter / jnp.where(union > 0, union, 1), 1.0), 1.0)


def safe_set(lo_N6, hi_N6, gt_4, q, iota: float, eta: float):
    """Part 2's interval check. Returns (ok_N, iou_lb_N): ok_N[i] when candidate i keeps class q,
    confidence >= iota and survives NMS for every output in [lo, hi] (conditions a, b, d of
    Proposition 2), and iou_lb_N[i] its IoU lower bound with the ground truth (condition c).
    Z is safe at tau when some ok candidate has iou_lb >= tau; the largest such tau is
    max(iou_lb_N[ok_N]) (the interval certificate)."""
    other = 1 - q
    sq_lo, sq_hi = lo_N6[:, 4 + q], hi_N6[:, 4 + q]
    so_lo, so_hi = lo_N6[:, 4 + other], hi_N6[:, 4 + other]
    is_q = sq_lo > so_hi  # (a): class q everywhere in Z
    confident = sq_lo >= iota  # (b)
    # (d): a candidate j != i that could be class q, could pass the threshold and could score at
    # least as high as i must not be able to overlap i by more than eta.
    could_be_q = (sq_hi >= so_lo) & (sq_hi >= iota)
    could_outrank_NN = could_be_q[None, :] & (sq_hi[None, :] >= sq_lo[:, None])
    n = lo_N6.shape[0]
    could_outrank_NN = could_outrank_NN & ~jnp.eye(n, dtype=bool)
    overlap_NN = (
        iou_upper(
            lo_N6[:, None, BOX], hi_N6[:, None, BOX], lo_N6[None, :, BOX], hi_N6[None, :, BOX]
        )
        > eta
    )
    never_suppressed = ~jnp.any(could_outrank_NN & overlap_NN, axis=1)
    ok_N = is_q & confident & never_suppressed
    return ok_N, iou_lower_fixed(lo_N6[:, BOX], hi_N6[:, BOX], gt_4)


@functools.partial(jax.jit, static_argnums=(3, 4, 5))  # called per object and tau, on the host
def interval_certificate(lo_N6, hi_N6, gt_4, q, iota: float, eta: float):
    """The largest tau the interval check proves safe on [lo, hi] (0 when no candidate is ok)."""
    ok_N, iou_lb_N = safe_set(lo_N6, hi_N6, gt_4, q, iota, eta)
    return jnp.max(jnp.where(ok_N, iou_lb_N, 0.0))
