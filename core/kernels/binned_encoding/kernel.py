"""The fused NAB encoder + first layer through the Pallas kernels (or, backend "cpu", their tile
code under lax.scan): layout, padding, custom_vjp.

`encode_dense_pallas(coords, bins, w1, b1, config)` has `reference.encode_dense`'s semantics.
Around the kernels XLA only builds the small [8, M] parameter table (cos and sin of theta
computed once here, not per pixel), transposes the coordinates to [2, N, 1], pads, and slices:
the N x M features exist only tile by tile inside the kernels.

Padding is inert: padded bins have lam = k = 0 and zero W1 rows (feature 0, and their G W1^T
is 0, so their gradients are 0 and sliced off anyway); padded pixels sit at the origin and are
sliced off the output; in the backward they get G = 0, so they add exact zeros to every sum;
padded F columns have zero W1 columns, b1 entries and G columns.

Backward (`pallas_call` has no autodiff), residuals = the inputs only (features recomputed):
  * the backward kernel: dW1 = f^T G and the seven per-bin gradients (`kernel_body.
    backward_tile`), as P partials over pixel ranges, summed here (P = 1 on TPU by default);
  * jnp: db1 = sum_n G;  d coords = 0 (not needed by the method; documented, not computed).
Higher-order AD through this path is not supported (the backward calls `pallas_call`).
"""

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from core.kernels import common
from core.kernels.binned_encoding import cpu, gpu, tpu
from core.kernels.binned_encoding.kernel_body import GRAD_ROWS
from core.kernels.binned_encoding.reference import Bins, as_bins, check_shapes

BACKENDS = ("tpu", "gpu", "cpu")
# TPU and GPU: untuned (nothing here ran on one); see `choose_layout` and the wrappers'
# docstrings. CPU: 256-pixel tiles measured fastest at 128 x 128, M = 456 (bench.py).
DEFAULT_BLOCKS = {
    "tpu": dict(block_n=256, block_m=128, block_f=512, bwd_block_n=256, bwd_rows=None),
    "gpu": dict(block_n=64, block_m=32, block_f=128, bwd_block_n=32, bwd_rows=1024),
    "cpu": dict(block_n=256, block_m=None, block_f=None, bwd_block_n=256, bwd_rows=None),
}
FORWARD = {"tpu": tpu.encode_dense_tpu, "gpu": gpu.encode_dense_gpu, "cpu": cpu.encode_dense_cpu}
BACKWARD = {
    "tpu": tpu.encode_dense_bwd_tpu,
    "gpu": gpu.encode_dense_bwd_gpu,
    "cpu": cpu.encode_dense_bwd_cpu,
}


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Which wrapper runs, how, and its block sizes (None = DEFAULT_BLOCKS[backend]).

    backend: "tpu" or "gpu" (Pallas), or "cpu" (the same tile code under lax.scan, `cpu.py`).
    interpret: False (compile for `backend`), True (Pallas HLO interpreter, runs grid steps in
    order), or a `pltpu.InterpretParams` (TPU semantics simulated; backend="tpu" only).
    block_n, block_m, block_f: the forward's pixel, bin and output-feature tiles.
    bwd_block_n: the backward's pixel tile (its bin tile is block_m; it takes F whole).
    bwd_rows: pixels reduced into one backward partial (None = all: one partial).
    """

    backend: str
    interpret: Any = False
    block_n: int | None = None
    block_m: int | None = None
    block_f: int | None = None
    bwd_block_n: int | None = None
    bwd_rows: int | None = None

    def get(self, name):
        value = getattr(self, name)
        return DEFAULT_BLOCKS[self.backend][name] if value is None else value


class Layout(NamedTuple):
    """Tiles and padded sizes for one (N, M, F): forward N_pad, M_pad, F_pad; backward N_bwd."""

    bn: int
    bm: int
    bf: int
    bwd_bn: int
    partials: int
    N_pad: int
    M_pad: int
    F_pad: int
    N_bwd: int


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _partials(N: int, bwd_bn: int, bwd_rows: int | None) -> tuple[int, int]:
    """(P partials, N_bwd = P * T * bwd_bn): T tiles each, balanced, padding under P tiles."""
    tiles = -(-N // bwd_bn)
    per = tiles if bwd_rows is None else max(1, bwd_rows // bwd_bn)
    P = -(-tiles // per)
    T = -(-tiles // P)
    return P, P * T * bwd_bn


def choose_layout(config: KernelConfig, N: int, M: int, F: int) -> Layout:
    """Tiles per backend.

    TPU: BN, bwd BN multiples of 8 (sublanes); BM a multiple of 128 (lanes of the f tile and
    the MXU's contraction depth), M padded to it; F whole if <= 128 (a full dim is always a
    legal block), else padded to a multiple of 128 and BF the largest 128-multiple dividing it
    up to block_f, so the features are computed once per (n, m) for F <= 512.
    CPU (`cpu.py`, lax.scan): pixel tiles only; M and F whole, unpadded.
    GPU (Triton): powers of two >= 16 everywhere, F padded to a power of two (the backward
    loads whole G rows), BF dividing it.
    """
    get = config.get
    if config.backend == "tpu":
        bn = min(_round_up(get("block_n"), 8), _round_up(N, 8))
        bwd_bn = min(_round_up(get("bwd_block_n"), 8), _round_up(N, 8))
        bm = min(_round_up(get("block_m"), 128), _round_up(M, 128))
        if F <= 128:
            F_pad = bf = F
        else:
            F_pad = _round_up(F, 128)
            groups, limit = F_pad // 128, max(get("block_f"), 128)
            bf = 128 * max(d for d in range(1, groups + 1) if groups % d == 0 and 128 * d <= limit)
    elif config.backend == "cpu":
        bn, bwd_bn = min(get("block_n"), N), min(get("bwd_block_n"), N)
        bm, bf, F_pad = M, F, F  # bins and features whole: nothing to pad
    else:
        pow2 = lambda block, n: max(16, min(_next_pow2(block), _next_pow2(n)))
        bn, bwd_bn, bm = (
            pow2(get("block_n"), N),
            pow2(get("bwd_block_n"), N),
            pow2(get("block_m"), M),
        )
        F_pad = max(16, _next_pow2(F))
        bf = pow2(get("block_f"), F_pad)
    partials, N_bwd = _partials(N, bwd_bn, get("bwd_rows"))
    return Layout(bn, bm, bf, bwd_bn, partials, _round_up(N, bn), _round_up(M, bm), F_pad, N_bwd)


def _coords_2N1(coords_N2, N_pad):
    """[N, 2] -> [2, N_pad, 1]: x and y as columns on a leading axis; padded pixels at 0."""
    xy_2N = jnp.asarray(coords_N2, jnp.float32).T
    return jnp.pad(xy_2N, ((0, 0), (0, N_pad - xy_2N.shape[1])))[:, :, None]


def _param_table(bins: Bins, M_pad):
    """[8, M_pad] rows u, v, h, w, cos, sin, k, lam (kernel_body.PARAM_ROWS); zero padding."""
    b = Bins(*(jnp.asarray(p, jnp.float32) for p in bins))
    rows = (b.u, b.v, b.h, b.w, jnp.cos(b.theta), jnp.sin(b.theta), b.k, b.lam)
    table = jnp.stack(rows)
    return jnp.pad(table, ((0, 0), (0, M_pad - table.shape[1])))


def _pad2(x, rows, cols):
    x = jnp.asarray(x, jnp.float32)
    return jnp.pad(x, ((0, rows - x.shape[0]), (0, cols - x.shape[1])))


def _check_backend(config: KernelConfig):
    if config.backend not in BACKENDS:
        raise ValueError(f"backend={config.backend!r} is unknown; expected one of {BACKENDS}")


def encode_dense_forward(coords_N2, bins, w1_MF, b1_F, config: KernelConfig):
    """Forward only: z_NF float32 through the kernel that `config` names."""
    _check_backend(config)
    bins = as_bins(bins)
    check_shapes(coords_N2, bins, w1_MF, b1_F)
    (N, _), (M, F) = coords_N2.shape, w1_MF.shape
    lay = choose_layout(config, N, M, F)
    z_NF = FORWARD[config.backend](
        _coords_2N1(coords_N2, lay.N_pad),
        _param_table(bins, lay.M_pad),
        _pad2(w1_MF, lay.M_pad, lay.F_pad),
        _pad2(jnp.asarray(b1_F)[None], 1, lay.F_pad),
        block_n=lay.bn,
        block_m=lay.bm,
        block_f=lay.bf,
        interpret=config.interpret,
    )
    return z_NF[:N, :F]


def encode_dense_backward(coords_N2, bins, w1_MF, g_NF, config: KernelConfig):
    """(d bins as a Bins, dW1 [M, F]) float32 through the backward kernel (no db1, no d coords)."""
    _check_backend(config)
    bins = as_bins(bins)
    (N, _), (M, F) = coords_N2.shape, w1_MF.shape
    lay = choose_layout(config, N, M, F)
    dprm_P8M, dw1_PMF = BACKWARD[config.backend](
        _coords_2N1(coords_N2, lay.N_bwd),
        _param_table(bins, lay.M_pad),
        _pad2(w1_MF, lay.M_pad, lay.F_pad),
        _pad2(g_NF, lay.N_bwd, lay.F_pad),
        block_n=lay.bwd_bn,
        block_m=lay.bm,
        num_partials=lay.partials,
        interpret=config.interpret,
    )
    dprm_8M = jnp.sum(dprm_P8M, axis=0)[:, :M]
    d_bins = Bins(**{name: dprm_8M[r] for r, name in enumerate(GRAD_ROWS)})
    return d_bins, jnp.sum(dw1_PMF, axis=0)[:M, :F]


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def encode_dense_pallas(coords_N2, bins: Bins, w1_MF, b1_F, config: KernelConfig):
    """z_NF by the Pallas kernel; differentiable in bins, w1 and b1 (coords get a zero grad)."""
    return encode_dense_forward(coords_N2, bins, w1_MF, b1_F, config)


def _fwd(coords_N2, bins, w1_MF, b1_F, config):
    out = encode_dense_forward(coords_N2, bins, w1_MF, b1_F, config)
    return out, (coords_N2, bins, w1_MF, b1_F)


def _bwd(config, residuals, g_NF):
    coords_N2, bins, w1_MF, b1_F = residuals
    d_bins, dw1_MF = encode_dense_backward(coords_N2, bins, w1_MF, g_NF, config)
    db1_F = jnp.sum(jnp.asarray(g_NF, jnp.float32), axis=0)
    d_coords = jnp.zeros(coords_N2.shape, jnp.float32)  # not needed: coordinates are data
    d_bins = Bins(*(common.like_primal(g, p) for g, p in zip(d_bins, bins, strict=True)))
    return (
        common.like_primal(d_coords, coords_N2),
        d_bins,
        common.like_primal(dw1_MF, w1_MF),
        common.like_primal(db1_F, b1_F),
    )


encode_dense_pallas.defvjp(_fwd, _bwd)
