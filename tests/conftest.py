"""Test setup: 8 fake CPU devices and the persistent compile cache, before JAX initialises."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

from core import compile_cache  # noqa: E402  (after the platform settings: it imports JAX)

compile_cache.enable()

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
