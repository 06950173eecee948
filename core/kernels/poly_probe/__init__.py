"""Truncated polynomial probe (paper "Beyond Linear Probes", TPC): every truncation in one pass.

reference.py (the spec) | kernel_body.py (the GEMM tile and the epilogues, on refs) | tpu.py,
gpu.py (a Pallas wrapper per backend) | kernel.py (layout, padding, custom_vjp) | api.py
(`op`, impl dispatch, `sharded_op`).
"""

from core.kernels.poly_probe.api import op, sharded_op, uses_kernel
from core.kernels.poly_probe.reference import power, truncations

__all__ = ["op", "power", "sharded_op", "truncations", "uses_kernel"]
