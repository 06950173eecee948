"""Classical reconstructions from the same sinogram: filtered back-projection and SART.

scikit-image's `iradon` / `iradon_sart` use the geometry our projector matches
(`tests/methods/test_nab_projector.py`: detector bin D//2 on the axis, pixel N//2 the centre,
the same angle convention), so they read `phantoms.measure`'s sinograms as they are.
"""

import numpy as np
from skimage.transform import iradon, iradon_sart


def fbp(sino_DA: np.ndarray, angles_deg: np.ndarray, size: int) -> np.ndarray:
    """Filtered back-projection, ramp filter, linear interpolation: float32 [size, size]."""
    image = iradon(
        np.asarray(sino_DA, np.float64),
        theta=np.asarray(angles_deg, np.float64),
        output_size=size,
        filter_name="ramp",
        circle=True,
    )
    return image.astype(np.float32)


def sart(
    sino_DA: np.ndarray, angles_deg: np.ndarray, size: int, iterations: int = 10
) -> np.ndarray:
    """`iterations` sweeps of SART (relaxation 0.15, scikit-image's default) from zero, with the
    image clipped to [0, 1] after each (the phantoms' known range; every method gets it at
    evaluation): float32 [size, size]. SART's grid is the sinogram's detector count."""
    sino = np.asarray(sino_DA, np.float64)
    theta = np.asarray(angles_deg, np.float64)
    if sino.shape[0] != size:
        raise ValueError(f"sart: {sino.shape[0]} detector bins for a {size}-pixel image")
    image = None
    for _ in range(iterations):
        image = iradon_sart(sino, theta=theta, image=image, clip=(0.0, 1.0))
    return image.astype(np.float32)
