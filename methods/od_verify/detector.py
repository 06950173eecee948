"""A tiny anchor-free YOLO-like detector as pure functions of a params dict (float32, NHWC).

    params = init(rng, cfg)
    raw_BGG7 = apply(params, images_BSS3, cfg)   # per cell: tx, ty, tw, th, obj, class 0, class 1
    outputs_BN6 = forward(params, images_BSS3, cfg)  # = decode(raw): N = G*G, row-major cells

Backbone: three stride-2 3x3 convs (total stride 8: G = S / 8 cells a side), then 3x3 stride-1
convs, SiLU after each, then a 1x1 head with 7 outputs per cell. `decode` is the interface the
verifier reads, columns exactly (x1, y1, x2, y2, s0, s1), corners normalised by the image side:
cx = (col + sigmoid(tx)) / G, w = exp(clip(tw, -4, 4)) / G (the same for y and h), and
s_c = sigmoid(obj) * softmax(class logits)_c (YOLOv5's confidence: objectness x class
probability). Row-major: candidate n is cell (row, col) = divmod(n, G).

`loss`: the cell holding an object's centre is responsible for it (scenes put at most one
object in a cell, `data.py`). Objectness BCE on every cell (1 at responsible cells, 0
elsewhere), class cross-entropy and the box loss (1 - GIoU + L1 on the normalised corners) at
responsible cells; each part averaged per object, so a batch with more objects does not weigh
more.
"""

import dataclasses

import jax
import jax.numpy as jnp

from core.errors import ConfigError

STRIDE = 8  # three stride-2 convs
OUTPUTS = 7  # tx, ty, tw, th, objectness, 2 class logits
CLASSES = 2
TW_CLIP = 4.0  # |log size in cells| bound: keeps exp finite for any input
TYPICAL_SIDE = 17 / 64  # mean object side / image side (data.py: 10-24 px at 64): init prior
OBJECTS_PER_IMAGE = 2.0  # mean objects per image (data.py: 1-3): objectness prior at init
# Loss weights, set once and not searched: the L1 term works on normalised corners (errors ~0.02
# once trained), so it is scaled up to matter next to 1 - GIoU.
GIOU_WEIGHT, L1_WEIGHT, CLASS_WEIGHT, OBJ_WEIGHT = 2.0, 5.0, 1.0, 1.0


@dataclasses.dataclass(frozen=True)
class DetectorConfig:
    """channels: the three stride-2 convs' widths, then one entry per 3x3 stride-1 conv."""

    channels: tuple[int, ...] = (16, 32, 64, 64)
    image: int = 64

    def __post_init__(self):
        ch = self.channels
        if not (isinstance(ch, tuple) and len(ch) >= 3 and all(isinstance(c, int) for c in ch)):
            raise ConfigError(
                f"model.channels={ch!r} must be a tuple of >= 3 ints (3 stride-2 convs, then "
                "3x3 convs)"
            )
        if min(ch) < 1:
            raise ConfigError(f"model.channels={ch!r} must all be positive")
        if isinstance(self.image, bool) or not isinstance(self.image, int):
            raise ConfigError(f"model.image={self.image!r} must be an integer number of pixels")
        if self.image < 2 * STRIDE or self.image % STRIDE:
            raise ConfigError(
                f"model.image={self.image} must be a multiple of {STRIDE} and at least {2 * STRIDE}"
            )

    @property
    def grid(self) -> int:
        return self.image // STRIDE


def init(rng, cfg: DetectorConfig) -> dict:
    """He-normal convs, zero biases; the head starts at the data's priors: boxes of the
    typical size at the cell centre, objectness at the mean fraction of occupied cells."""
    widths = (3, *cfg.channels)
    keys = jax.random.split(rng, len(cfg.channels) + 1)
    he = jax.nn.initializers.he_normal()
    params = {}
    for i, (c_in, c_out) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
        params[f"conv{i}"] = {"w": he(keys[i], (3, 3, c_in, c_out)), "b": jnp.zeros(c_out)}
    G = cfg.grid
    prior = OBJECTS_PER_IMAGE / (G * G)
    size = jnp.log(TYPICAL_SIDE * G)  # log side in cells
    bias = jnp.array([0.0, 0.0, size, size, jnp.log(prior / (1 - prior)), 0.0, 0.0])
    w = 0.01 * jax.random.normal(keys[-1], (1, 1, widths[-1], OUTPUTS))
    params["head"] = {"w": w, "b": bias}
    return params


def _conv(x_BHWC, layer, stride: int):
    y = jax.lax.conv_general_dilated(
        x_BHWC, layer["w"], (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    return y + layer["b"]


def apply(params: dict, images_BSS3, cfg: DetectorConfig):
    """The raw head [B, G, G, 7] of images [B, S, S, 3] in [0, 1]."""
    h = jnp.asarray(images_BSS3, jnp.float32) - 0.5  # centred: the first conv's bias starts at 0
    for i in range(len(cfg.channels)):
        h = jax.nn.silu(_conv(h, params[f"conv{i}"], 2 if i < 3 else 1))
    return _conv(h, params["head"], 1)


def boxes_of(raw_BGG7):
    """Each cell's box (x1, y1, x2, y2) [..., G, G, 4], normalised by the image side."""
    G = raw_BGG7.shape[-2]
    rows = jnp.arange(G, dtype=jnp.float32)[:, None]
    cols = jnp.arange(G, dtype=jnp.float32)[None, :]
    cx = (cols + jax.nn.sigmoid(raw_BGG7[..., 0])) / G
    cy = (rows + jax.nn.sigmoid(raw_BGG7[..., 1])) / G
    w = jnp.exp(jnp.clip(raw_BGG7[..., 2], -TW_CLIP, TW_CLIP)) / G
    h = jnp.exp(jnp.clip(raw_BGG7[..., 3], -TW_CLIP, TW_CLIP)) / G
    return jnp.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=-1)


def decode(raw_BGG7):
    """Candidates [..., G*G, 6]: (x1, y1, x2, y2, s0, s1), cells in row-major order."""
    G = raw_BGG7.shape[-2]
    probs = jax.nn.softmax(raw_BGG7[..., 5:7], axis=-1)
    scores = jax.nn.sigmoid(raw_BGG7[..., 4:5]) * probs
    out = jnp.concatenate([boxes_of(raw_BGG7), scores], axis=-1)
    return out.reshape(*raw_BGG7.shape[:-3], G * G, 6)


def forward(params: dict, images_BSS3, cfg: DetectorConfig):
    """Candidates [B, G*G, 6] of images [B, S, S, 3]: decode(apply(...))."""
    return decode(apply(params, images_BSS3, cfg))


def targets(boxes_BK4, classes_BK, valid_BK, grid: int):
    """Per cell [B, G*G]: whether it is responsible for an object, and that object's box [.., 4]
    and class. A cell holds the object whose centre it contains (the first, were two there)."""
    cx = (boxes_BK4[..., 0] + boxes_BK4[..., 2]) / 2
    cy = (boxes_BK4[..., 1] + boxes_BK4[..., 3]) / 2
    col = jnp.clip(jnp.floor(cx * grid), 0, grid - 1).astype(jnp.int32)
    row = jnp.clip(jnp.floor(cy * grid), 0, grid - 1).astype(jnp.int32)
    cell_BK = row * grid + col
    hit_BKN = (cell_BK[..., None] == jnp.arange(grid * grid)) & valid_BK[..., None]
    pos_BN = hit_BKN.any(axis=1)
    first_BN = jnp.argmax(hit_BKN, axis=1)
    box_BN4 = jnp.take_along_axis(boxes_BK4, first_BN[..., None], axis=1)
    cls_BN = jnp.take_along_axis(classes_BK, first_BN, axis=1)
    return pos_BN, box_BN4, cls_BN


def giou(a_N4, b_N4):
    """Generalised IoU of corner boxes (elementwise): IoU - (hull - union) / hull."""
    area = lambda r: jnp.prod(r[..., 2:] - r[..., :2], axis=-1)  # noqa: E731
    lo, hi = jnp.maximum(a_N4[..., :2], b_N4[..., :2]), jnp.minimum(a_N4[..., 2:], b_N4[..., 2:])
    inter = jnp.prod(jnp.clip(hi - lo, 0), axis=-1)
    union = area(a_N4) + area(b_N4) - inter
    hull_lo = jnp.minimum(a_N4[..., :2], b_N4[..., :2])
    hull = jnp.prod(jnp.maximum(a_N4[..., 2:], b_N4[..., 2:]) - hull_lo, axis=-1)
    iou = inter / jnp.maximum(union, 1e-9)  # 1e-9: degenerate (zero-area) boxes only
    return iou - (hull - union) / jnp.maximum(hull, 1e-9), iou


def loss_from_raw(raw_BGG7, batch) -> tuple[jax.Array, dict]:
    """The YOLO-style loss of a raw head against a batch of scenes (module docstring)."""
    G = raw_BGG7.shape[-2]
    B = raw_BGG7.shape[0]
    pos_BN, box_BN4, cls_BN = targets(batch["boxes"], batch["classes"], batch["valid"], G)
    raw_BN7 = raw_BGG7.reshape(B, G * G, OUTPUTS).astype(jnp.float32)
    pred_BN4 = boxes_of(raw_BGG7).reshape(B, G * G, 4)
    pos = pos_BN.astype(jnp.float32)
    objects = jnp.maximum(pos.sum(), 1.0)
    obj = jnp.sum(_bce(raw_BN7[..., 4], pos)) / objects
    log_probs = jax.nn.log_softmax(raw_BN7[..., 5:7], axis=-1)
    cls = -jnp.sum(pos * jnp.take_along_axis(log_probs, cls_BN[..., None], -1)[..., 0]) / objects
    g, iou = giou(pred_BN4, box_BN4)
    box = jnp.sum(pos * (1.0 - g)) / objects
    l1 = jnp.sum(pos * jnp.abs(pred_BN4 - box_BN4).sum(-1)) / objects
    total = GIOU_WEIGHT * box + L1_WEIGHT * l1 + CLASS_WEIGHT * cls + OBJ_WEIGHT * obj
    correct = jnp.argmax(raw_BN7[..., 5:7], -1) == cls_BN
    metrics = {
        "obj_loss": obj,
        "class_loss": cls,
        "giou_loss": box,
        "l1_loss": l1,
        "iou": jnp.sum(pos * iou) / objects,
        "class_accuracy": jnp.sum(pos * correct) / objects,
    }
    return total, metrics


def _bce(logits, target):
    return jnp.maximum(logits, 0) - logits * target + jnp.log1p(jnp.exp(-jnp.abs(logits)))


def loss(params: dict, batch, cfg: DetectorConfig) -> tuple[jax.Array, dict]:
    """`loss_from_raw` of the detector's head on `batch["images"]`."""
    return loss_from_raw(apply(params, batch["images"], cfg), batch)
