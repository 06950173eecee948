"""Selective rotary embedding (paper 5): jnp reference, Pallas kernels, one `op` entry.

reference.py (the spec) | kernel_body.py (one tile on refs) | tpu.py, gpu.py (a wrapper per
backend) | kernel.py (layout, padding, custom_vjp) | api.py (`op`, impl dispatch).
"""

from core.kernels.selective_rotary.api import op, sharded_op, uses_kernel
from core.kernels.selective_rotary.reference import selective_rotary_reference

__all__ = ["op", "selective_rotary_reference", "sharded_op", "uses_kernel"]
