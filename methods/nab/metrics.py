"""Image quality of a reconstruction against the ground truth: PSNR and SSIM on [0, 1].

Convention (the paper does not state one; its FBP 11.7 dB implies a harsh one): both images are
clipped to [0, 1], the phantoms' range, and set to 0 outside the reconstruction circle (every
method assumes it, as `skimage.transform.radon(circle=True)` does); `data_range = 1`. SSIM is
scikit-image's default (7 x 7 uniform window).
"""

import numpy as np
from skimage.metrics import peak_signal_noise_ratio, structural_similarity


def circle_mask(size: int) -> np.ndarray:
    rows, cols = np.mgrid[:size, :size]
    return (rows - size // 2) ** 2 + (cols - size // 2) ** 2 <= (size // 2) ** 2


def prepare(image_NN) -> np.ndarray:
    image = np.clip(np.asarray(image_NN, np.float64), 0.0, 1.0)
    return np.where(circle_mask(image.shape[0]), image, 0.0)


def quality(recon_NN, truth_NN) -> dict:
    """{"psnr": dB, "ssim": in [-1, 1]} of `recon_NN` against `truth_NN` (same square shape)."""
    recon, truth = prepare(recon_NN), prepare(truth_NN)
    if recon.shape != truth.shape:
        raise ValueError(f"quality: shapes differ, {recon.shape} vs {truth.shape}")
    return {
        "psnr": float(peak_signal_noise_ratio(truth, recon, data_range=1.0)),
        "ssim": float(structural_similarity(truth, recon, data_range=1.0)),
    }
