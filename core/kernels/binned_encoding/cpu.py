"""CPU wrappers: the kernel body's tile functions run by `lax.scan` over pixel tiles, no Pallas.

Why: XLA:CPU materialises each of the backward's N x M intermediates (the tanh terms and
their products, about fifteen arrays, 30 MB each at 128 x 128 pixels and M = 456) and
streams them through memory, so plain autodiff of the reference spends ~4x the time of the
same arithmetic done tile by tile in cache (`bench.py` beside it measures it). Scanning
`forward_tile` / `backward_tile` over (BN, M) tiles with every bin and output feature in
one tile keeps the working set small, and it is the very code the GPU and TPU kernels run.

Same signatures as the GPU wrappers (`kernel.py` pads and slices around them):
  * forward: z [N, F] = b1 + forward_tile per pixel tile; N % block_n == 0;
  * backward: one partial, (dprm [1, 8, M], dW1 [1, M, F]) summed over the pixel tiles.
`block_m`, `block_f`, `num_partials` and `interpret` are accepted for the common signature:
the bin and feature axes are whole.
"""

import jax.numpy as jnp
from jax import lax

from core.kernels import common
from core.kernels.binned_encoding.kernel_body import GRAD_ROWS, backward_tile, forward_tile

_ALL = slice(None)


def _pixel_tiles(x_N, block_n):
    """[N, ...] -> [N / block_n, block_n, ...]."""
    return x_N.reshape(x_N.shape[0] // block_n, block_n, *x_N.shape[1:])


def encode_dense_cpu(xy_2N1, prm_8M, w1_MF, b1_1F, *, block_n, block_m, block_f, interpret):
    """z [N, F] float32."""
    del block_m, block_f, interpret
    xy_T2B1 = jnp.swapaxes(_pixel_tiles(jnp.swapaxes(xy_2N1, 0, 1), block_n), 1, 2)

    def tile(_, xy_2B1):
        return None, forward_tile(_ALL, _ALL, xy_2B1, prm_8M, w1_MF) + b1_1F

    _, z_TBF = lax.scan(tile, None, xy_T2B1)
    return z_TBF.reshape(-1, w1_MF.shape[1])


def encode_dense_bwd_cpu(xy_2N1, prm_8M, w1_MF, g_NF, *, block_n, block_m, num_partials, interpret):
    """(dprm [1, 8, M], dW1 [1, M, F]) float32; row 7 of dprm is zero (kernel_body.GRAD_ROWS)."""
    del block_m, num_partials, interpret
    xy_T2B1 = jnp.swapaxes(_pixel_tiles(jnp.swapaxes(xy_2N1, 0, 1), block_n), 1, 2)
    M, F = w1_MF.shape

    def tile(carry, tiles):
        xy_2B1, g_BF = tiles
        tile_dw1_MF, tile_rows = backward_tile(_ALL, _ALL, xy_2B1, prm_8M, w1_MF, g_BF)
        dw1_MF, d_rows = carry
        d_rows = tuple(a + d for a, d in zip(d_rows, tile_rows, strict=True))
        return (dw1_MF + tile_dw1_MF, d_rows), None

    zero_row = jnp.zeros((1, M), jnp.float32)
    init = (jnp.zeros((M, F), jnp.float32), (zero_row,) * len(GRAD_ROWS))
    init = common.varying_like(init, xy_2N1, prm_8M, w1_MF, g_NF)  # the carry's shard_map type
    (dw1_MF, d_rows), _ = lax.scan(tile, init, (xy_T2B1, _pixel_tiles(g_NF, block_n)))
    padding = (zero_row,) * (prm_8M.shape[0] - len(GRAD_ROWS))
    return jnp.concatenate(d_rows + padding)[None], dw1_MF[None]
