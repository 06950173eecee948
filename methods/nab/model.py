"""NAB's implicit neural representation: coordinates -> encoding -> MLP -> attenuation.

    cfg = ModelConfig(size=128, encoding="nab")
    params, frozen = init_params(cfg, rng)     # trainable and frozen leaves (ablations)
    image_NN = render(cfg, params, frozen)     # [size, size] float32

Coordinates are pixel centres in the phantoms' unit-disc frame (`phantoms.py`): pixel size//2
is the origin and size//2 pixels is 1, x along columns, y along rows, so one pixel is
`pixel = 1 / (size // 2)` and the reconstruction circle is the unit disc.

Encodings (`cfg.encoding`), both with `num_features` (M) outputs and the same MLP after them:
  "nab": M soft rotated bins (`core.kernels.binned_encoding`): bin i has centre (u, v), sides
         (h, w) (used as |h|, |w|), rotation theta, steepness k and height lam, and feature
         lam * box_h(x') * box_w(y') in the bin's rotated frame, each box a difference of two
         tanh. Every bin parameter is trained (unless frozen). Initialisation (the paper does
         not publish one; ours): centres uniform on [-0.85, 0.85]^2, sides uniform on
         [0.05, 0.5] of the field of view (2 units), theta uniform on [0, pi/2) or 0
         (`cfg.theta_init`; with theta = 0 a rotated object's walls become staircases of
         axis-aligned boxes, README), lam = 1, and
         k = s / pixel with the steepness scales s of `cfg.steepness` assigned in turn (the
         paper publishes its k sets; README, "Steepness"), so a bin's edge spans 1/s pixels.
         The rotation init and the scales are chosen on development objects
         (`methods/nab/experiment.py`); a saturated tanh gives no gradient to a bin's
         position or size, so very steep bins from a random start learn slowly.
  "rff": random Fourier features [cos 2 pi B c, sin 2 pi B c], B [M/2, 2] ~ N(0, sigma^2),
         fixed (Tancik et al. 2020; the paper's INRf baseline).
MLP: M -> hidden x depth (ReLU) -> 1, PyTorch's default init or He's (`cfg.mlp_init`, `_dense`);
the first layer is fused with the NAB encoding (`binned_encoding.op`), so its N x M features
need not be materialised.
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from core.kernels import binned_encoding
from core.kernels.common import kernel_mesh
from core.mesh import data_axes

ENCODINGS = ("nab", "rff")
BIN_PARAMS = ("u", "v", "h", "w", "theta", "k", "lam")
THETA_INITS = ("zero", "uniform")
MLP_INITS = ("torch", "he")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    size: int = 128  # image side N
    encoding: str = "nab"
    num_features: int = 456  # M, the paper's bin count
    hidden: int = 256
    depth: int = 3  # hidden layers
    steepness: tuple[float, ...] = (1.5, 3.0)  # NAB: k * pixel per scale, bins assigned in turn
    anneal: tuple[float, float] = (1.0, 0.0)  # NAB: k x a factor rising from [0] to 1 by [1] of
    # training (geometrically): soft bins first (gradient reaches bins far from edges), then sharp
    theta_init: str = "uniform"  # NAB: "uniform" on [0, pi/2) or "zero" (axis-aligned bins)
    mlp_init: str = "torch"  # PyTorch's nn.Linear default, or "he" (He-normal weights, zero bias)
    rff_sigma: float = 1.0  # RFF: std of B, in cycles per unit (the unit disc's radius)
    frozen: tuple[str, ...] = ()  # NAB ablations: bin parameters kept at their initial values
    impl: str = "auto"  # binned_encoding.op's implementation

    def __post_init__(self):
        if self.encoding not in ENCODINGS:
            raise ValueError(f"ModelConfig.encoding={self.encoding!r}; expected one of {ENCODINGS}")
        for name in ("size", "num_features", "hidden", "depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.encoding == "rff" and self.num_features % 2:
            raise ValueError(f"ModelConfig.num_features must be even for rff ({self.num_features})")
        unknown = set(self.frozen) - set(BIN_PARAMS)
        if unknown:
            raise ValueError(
                f"ModelConfig.frozen has unknown names {sorted(unknown)}; known: {BIN_PARAMS}"
            )
        if not self.steepness or min(self.steepness) <= 0:
            raise ValueError(f"ModelConfig.steepness must be positive scales, got {self.steepness}")
        if len(self.anneal) != 2 or not (0 < self.anneal[0] <= 1 and 0 <= self.anneal[1] <= 1):
            raise ValueError(
                f"ModelConfig.anneal must be (start factor in (0, 1], fraction of training in "
                f"[0, 1]), got {self.anneal}"
            )
        if self.theta_init not in THETA_INITS:
            raise ValueError(f"ModelConfig.theta_init={self.theta_init!r}; expected {THETA_INITS}")
        if self.mlp_init not in MLP_INITS:
            raise ValueError(f"ModelConfig.mlp_init={self.mlp_init!r}; expected {MLP_INITS}")

    @property
    def pixel(self) -> float:
        return 1.0 / (self.size // 2)


def pixel_coords(size: int) -> np.ndarray:
    """(x, y) of every pixel centre, row-major, float32 [size * size, 2], in the unit-disc frame."""
    u = (np.arange(size) - size // 2) / (size // 2)
    y, x = np.meshgrid(u, u, indexing="ij")
    return np.stack([x.ravel(), y.ravel()], axis=1).astype(np.float32)


def _dense(rng, fan_in: int, fan_out: int, init: str = "torch") -> dict:
    """One layer's initial weights and biases. "torch": PyTorch's `nn.Linear` default, both
    U(-1/sqrt(fan_in), +) (the INR papers' PyTorch code). "he": He-normal weights (std
    sqrt(2 / fan_in)), zero biases, a larger initial function. Which one is chosen on the
    development objects (methods/nab/experiment.py); at 64 x 64 in a pre-protocol run He gave
    NAB 24 dB / SSIM 0.43 after 1500 steps and "torch" 29 dB / 0.97 after 800."""
    k_w, k_b = jax.random.split(rng)
    if init == "he":
        w = jax.random.normal(k_w, (fan_in, fan_out), jnp.float32) * math.sqrt(2.0 / fan_in)
        return {"w": w, "b": jnp.zeros((fan_out,), jnp.float32)}
    bound = 1.0 / math.sqrt(fan_in)
    return {
        "w": jax.random.uniform(k_w, (fan_in, fan_out), jnp.float32, -bound, bound),
        "b": jax.random.uniform(k_b, (fan_out,), jnp.float32, -bound, bound),
    }


def init_bins(cfg: ModelConfig, rng) -> dict:
    """The NAB bins' initial parameters, seven float32 [M] arrays (see the module docstring)."""
    M = cfg.num_features
    k_centre, k_size, k_theta = jax.random.split(rng, 3)
    centre = jax.random.uniform(k_centre, (2, M), jnp.float32, -0.85, 0.85)
    sides = jax.random.uniform(k_size, (2, M), jnp.float32, 0.1, 1.0)  # 0.05-0.5 of 2 units
    scales = np.resize(np.asarray(cfg.steepness, np.float32), M)  # s_0, s_1, s_0, ...
    if cfg.theta_init == "uniform":  # a quarter turn covers every box (h <-> w swaps)
        theta = jax.random.uniform(k_theta, (M,), jnp.float32, 0.0, jnp.pi / 2)
    else:
        theta = jnp.zeros((M,), jnp.float32)
    return {
        "u": centre[0],
        "v": centre[1],
        "h": sides[0],
        "w": sides[1],
        "theta": theta,
        "k": jnp.asarray(scales / cfg.pixel),
        "lam": jnp.ones((M,), jnp.float32),
    }


def init_params(cfg: ModelConfig, rng) -> tuple[dict, dict]:
    """(trainable params, frozen leaves): RFF's B and the bins named in `cfg.frozen` are frozen."""
    k_enc, *k_layers = jax.random.split(rng, cfg.depth + 2)
    widths = [cfg.num_features] + [cfg.hidden] * cfg.depth + [1]
    mlp = [
        _dense(k, a, b, cfg.mlp_init)
        for k, a, b in zip(k_layers, widths[:-1], widths[1:], strict=True)
    ]
    params, frozen = {"mlp": mlp}, {}
    if cfg.encoding == "rff":
        frozen["B"] = cfg.rff_sigma * jax.random.normal(k_enc, (cfg.num_features // 2, 2))
    else:
        bins = init_bins(cfg, k_enc)
        params["bins"] = {n: v for n, v in bins.items() if n not in cfg.frozen}
        frozen["bins"] = {n: v for n, v in bins.items() if n in cfg.frozen}
    return params, frozen


def bins_of(params: dict, frozen: dict, k_scale=1.0) -> dict:
    """All seven bin parameters, sides made positive (|h|, |w|: a box is symmetric in them),
    steepness times `k_scale` (the annealing factor, `steepness_schedule`)."""
    bins = {**params["bins"], **frozen["bins"]}
    return {**bins, "h": jnp.abs(bins["h"]), "w": jnp.abs(bins["w"]), "k": k_scale * bins["k"]}


def steepness_schedule(cfg: ModelConfig, total_steps: int):
    """step -> k's factor: cfg.anneal[0] at step 0, rising geometrically to 1 at
    cfg.anneal[1] * total_steps, then 1. None when there is nothing to anneal."""
    start, fraction = cfg.anneal
    ramp = fraction * total_steps
    if cfg.encoding != "nab" or start == 1.0 or ramp < 1:
        return None

    def k_scale(step):
        progress = jnp.minimum(step / ramp, 1.0)
        return jnp.float32(start) ** (1.0 - progress)

    return k_scale


def first_layer(cfg: ModelConfig, params: dict, frozen: dict, coords_N2, k_scale=1.0):
    """The first dense layer's pre-activation [N, hidden] from the encoded coordinates."""
    layer = params["mlp"][0]
    if cfg.encoding == "nab":
        bins = binned_encoding.Bins(**bins_of(params, frozen, k_scale))
        return _encode_dense(cfg.impl)(coords_N2, bins, layer["w"], layer["b"])
    return rff_features(coords_N2, frozen["B"]) @ layer["w"] + layer["b"]


def rff_features(coords_N2, B_H2) -> jax.Array:
    """[cos 2 pi B c, sin 2 pi B c], float32 [N, 2H]: phi(x) . phi(y) / H estimates the
    Gaussian kernel exp(-2 pi^2 sigma^2 |x - y|^2) when B ~ N(0, sigma^2) (Tancik et al.)."""
    proj_NH = 2.0 * jnp.pi * coords_N2 @ B_H2.T
    return jnp.concatenate([jnp.cos(proj_NH), jnp.sin(proj_NH)], axis=1)


def _encode_dense(impl: str):
    """`binned_encoding.op`, or, when it runs a Pallas kernel while a multi-device mesh is being
    traced for (core.train sets it), `sharded_op` with the pixels split over the mesh's
    data-parallel axes: XLA cannot partition a kernel, and every pixel is independent."""
    mesh = kernel_mesh(binned_encoding.uses_kernel(impl))
    if mesh is None:
        return functools.partial(binned_encoding.op, impl=impl)
    return functools.partial(
        binned_encoding.sharded_op, mesh=mesh, pixel_axes=data_axes(mesh), impl=impl
    )


def render(cfg: ModelConfig, params: dict, frozen: dict, k_scale=1.0) -> jax.Array:
    """The represented image, float32 [size, size]; k_scale multiplies NAB's steepness (1 once
    any annealing is over: the trained model)."""
    h_NF = first_layer(cfg, params, frozen, jnp.asarray(pixel_coords(cfg.size)), k_scale)
    for layer in params["mlp"][1:]:
        h_NF = jax.nn.relu(h_NF) @ layer["w"] + layer["b"]
    return h_NF.reshape(cfg.size, cfg.size)
