"""NAB (paper 3): Neural Adaptive Binning for sparse-view CT reconstruction.

- `projector.py`: parallel-beam projector in JAX (`radon`, its exact adjoint `backproject`,
  `angles`), skimage's geometry, jittable and differentiable.
- `phantoms.py`: industrial (rotated rectangles), curved and Shepp-Logan test images, and
  `measure`: their sparse-view sinograms without the inverse crime, with Gaussian noise.
"""
