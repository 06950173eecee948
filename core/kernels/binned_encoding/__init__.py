"""Neural adaptive binning (paper 3, NAB): the fused encoder + first layer, reference and kernels.

reference.py (the spec, `Bins`) | kernel_body.py (one tile on refs, forward and backward) |
tpu.py, gpu.py (a Pallas wrapper per backend), cpu.py (the same tiles under lax.scan) |
kernel.py (layout, padding, custom_vjp) | api.py (`op`, impl dispatch, `sharded_op`).
"""

from core.kernels.binned_encoding.api import op, sharded_op, uses_kernel
from core.kernels.binned_encoding.reference import Bins, as_bins, encode, encode_dense

__all__ = ["Bins", "as_bins", "encode", "encode_dense", "op", "sharded_op", "uses_kernel"]
