"""Procedural fake fetal ultrasound: the images of the Fetal-Gauge phantom benchmark (paper 16).

Each `scan` draws one sector ("fan") image of a kind (head, abdomen, femur, thorax, fetus,
lesion) with its task labels and the bounding boxes of its visible structures. The anatomy is
drawn first from the generator; the style (speckle strength, blur, gain, background) is applied
afterwards, with the speckle from a seed drawn after the anatomy, so the same generator state
gives the same anatomy, labels and boxes in both styles: the clinical-vs-phantom comparison is
paired by scan. What the images let us test of the paper's findings:
- box size: VG structures span small (thalami, stomach bubble, spine: a few pixels at 64 px),
  medium (falx, heart, femur) and large (skull, abdomen, thorax) boxes (records.box_bin);
- style gap: "phantom" has weaker speckle, sharp edges, no depth attenuation, a grey
  background and a different gain, so a model trained on "clinical" alone may not transfer.

Rendering happens at 2 * size and is area-averaged down to `size`; structure masks are
downsampled the same way and boxes are taken at the output size (`mask_to_bbox`, padded by
one pixel so the outline drawn later leaves the structure itself visible).
VC: "standard plane" when the ellipse is complete, centred and at the right zoom; a
"non-standard plane" breaks exactly one of the three (fault "cut", "off-centre" or "zoom").
"""

import dataclasses
import functools

import numpy as np
from scipy import ndimage

from core.errors import ConfigError
from methods.fetal_gauge import records
from methods.fetal_gauge.vocab import VOCAB

SIZE = 64
KINDS = ("head", "abdomen", "femur", "thorax", "fetus", "lesion")
FAULTS = ("cut", "off-centre", "zoom")
PLANE = {
    "head": "trans-thalamic plane",
    "abdomen": "abdominal circumference plane",
    "femur": "femur length plane",
    "thorax": "four-chamber heart plane",
}
# Fan geometry in units of the image side: apex above the top edge, depth range, half-angle.
APEX = (0.5, -0.06)
FAN_RADII = (0.12, 1.02)
FAN_HALF_ANGLE = np.deg2rad(46.0)
# A standard plane's ellipse: its centre, and its semi-major axis range (image-side units).
CENTRE = (0.5, 0.56)
STANDARD_AXIS = (0.25, 0.30)
OFF_CENTRE_SHIFT = (0.13, 0.17)  # far enough that the box centre leaves the centred tolerance
ZOOM_FACTORS = ((0.5, 0.62), (1.28, 1.38))  # too small / too large, still inside the fan
# Boxes lie one pixel outside the structure, so the red outline never paints over a small
# structure's own pixels (a 4-pixel spine would otherwise vanish under its box).
BOX_PAD = 1
# Coverage a downsampled mask pixel needs: a quarter keeps 2-render-pixel lines connected.
MASK_COVERAGE = 0.25


@dataclasses.dataclass(frozen=True)
class Scan:
    kind: str
    style: str  # in records.STYLES
    image: np.ndarray  # uint8 [size, size] grayscale, after resizing
    labels: dict  # task -> canonical answer (vocab.VOCAB[task] texts)
    structures: dict  # VG structure name -> bbox (x0, y0, x1, y1) at the output size
    # Drawn geometry at the output size (centre, axes, fault, head side ...): what tests check
    # the labels against. Additive to the contract's fields.
    geometry: dict = dataclasses.field(default_factory=dict)


def mask_to_bbox(mask: np.ndarray, pad: int = 0) -> tuple[int, int, int, int]:
    """Tight (x0, y0, x1, y1) of the nonzero pixels (inclusive), widened by `pad` and clipped."""
    ys, xs = np.nonzero(mask)
    if ys.size == 0:
        raise ConfigError("fetal_gauge phantoms: mask_to_bbox of an empty mask")
    h, w = mask.shape
    return (
        max(int(xs.min()) - pad, 0),
        max(int(ys.min()) - pad, 0),
        min(int(xs.max()) + pad, w - 1),
        min(int(ys.max()) + pad, h - 1),
    )


@functools.lru_cache(maxsize=8)
def _grid(render: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Pixel-centre coordinates in image-side units, the fan mask and the depth in the fan."""
    coords = (np.arange(render, dtype=np.float32) + 0.5) / render
    yy, xx = np.meshgrid(coords, coords, indexing="ij")
    dx, dy = xx - APEX[0], yy - APEX[1]
    depth = np.hypot(dx, dy)
    fan = (depth > FAN_RADII[0]) & (depth < FAN_RADII[1])
    fan &= np.abs(np.arctan2(dx, dy)) < FAN_HALF_ANGLE
    for array in (xx, yy, fan, depth):
        array.setflags(write=False)
    return xx, yy, fan, depth


def _ellipse_radius(xx, yy, centre, axes, angle):
    """Normalised radius: 1 on the ellipse with semi-axes `axes`, rotated by `angle`."""
    cos, sin = np.cos(angle), np.sin(angle)
    dx, dy = xx - centre[0], yy - centre[1]
    u = (dx * cos + dy * sin) / axes[0]
    v = (-dx * sin + dy * cos) / axes[1]
    return np.sqrt(u * u + v * v)


def _segment_distance(xx, yy, start, end):
    """Distance of every pixel to the segment start-end."""
    px, py = xx - start[0], yy - start[1]
    sx, sy = end[0] - start[0], end[1] - start[1]
    t = np.clip((px * sx + py * sy) / (sx * sx + sy * sy), 0.0, 1.0)
    return np.hypot(px - t * sx, py - t * sy)


def _rotate(vector, angle):
    cos, sin = np.cos(angle), np.sin(angle)
    return (vector[0] * cos - vector[1] * sin, vector[0] * sin + vector[1] * cos)


def _plane_geometry(rng, label):
    """Centre, semi-axes and rotation of a plane's main ellipse, and the fault it shows."""
    fault = None if label == "standard plane" else FAULTS[rng.integers(len(FAULTS))]
    major = rng.uniform(*STANDARD_AXIS)
    axes = (major, major * rng.uniform(0.78, 0.9))
    angle = rng.uniform(-0.35, 0.35)
    centre = (CENTRE[0] + rng.uniform(-0.02, 0.02), CENTRE[1] + rng.uniform(-0.02, 0.02))
    side = 1.0 if rng.random() < 0.5 else -1.0
    if fault == "off-centre":  # sideways or down: the fan is narrow near its apex
        shift = rng.uniform(*OFF_CENTRE_SHIFT)
        direction = rng.uniform(0.0, 0.6)
        centre = (
            CENTRE[0] + side * shift * np.cos(direction),
            CENTRE[1] + shift * np.sin(direction),
        )
    elif fault == "zoom":
        factor = rng.uniform(*ZOOM_FACTORS[rng.integers(2)])
        axes = (axes[0] * factor, axes[1] * factor)
    elif fault == "cut":  # pushed across the fan's side edge: part of the ellipse is missing
        centre = (CENTRE[0] + side * rng.uniform(0.4, 0.46), CENTRE[1] + rng.uniform(-0.02, 0.1))
    return centre, axes, angle, fault


def _head(rng, xx, yy, label):
    centre, axes, angle, fault = _plane_geometry(rng, label)
    radius = _ellipse_radius(xx, yy, centre, axes, angle)
    thickness = rng.uniform(0.035, 0.05) / axes[1]
    skull = np.abs(radius - 1.0) < thickness / 2
    brain = radius < 1.0 - thickness / 2
    falx_half = _rotate((axes[0] * 0.75, 0.0), angle)
    falx_start = (centre[0] - falx_half[0], centre[1] - falx_half[1])
    falx_end = (centre[0] + falx_half[0], centre[1] + falx_half[1])
    falx = _segment_distance(xx, yy, falx_start, falx_end) < 0.012
    offset = _rotate((axes[0] * rng.uniform(-0.08, 0.08), axes[1] * 0.24), angle)
    blob = (axes[0] * rng.uniform(0.1, 0.13), axes[1] * rng.uniform(0.1, 0.13))
    thalami = np.zeros_like(skull)
    for sign in (1.0, -1.0):
        blob_centre = (centre[0] + sign * offset[0], centre[1] + sign * offset[1])
        thalami |= _ellipse_radius(xx, yy, blob_centre, blob, angle) < 1.0
    layers = [(brain, 0.3), (thalami, 0.04), (falx, 0.85), (skull, 1.0)]
    masks = {"skull": skull, "midline falx": falx, "thalami": thalami}
    return layers, masks, {"centre": centre, "axes": axes, "angle": angle, "fault": fault}


def _abdomen(rng, xx, yy, label):
    centre, axes, angle, fault = _plane_geometry(rng, label)
    radius = _ellipse_radius(xx, yy, centre, axes, angle)
    wall = np.abs(radius - 1.0) < 0.03 / axes[1]
    abdomen = radius < 1.0 + 0.015 / axes[1]
    stomach_offset = _rotate((axes[0] * rng.uniform(-0.45, -0.25), axes[1] * -0.2), angle)
    stomach_axes = (axes[0] * rng.uniform(0.16, 0.22), axes[1] * rng.uniform(0.12, 0.17))
    stomach_centre = (centre[0] + stomach_offset[0], centre[1] + stomach_offset[1])
    stomach = _ellipse_radius(xx, yy, stomach_centre, stomach_axes, angle) < 1.0
    spine = _spine(xx, yy, centre, axes, angle, rng)
    layers = [(abdomen & ~wall, 0.4), (wall, 0.75), (stomach, 0.03), (spine, 1.0)]
    masks = {"abdomen": abdomen, "stomach bubble": stomach, "spine": spine}
    return layers, masks, {"centre": centre, "axes": axes, "angle": angle, "fault": fault}


def _spine(xx, yy, centre, axes, angle, rng):
    """Three bright ossification dots in a small triangle just inside the back of the ellipse."""
    back = _rotate((axes[0] * rng.uniform(0.25, 0.45), axes[1] * 0.6), angle)
    base = (centre[0] + back[0], centre[1] + back[1])
    spine = np.zeros(xx.shape, bool)
    for dx, dy in ((-0.022, 0.0), (0.022, 0.0), (0.0, 0.025)):
        spine |= np.hypot(xx - base[0] - dx, yy - base[1] - dy) < 0.012
    return spine


def _thorax(rng, xx, yy, label):
    centre, axes, angle, fault = _plane_geometry(rng, label)
    radius = _ellipse_radius(xx, yy, centre, axes, angle)
    ribs = np.abs(radius - 1.0) < 0.025 / axes[1]
    thorax = radius < 1.0 + 0.0125 / axes[1]
    heart_offset = _rotate((axes[0] * rng.uniform(-0.3, -0.15), axes[1] * -0.1), angle)
    heart_centre = (centre[0] + heart_offset[0], centre[1] + heart_offset[1])
    heart_axes = (axes[0] * rng.uniform(0.36, 0.44), axes[1] * rng.uniform(0.36, 0.44))
    heart_angle = angle + rng.uniform(0.4, 0.9)
    heart = _ellipse_radius(xx, yy, heart_centre, heart_axes, heart_angle) < 1.0
    # Four chambers: dark quadrants split by a bright cross (septum and valves).
    cos, sin = np.cos(heart_angle), np.sin(heart_angle)
    u = (xx - heart_centre[0]) * cos + (yy - heart_centre[1]) * sin
    v = -(xx - heart_centre[0]) * sin + (yy - heart_centre[1]) * cos
    cross = heart & ((np.abs(u) < 0.008) | (np.abs(v) < 0.008))
    spine = _spine(xx, yy, centre, axes, angle, rng)
    layers = [(thorax & ~ribs, 0.5), (ribs, 0.8), (heart, 0.05), (cross, 0.7), (spine, 1.0)]
    masks = {"thorax": thorax, "heart": heart, "spine": spine}
    return layers, masks, {"centre": centre, "axes": axes, "angle": angle, "fault": fault}


def _femur(rng, xx, yy, label):
    length = rng.uniform(0.2, 0.5)
    angle = rng.uniform(-0.7, 0.7)
    mid = (0.5 + rng.uniform(-0.06, 0.06), 0.56 + rng.uniform(-0.06, 0.06))
    half = _rotate((length / 2, 0.0), angle)
    start, end = (mid[0] - half[0], mid[1] - half[1]), (mid[0] + half[0], mid[1] + half[1])
    distance = _segment_distance(xx, yy, start, end)
    femur = distance < rng.uniform(0.014, 0.02)
    soft_tissue = distance < 0.09
    layers = [(soft_tissue, 0.45), (femur, 1.0)]
    return layers, {"femur": femur}, {"centre": mid, "length": length, "angle": angle}


# Where the head lies relative to the body (image y grows downwards; the probe is at the top,
# so "cephalic", head towards the maternal pelvis, is drawn head-down, "breech" head-up).
HEAD_DIRECTION = {
    "cephalic": (0.0, 1.0),
    "breech": (0.0, -1.0),
    "transverse, head left": (-1.0, 0.0),
    "transverse, head right": (1.0, 0.0),
}


def _fetus(rng, xx, yy, label):
    direction = _rotate(HEAD_DIRECTION[label], rng.uniform(-0.25, 0.25))
    body_centre = (0.5 + rng.uniform(-0.04, 0.04), 0.58 + rng.uniform(-0.04, 0.04))
    body_axes = (rng.uniform(0.17, 0.21), rng.uniform(0.09, 0.12))
    body_angle = np.arctan2(direction[1], direction[0])
    head_radius = rng.uniform(0.085, 0.11)
    reach = body_axes[0] + head_radius * 0.8
    head_centre = (body_centre[0] + reach * direction[0], body_centre[1] + reach * direction[1])
    body = _ellipse_radius(xx, yy, body_centre, body_axes, body_angle) < 1.0
    head_distance = np.hypot(xx - head_centre[0], yy - head_centre[1])
    skull = np.abs(head_distance - head_radius) < 0.017
    head = head_distance < head_radius
    layers = [(body, 0.6), (head, 0.3), (skull, 1.0)]
    geometry = {"body_centre": body_centre, "head_centre": head_centre, "direction": direction}
    return layers, {"skull": skull}, geometry


def _lesion(rng, xx, yy, label):
    centre = (0.5 + rng.uniform(-0.08, 0.08), 0.5 + rng.uniform(-0.06, 0.06))
    size = rng.uniform(0.09, 0.14)
    band = (np.sin(yy * rng.uniform(25.0, 40.0) + rng.uniform(0, 6.3)) > 0.6) & (yy < 0.3)
    layers = [(band, 0.7)]  # subcutaneous layers, present in every class
    theta = np.arctan2(yy - centre[1], xx - centre[0])
    distance = np.hypot(xx - centre[0], yy - centre[1])
    shadow_x = np.abs(xx - centre[0]) < size * 0.8
    below = shadow_x & (yy > centre[1] + size * 0.8) & (yy < centre[1] + size * 3.0)
    if label == "benign":  # smooth, oval, homogeneous, posterior acoustic enhancement
        lesion = _ellipse_radius(xx, yy, centre, (size * 1.3, size), rng.uniform(-0.3, 0.3)) < 1
        layers += [(below, 0.65), (lesion, 0.06)]
    elif label == "malignant":  # irregular, spiculated, heterogeneous, posterior shadow
        phases = rng.uniform(0, 2 * np.pi, 3)
        boundary = size * (
            1.0
            + 0.18 * np.sin(3 * theta + phases[0])
            + 0.1 * np.sin(5 * theta + phases[1])
            + 0.45 * np.maximum(np.cos(9 * theta + phases[2]), 0.0) ** 6
        )
        lesion = distance < boundary
        spots = rng.random(xx.shape) < 0.12
        layers += [(below, 0.1), (lesion, 0.05), (lesion & spots, 0.45)]
    return layers, {}, {"centre": centre, "size": size}


DRAW = {
    "head": _head,
    "abdomen": _abdomen,
    "femur": _femur,
    "thorax": _thorax,
    "fetus": _fetus,
    "lesion": _lesion,
}
TASK_OF_KIND = {"fetus": "FO", "lesion": "CD"}


def _downsample(array: np.ndarray, factor: int) -> np.ndarray:
    """Area average over factor x factor blocks."""
    h, w = array.shape
    return array.reshape(h // factor, factor, w // factor, factor).mean(axis=(1, 3))


def _style(echo, fan, depth, noise_rng, style):
    """Turn an echogenicity map into an image in [0, 1] (render size).

    clinical: strong Rayleigh speckle (fully developed), blurred edges, depth attenuation,
    black outside the fan. phantom: a quarter of the speckle, sharp edges, no attenuation, a
    lower-contrast gain and a grey background (what tissue-mimicking gel scans look like)."""
    speckle = noise_rng.rayleigh(np.sqrt(2 / np.pi), echo.shape).astype(np.float32)
    if style == "clinical":
        smooth = ndimage.gaussian_filter(echo, 1.3)
        intensity = smooth * ndimage.gaussian_filter(speckle, 0.6) * np.exp(-0.7 * depth)
        image = np.log1p(12.0 * intensity) / np.log1p(12.0)
        return np.where(fan, np.clip(image, 0.0, 1.0), 0.0)
    intensity = echo * (0.8 + 0.2 * speckle)
    image = 0.2 + 0.65 * intensity
    return np.where(fan, np.clip(image, 0.0, 1.0), 0.26)


def scan(kind: str, style: str, rng: np.random.Generator, *, size: int = SIZE) -> Scan:
    """One fake ultrasound image of `kind` in `style` with its labels and structure boxes.

    The label is drawn uniformly first, then the anatomy, then a speckle seed: the same `rng`
    state gives the same label, anatomy and boxes in either style."""
    return render(kind, style, rng, size=size)[0]


def render(kind: str, style: str, rng: np.random.Generator, *, size: int = SIZE):
    """`scan` and the visible structures' boolean masks at the output size (what the boxes are
    taken from; tests check boxes and labels against them)."""
    if kind not in KINDS:
        raise ConfigError(f"fetal_gauge phantoms: kind={kind!r}; one of {', '.join(KINDS)}")
    if style not in records.STYLES:
        raise ConfigError(f"fetal_gauge phantoms: style={style!r}; one of {records.STYLES}")
    if not isinstance(size, int) or size < 16:
        raise ConfigError(f"fetal_gauge phantoms: size={size!r}; an int of at least 16")
    factor = 2
    xx, yy, fan, depth = _grid(size * factor)
    task = TASK_OF_KIND.get(kind, "VC")
    label = VOCAB[task][rng.integers(len(VOCAB[task]))] if kind != "femur" else None
    layers, masks, geometry = DRAW[kind](rng, xx, yy, label)
    # Background tissue: a smooth random echogenicity (anatomy, so drawn before the style).
    lumps = ndimage.zoom(rng.uniform(0.16, 0.3, (6, 6)).astype(np.float32), size * factor / 6)
    echo = lumps[: size * factor, : size * factor].copy()
    for mask, value in layers:
        echo[mask] = value
    noise_rng = np.random.default_rng(rng.integers(2**63))
    picture = _style(echo, fan, depth, noise_rng, style)
    image = np.round(_downsample(picture, factor) * 255).astype(np.uint8)
    visible = {}
    for name, mask in masks.items():
        small = _downsample((mask & fan).astype(np.float32), factor) >= MASK_COVERAGE
        if small.any():
            visible[name] = small
    structures = {name: mask_to_bbox(mask, BOX_PAD) for name, mask in visible.items()}
    labels = {} if label is None else {task: label}
    if kind in PLANE:
        labels["PI"] = PLANE[kind]
    geometry = _to_output(geometry, size)
    return Scan(kind, style, image, labels, structures, geometry), visible


def _to_output(geometry: dict, size: int) -> dict:
    """Geometry in output pixels (x, y grow right and down), for checks against the image."""
    scaled = {}
    for key, value in geometry.items():
        if key in ("centre", "axes", "body_centre", "head_centre"):
            scaled[key] = tuple(float(v) * size for v in value)
        elif key in ("length", "size"):
            scaled[key] = float(value) * size
        else:
            scaled[key] = value
    return scaled


def fan_mask(size: int = SIZE) -> np.ndarray:
    """The sector at the output size: pixels mostly inside the fan."""
    return _downsample(_grid(2 * size)[2].astype(np.float32), 2) >= 0.5
