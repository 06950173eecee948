"""Test objects for sparse-view CT, float32 [n, n] in [0, 1], and their measured sinograms.

    image_NN = PHANTOMS["industrial"](64, seed)          # or "curved", "shepp_logan"
    sino_DA = measure(image_NN, num_views=16, noise=0.01, seed=seed)

- `industrial`: what NAB's rectangular prior is for (the paper's CaCO3 set: a hollow cube
  slice at many rotations): a hollow box, inner blocks with rectangular voids, small dense
  inclusions, the whole object rotated by a random angle.
- `curved`: where it should help least (the paper's Workpieces): rings, discs, slots.
- `shepp_logan`: scikit-image's Shepp-Logan phantom, a fixed non-rectangular sanity case.

Every phantom is zero outside the reconstruction circle (radius n//2 about pixel n//2, the
projector's axis), as `skimage.transform.radon(circle=True)` assumes. The generated ones are
drawn in coordinates where that circle is the unit disc and kept within radius 0.85, then
rasterised exactly (point-in-shape tests) on a grid `SUPERSAMPLE` times finer and averaged down,
so edges are anti-aliased with partial-volume values. Randomness comes only from
`np.random.default_rng(seed)`.
"""

import numpy as np

from methods.nab import projector

SUPERSAMPLE = 4  # fine samples per pixel side: partial-volume steps of 1/16 at edges


def _fine_grid(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of the supersampled grid's points, [n*S, n*S] each, in unit-disc coordinates:
    pixel n//2 is the origin and n//2 pixels is 1; x runs along columns, y along rows."""
    offsets = (np.arange(SUPERSAMPLE) + 0.5) / SUPERSAMPLE - 0.5
    pos = (np.arange(n)[:, None] + offsets[None, :]).reshape(-1)
    u = (pos - n // 2) / max(n // 2, 1)
    y, x = np.meshgrid(u, u, indexing="ij")
    return x, y


def _average_down(fine: np.ndarray, n: int) -> np.ndarray:
    """Mean over each pixel's SUPERSAMPLE x SUPERSAMPLE samples, then zero outside the circle
    (a safeguard: shapes stay within radius 0.85, so this removes nothing for n >= 16)."""
    image = fine.reshape(n, SUPERSAMPLE, n, SUPERSAMPLE).mean(axis=(1, 3))
    rows, cols = np.mgrid[:n, :n]
    outside = (rows - n // 2) ** 2 + (cols - n // 2) ** 2 > (n // 2) ** 2
    image[outside] = 0.0
    return np.clip(image, 0.0, 1.0).astype(np.float32)


def _rotate(x: np.ndarray, y: np.ndarray, angle: float) -> tuple[np.ndarray, np.ndarray]:
    """Coordinates in a frame rotated by `angle` (radians): a shape drawn axis-aligned there
    appears rotated by `angle` in the image."""
    c, s = np.cos(angle), np.sin(angle)
    return c * x + s * y, -s * x + c * y


def _box(x, y, cx, cy, half_w, half_h) -> np.ndarray:
    return (np.abs(x - cx) <= half_w) & (np.abs(y - cy) <= half_h)


def _rounded_box(x, y, cx, cy, half_w, half_h, radius) -> np.ndarray:
    """Rectangle with corners rounded by `radius` (<= min half side): points within `radius`
    of the inner rectangle shrunk by `radius`."""
    qx = np.maximum(np.abs(x - cx) - (half_w - radius), 0.0)
    qy = np.maximum(np.abs(y - cy) - (half_h - radius), 0.0)
    return qx**2 + qy**2 <= radius**2


def _ring(x, y, cx, cy, r_in, r_out) -> np.ndarray:
    d2 = (x - cx) ** 2 + (y - cy) ** 2
    return (d2 >= r_in**2) & (d2 <= r_out**2)


def industrial(n: int, seed: int) -> np.ndarray:
    """A rotated hollow box with inner blocks, rectangular voids and dense inclusions.

    In the object's frame (unit-disc units): a hollow box with half sides in [0.45, 0.6] x
    [0.3, 0.6] (corners within radius 0.85) and walls 0.08-0.16 thick (2.6-5 px at n = 64,
    5-10 px at 128), attenuation 0.4-0.7; 1-3 blocks (0.3-0.8) in the cavity, each with a
    rectangular void half the time; 1-3 dense inclusions (1.0) of 1-2 px half side anywhere in
    the box. Later shapes overwrite earlier ones. The whole object is rotated by a uniform angle
    in [0, 90) degrees (a box's orientations repeat every 90).
    """
    rng = np.random.default_rng(seed)
    x, y = _fine_grid(n)
    x, y = _rotate(x, y, rng.uniform(0.0, np.pi / 2))
    fine = np.zeros_like(x)

    half_w, half_h = rng.uniform(0.45, 0.6), rng.uniform(0.3, 0.6)
    wall = rng.uniform(0.08, 0.16)
    fine[_box(x, y, 0.0, 0.0, half_w, half_h)] = rng.uniform(0.4, 0.7)
    cavity_w, cavity_h = half_w - wall, half_h - wall
    fine[_box(x, y, 0.0, 0.0, cavity_w, cavity_h)] = 0.0

    for _ in range(rng.integers(1, 4)):
        bw, bh = rng.uniform(0.1, 0.45) * cavity_w, rng.uniform(0.1, 0.45) * cavity_h
        cx, cy = rng.uniform(-1, 1) * (cavity_w - bw), rng.uniform(-1, 1) * (cavity_h - bh)
        fine[_box(x, y, cx, cy, bw, bh)] = rng.uniform(0.3, 0.8)
        if rng.random() < 0.5:
            fine[_box(x, y, cx, cy, bw * rng.uniform(0.3, 0.7), bh * rng.uniform(0.3, 0.7))] = 0.0

    pixel = 1.0 / max(n // 2, 1)
    for _ in range(rng.integers(1, 4)):
        side = rng.uniform(1.0, 2.0) * pixel
        cx = rng.uniform(-1, 1) * (half_w - side)
        cy = rng.uniform(-1, 1) * (half_h - side)
        fine[_box(x, y, cx, cy, side, side)] = 1.0
    return _average_down(fine, n)


def curved(n: int, seed: int) -> np.ndarray:
    """A disc or ring body (outer radius 0.6-0.8) holding 1-3 discs, rings and slots.

    Slots are rounded rectangles (corner radius 0.5-1 x the half width) at a random angle.
    Inside a disc body a feature is a void (0) half the time, otherwise material (0.3-1.0);
    inside a ring body (empty centre) always material. Features fit inside the body's inner
    radius; later shapes overwrite earlier ones.
    """
    rng = np.random.default_rng(seed)
    x, y = _fine_grid(n)
    fine = np.zeros_like(x)

    body_x, body_y = rng.uniform(-0.05, 0.05, size=2)
    r_out = rng.uniform(0.6, 0.8)
    solid = rng.random() < 0.5
    r_in = 0.0 if solid else r_out - rng.uniform(0.08, 0.16)
    fine[_ring(x, y, body_x, body_y, r_in, r_out)] = rng.uniform(0.4, 0.7)
    room = r_out - 0.05 if solid else r_in - 0.03  # features stay off the body's outer wall

    for _ in range(rng.integers(1, 4)):
        kind = rng.choice(["disc", "ring", "slot"])
        value = 0.0 if solid and rng.random() < 0.5 else rng.uniform(0.3, 1.0)
        size = rng.uniform(0.08, 0.25)
        rho = rng.uniform(0.0, max(room - size, 0.0))
        phase = rng.uniform(0.0, 2 * np.pi)
        cx, cy = body_x + rho * np.cos(phase), body_y + rho * np.sin(phase)
        if kind == "disc":
            shape = _ring(x, y, cx, cy, 0.0, size)
        elif kind == "ring":
            shape = _ring(x, y, cx, cy, size * rng.uniform(0.5, 0.8), size)
        else:  # a slot: length `size` along its axis, so it fits in the same circle
            xs, ys = _rotate(x - cx, y - cy, rng.uniform(0.0, np.pi))
            half_h = size * rng.uniform(0.2, 0.4)
            shape = _rounded_box(xs, ys, 0.0, 0.0, size, half_h, half_h * rng.uniform(0.5, 1.0))
        fine[shape] = value
    return _average_down(fine, n)


def shepp_logan(n: int, seed: int | None = None) -> np.ndarray:
    """scikit-image's Shepp-Logan phantom (400 x 400, shipped in the wheel) resized to n x n
    with anti-aliasing. `seed` is ignored (the phantom is fixed); it is accepted so every entry
    of `PHANTOMS` is called as fn(n, seed)."""
    from skimage.data import shepp_logan_phantom
    from skimage.transform import resize

    del seed
    image = resize(shepp_logan_phantom(), (n, n), anti_aliasing=True)
    rows, cols = np.mgrid[:n, :n]
    image[(rows - n // 2) ** 2 + (cols - n // 2) ** 2 > (n // 2) ** 2] = 0.0
    return np.clip(image, 0.0, 1.0).astype(np.float32)


PHANTOMS = {"industrial": industrial, "curved": curved, "shepp_logan": shepp_logan}


def measure(
    image_NN: np.ndarray,
    num_views: int,
    *,
    noise: float = 0.01,
    seed: int | tuple[int, ...] = 0,
    oversample: int = 2,
    offset: float = 0.0,
) -> np.ndarray:
    """The measured sinogram of `image_NN` at `projector.angles(num_views)`, every angle plus
    `offset` degrees (held-out views between the measured ones): float32 [n, A].

    Avoiding the inverse crime (data made by the very operator that inverts them, which flatters
    every method): each pixel is taken as a square of constant attenuation, i.e. the image is
    upsampled `oversample` times by pixel replication and projected on that finer grid, with
    the detector spacing and rotation axis of the n grid (bins 1 coarse pixel apart, axis at
    coarse pixel n//2), and divided by `oversample` to give lengths in coarse pixels. So the
    data match `projector.radon(image_NN, ...)` in geometry and scale, but not bit for bit
    (its bilinear model of the same pixels differs at edges; `oversample=1` gives exactly it).

    Noise: additive Gaussian with standard deviation `noise` times the root mean square of the
    clean sinogram, so ||measured - clean||_2 / ||clean||_2 ~= `noise` (1% by default, as in
    the paper notes), drawn from `np.random.default_rng(seed)`.
    """
    image_NN = np.asarray(image_NN, np.float32)
    n = image_NN.shape[0]
    fine = np.kron(image_NN, np.ones((oversample, oversample), np.float32))
    # Fine pixel j lies at coarse coordinate (j + 0.5) / oversample - 0.5; invert for n // 2.
    axis = oversample * (n // 2 + 0.5) - 0.5
    clean_DA = projector.radon(
        fine,
        projector.angles(num_views, start=offset, stop=180.0 + offset),
        num_detectors=n,
        detector_spacing=float(oversample),
        center=axis,
    )
    clean_DA = np.asarray(clean_DA, np.float64) / oversample
    sigma = noise * np.sqrt(np.mean(clean_DA**2))
    noisy = clean_DA + sigma * np.random.default_rng(seed).standard_normal(clean_DA.shape)
    return noisy.astype(np.float32)
