"""Synthetic detection scenes: filled squares (class 0) and discs (class 1) on a plain background.

    s = scenes(256, 64, split_seed("validation", 0))
    s.images_BSS3  # float32 in [0, 1]
    s.boxes_BK4    # (x1, y1, x2, y2) / image side; a disc's box is its bounding square
    s.classes_BK   # int32, 0 = square, 1 = disc
    s.valid_BK     # bool: 1-3 objects per image in K = 3 slots, unused slots zero

Pure NumPy and deterministic: example i of a set with seed s is drawn from
`np.random.default_rng([s, i])` alone (layout, colours, then noise), which is also how
`core.data.synthetic` seeds example i of a stream, so the training stream of a seed is the same
scenes as `scenes(n, size, seed)` and resumes exactly. `split_seed` maps (split, data seed)
one-to-one onto seeds, so the train, validation and test splits never share a generator.

An object is a square or disc of side (diameter) 10-24 px at size 64 (scaled with the size),
fully inside the image, on integer pixel corners. A placement is redrawn when its box overlaps
an earlier object's with IoU > 0.1 or its centre falls in the same 8 x 8 px cell (the
detector's stride: one object per responsible cell); after `ATTEMPTS` failures the image keeps
the objects it has. Colours are saturated (HSV s, v >= 0.7); the background is a dark or light
near-grey, so every object differs from it by at least ~0.4 in some channel, well above the
additive Gaussian pixel noise (sigma 0.04 by default; the image is clipped to [0, 1] after it).
"""

from typing import NamedTuple

import numpy as np

from core.errors import ConfigError

K = 3  # object slots per image
CELL = 8  # px: the detector's stride, the placement rule's grid
MIN_SIDE, MAX_SIDE = 10 / 64, 24 / 64  # object side as a fraction of the image side
MAX_IOU = 0.1
ATTEMPTS = 50  # placements tried per object before the image keeps fewer objects
NOISE = 0.04
SPLITS = ("train", "validation", "test")


class Scenes(NamedTuple):
    images_BSS3: np.ndarray  # float32 in [0, 1]
    boxes_BK4: np.ndarray  # float32 (x1, y1, x2, y2) normalised by the image side
    classes_BK: np.ndarray  # int32: 0 square, 1 disc
    valid_BK: np.ndarray  # bool

    def objects(self, i: int) -> list[tuple[np.ndarray, int]]:
        """Image i's ground truth: (box_4, class) per valid slot."""
        return [(self.boxes_BK4[i, k], int(self.classes_BK[i, k]))
                for k in np.flatnonzero(self.valid_BK[i])]  # fmt: skip

    def batch(self) -> dict[str, np.ndarray]:
        """The dict a training step reads (`detector.loss`)."""
        return {
            "images": self.images_BSS3,
            "boxes": self.boxes_BK4,
            "classes": self.classes_BK,
            "valid": self.valid_BK,
        }


def check_size(size) -> int:
    if isinstance(size, bool) or not isinstance(size, int | np.integer):
        raise ConfigError(f"model.image={size!r} must be an integer number of pixels")
    if size < 16 or size % CELL:
        raise ConfigError(f"model.image={size} must be a multiple of {CELL} and at least 16")
    return int(size)


def split_seed(split: str, seed: int) -> int:
    """The generator seed of `split` for data seed `seed`: one-to-one, so two (split, seed)
    pairs never share scenes."""
    if split not in SPLITS:
        raise ConfigError(f"split={split!r} is unknown; expected one of: {', '.join(SPLITS)}")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ConfigError(f"data.seed={seed!r} must be a non-negative integer")
    return len(SPLITS) * int(seed) + SPLITS.index(split)


def side_range(size: int) -> tuple[int, int]:
    """The smallest and largest object side in px at image side `size`."""
    return max(3, round(MIN_SIDE * size)), round(MAX_SIDE * size)


def _iou(a, b) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    inter = max(w, 0) * max(h, 0)
    area = lambda r: (r[2] - r[0]) * (r[3] - r[1])  # noqa: E731
    return inter / (area(a) + area(b) - inter)


def _hsv_to_rgb(h: float, s: float, v: float) -> np.ndarray:
    k = (np.array([5.0, 3.0, 1.0]) + 6.0 * h) % 6.0
    return v - v * s * np.clip(np.minimum(k, 4.0 - k), 0.0, 1.0)


def layout(rng: np.random.Generator, size: int):
    """One image's background [3] and objects [(class, box (x1, y1, x2, y2) in px, centre
    cell (col, row), colour [3])], drawn from `rng` in this order (then `from_generators` draws
    the noise from it)."""
    dark = rng.random() < 0.5
    level = rng.uniform(0.05, 0.3) if dark else rng.uniform(0.7, 0.95)
    background = np.clip(level + rng.uniform(-0.05, 0.05, 3), 0.0, 1.0)
    lo, hi = side_range(size)
    objects = []
    for _ in range(rng.integers(1, K + 1)):
        for _ in range(ATTEMPTS):
            side = int(rng.integers(lo, hi + 1))
            x1, y1 = (int(v) for v in rng.integers(0, size - side + 1, 2))
            box = (x1, y1, x1 + side, y1 + side)
            cell = ((2 * x1 + side) // (2 * CELL), (2 * y1 + side) // (2 * CELL))
            if all(_iou(box, o[1]) <= MAX_IOU and cell != o[2] for o in objects):
                break
        else:
            break  # no room found: this image keeps the objects it has
        colour = _hsv_to_rgb(rng.random(), rng.uniform(0.7, 1.0), rng.uniform(0.7, 1.0))
        objects.append((int(rng.integers(2)), box, cell, colour))
    return background, objects


def from_generators(rngs: list[np.random.Generator], size: int, noise: float = NOISE) -> Scenes:
    """One scene per generator (its layout, then its noise), painted in one vectorised pass."""
    size = check_size(size)
    if not rngs:
        raise ConfigError("scenes: n=0 images; need at least 1")
    if not noise >= 0:
        raise ConfigError(f"data.noise={noise!r} must be a non-negative pixel sigma")
    B = len(rngs)
    background_B3 = np.zeros((B, 3), np.float32)
    corners_BK4 = np.zeros((B, K, 4), np.float32)  # px
    colour_BK3 = np.zeros((B, K, 3), np.float32)
    classes_BK = np.zeros((B, K), np.int32)
    valid_BK = np.zeros((B, K), bool)
    for b, rng in enumerate(rngs):
        background_B3[b], objects = layout(rng, size)
        for k, (cls, box, _, colour) in enumerate(objects):
            corners_BK4[b, k], colour_BK3[b, k], classes_BK[b, k] = box, colour, cls
            valid_BK[b, k] = True
    # Pixel centres against each object's square or inscribed disc: [B, K, S] per axis.
    centre_S = np.arange(size, dtype=np.float32) + 0.5
    x1, y1, x2, y2 = (corners_BK4[..., i, None] for i in range(4))
    in_x, in_y = (centre_S > x1) & (centre_S < x2), (centre_S > y1) & (centre_S < y2)
    square_BKSS = in_y[..., :, None] & in_x[..., None, :]
    r = (x2 - x1) / 2
    dx2, dy2 = (centre_S - (x1 + r)) ** 2, (centre_S - (y1 + r)) ** 2
    disc_BKSS = dy2[..., :, None] + dx2[..., None, :] <= (r * r)[..., None]
    is_disc = (classes_BK == 1)[..., None, None]
    mask_BKSS = np.where(is_disc, disc_BKSS, square_BKSS) & valid_BK[..., None, None]
    images_BSS3 = np.broadcast_to(background_B3[:, None, None], (B, size, size, 3)).copy()
    for k in range(K):  # later objects are painted over earlier ones
        m = mask_BKSS[:, k, :, :, None]
        images_BSS3 = np.where(m, colour_BK3[:, k, None, None], images_BSS3)
    if noise > 0:
        for b, rng in enumerate(rngs):
            images_BSS3[b] += noise * rng.standard_normal((size, size, 3), dtype=np.float32)
    np.clip(images_BSS3, 0.0, 1.0, out=images_BSS3)
    return Scenes(images_BSS3.astype(np.float32), corners_BK4 / size, classes_BK, valid_BK)


def scenes(n: int, size: int, seed: int, noise: float = NOISE) -> Scenes:
    """n scenes of side `size`, example i from `np.random.default_rng([seed, i])`."""
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ConfigError(f"scenes: n={n!r} images; need an integer of at least 1")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ConfigError(f"scenes: seed={seed!r} must be a non-negative integer")
    return from_generators([np.random.default_rng([seed, i]) for i in range(n)], size, noise)
