"""Synthetic parcellated fMRI with two phenotypes, generated offline (no scan is available here).

    scans = cohort(Site(), n=2000, seed=0)   # Cohort: x_NCT [N, C, T] float32, labels a_N, b_N

Each subject's C ROIs are grouped into networks of equal size (`roi_network`). Per subject:
- network latents follow a VAR(1), z_t = A z_{t-1} + eta_t, with A = diag(rho) plus one lagged
  coupling kappa from network 2 into network 1 (A[1, 2]); each network's rho is drawn per subject
  (a nuisance that differs between people), except network 3's, which is phenotype B;
- phenotype A (binary) is the coupling: kappa = 0 or `Site.coupling`;
- phenotype B (3 classes) is network 3's autocorrelation: rho_3 = `Site.rho_b[b]` (+- jitter);
- every latent is rescaled to unit variance over the scan, so neither label moves a variance;
- ROI c = w_c z_{net(c)} + beta_c g (a global signal, AR(1)) + noise (AR(1), power such that the
  network part's SNR is `Site.snr`) + a slow cosine drift; then band-passed to 0.01-0.1 Hz at
  TR 2 s (the official preprocessing; without it, the slow drift and global signal make each
  crop's ROI offsets the dominant feature, and self-distillation matched those) and z-scored
  per ROI.
Loadings w_c are the site's: `Site.loading_mean` +- `loading_std` per subject and ROI. The
out-of-distribution site shifts them and lowers the SNR (`OOD_SITE`).

The defaults were fixed before the full run, from development runs (method README): scans of 480
TRs (fewer of a scan's 100-TR crop pairs overlap than at 240), no innovation fingerprint and
loadings +-0.2 (with a fingerprint of 0.7 and loadings +-0.4, what stays stable across a
subject's crops is that fingerprint, and self-distillation matched it instead of the phenotypes'
dynamics), and the coupling at 0.15, where FC + logistic regression reads phenotype A at ~0.73
on held-out subjects of other data seeds (0.12: 0.68, 0.18: 0.77, 0.2: 0.80).

The labels change only the statistic they are defined by: every ROI has mean 0 and variance 1
after z-scoring whatever the labels (`tests/methods/test_brain_semantoks_data.py`).
"""

import dataclasses
from typing import NamedTuple

import numpy as np

from core.errors import ConfigError

COUPLED = (1, 2)  # phenotype A: the lag-1 coupling from network COUPLED[1] into COUPLED[0]
RHO_NETWORK = 3  # phenotype B: this network's autocorrelation


@dataclasses.dataclass(frozen=True)
class Site:
    rois: int = 48
    networks: int = 6
    length: int = 480  # TRs per scan
    snr: float = 1.0  # power of the network signal over the ROI noise's
    coupling: float = 0.15  # phenotype A = 1: kappa (FC on A at ~0.73 with the defaults)
    rho_b: tuple[float, ...] = (0.3, 0.55, 0.8)  # phenotype B's classes: rho of RHO_NETWORK
    rho_jitter: float = 0.05  # +- uniform on rho_b, per subject
    rho_nuisance: tuple[float, float] = (0.3, 0.8)  # the other networks' rho, per subject
    fingerprint: float = 0.0  # per-subject innovation correlations: factor loadings' std
    loading_mean: float = 1.0
    loading_std: float = 0.2
    global_amplitude: float = 0.5  # beta_c ~ U(0, global_amplitude)
    noise_rho: float = 0.3  # the ROI noise's own autocorrelation
    drift_amplitude: float = 0.3
    tr: float = 2.0  # seconds per volume
    band: tuple[float, float] = (0.01, 0.1)  # Hz: the band-pass of the official preprocessing

    def __post_init__(self):
        if self.rois % self.networks or self.networks <= max(COUPLED + (RHO_NETWORK,)):
            raise ConfigError(
                f"Site: {self.rois} ROIs must split into equal networks, and networks="
                f"{self.networks} must exceed {max(COUPLED + (RHO_NETWORK,))} (the phenotypes')"
            )
        if self.snr <= 0 or self.length < 2:
            raise ConfigError(f"Site: snr={self.snr} must be > 0, length={self.length} >= 2")

    @property
    def roi_network(self) -> np.ndarray:
        """The network of each ROI, [C] (ROIs in network order, as Schaefer's 7-network order)."""
        return np.repeat(np.arange(self.networks), self.rois // self.networks)


OOD_SITE = dict(loading_mean=0.7, loading_std=0.4, snr_factor=0.6, global_amplitude=0.8)


def ood(site: Site) -> Site:
    """The out-of-distribution site of `site`: other loadings, a stronger global signal and 40 %
    less SNR (a different scanner and population)."""
    o = OOD_SITE
    return dataclasses.replace(
        site,
        loading_mean=o["loading_mean"],
        loading_std=o["loading_std"],
        snr=site.snr * o["snr_factor"],
        global_amplitude=o["global_amplitude"],
    )


class Cohort(NamedTuple):
    x_NCT: np.ndarray  # float32, z-scored per subject and ROI
    a_N: np.ndarray  # int32 in {0, 1}
    b_N: np.ndarray  # int32 in {0, .., len(rho_b) - 1}


def _ar1(rng, rho_NK, length):
    """Unit-variance AR(1) paths [N, K, T] with per-path rho (started from the stationary law)."""
    rho = rho_NK[..., None]
    eps = rng.standard_normal((*rho_NK.shape, length))
    out = np.empty_like(eps)
    out[..., 0] = eps[..., 0]
    scale = np.sqrt(1 - rho[..., 0] ** 2)
    for t in range(1, length):
        out[..., t] = rho[..., 0] * out[..., t - 1] + scale * eps[..., t]
    return out


def band_pass(x_NCT: np.ndarray, tr: float, band: tuple[float, float]) -> np.ndarray:
    """An ideal band-pass along time: every Fourier coefficient outside `band` (Hz) zeroed."""
    freqs = np.fft.rfftfreq(x_NCT.shape[-1], d=tr)
    keep = (freqs >= band[0]) & (freqs <= band[1])
    return np.fft.irfft(np.fft.rfft(x_NCT, axis=-1) * keep, n=x_NCT.shape[-1], axis=-1)


def _zscore(x, axis=-1):
    x = x - x.mean(axis, keepdims=True)
    return x / np.maximum(x.std(axis, keepdims=True), 1e-8)


def latents(site: Site, a_N, b_N, rng) -> tuple[np.ndarray, np.ndarray]:
    """The network latents z [N, K, T] (module docstring), each unit variance over the scan,
    and their autocorrelations rho [N, K]."""
    n, k, t_len = len(a_N), site.networks, site.length
    rho = rng.uniform(*site.rho_nuisance, size=(n, k))
    jitter = rng.uniform(-site.rho_jitter, site.rho_jitter, size=n)
    rho[:, RHO_NETWORK] = np.asarray(site.rho_b)[b_N] + jitter
    kappa = site.coupling * a_N
    scale = np.sqrt(1 - rho**2)
    eps = rng.standard_normal((n, k, t_len))
    if site.fingerprint > 0:  # innovations correlated by a per-subject 2-factor structure
        f = rng.normal(0, site.fingerprint, size=(n, k, 2))
        cov = f @ f.transpose(0, 2, 1) + np.eye(k)
        d = np.sqrt(np.diagonal(cov, axis1=1, axis2=2))
        chol = np.linalg.cholesky(cov / d[:, :, None] / d[:, None, :])
        eps = chol @ eps
    z = np.empty((n, k, t_len))
    z[:, :, 0] = eps[:, :, 0]
    to, frm = COUPLED
    for t in range(1, t_len):
        z[:, :, t] = rho * z[:, :, t - 1] + scale * eps[:, :, t]
        z[:, to, t] += kappa * z[:, frm, t - 1]
    return _zscore(z), rho


def cohort(site: Site, n: int, seed: int, *, hidden: bool = False):
    """`n` subjects of `site`, labels balanced in expectation (uniform), all drawn from `seed`.
    hidden=True: (cohort, {name: the per-subject parameters the scans were drawn with})."""
    if n < 1:
        raise ConfigError(f"cohort: n={n} subjects; need at least 1")
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 2, n).astype(np.int32)
    b = rng.integers(0, len(site.rho_b), n).astype(np.int32)
    z, rho = latents(site, a, b, rng)
    c, t_len = site.rois, site.length
    net = site.roi_network
    w = rng.normal(site.loading_mean, site.loading_std, size=(n, c))
    signal = w[:, :, None] * z[:, net]
    g = _ar1(rng, np.full((n, 1), 0.95), t_len)
    beta = rng.uniform(0, site.global_amplitude, size=(n, c))
    noise_power = (w**2).mean(1, keepdims=True) / site.snr  # per subject: SNR over its ROIs
    noise = _ar1(rng, np.full((n, c), site.noise_rho), t_len) * np.sqrt(noise_power)[..., None]
    freq = rng.uniform(0.5, 2.0, size=(n, c, 1)) / t_len
    phase = rng.uniform(0, 2 * np.pi, size=(n, c, 1))
    drift = site.drift_amplitude * np.cos(2 * np.pi * freq * np.arange(t_len) + phase)
    x = signal + beta[:, :, None] * g + noise + drift
    x = band_pass(x, site.tr, site.band)
    out = Cohort(_zscore(x).astype(np.float32), a, b)
    if hidden:
        return out, {"rho_NK": rho, "loading_NC": w, "global_NC": beta}
    return out


def fc_features(x_NCT: np.ndarray) -> np.ndarray:
    """The FC baseline's features: the upper triangle of each scan's ROI correlation matrix."""
    x = _zscore(x_NCT.astype(np.float64))
    corr = np.einsum("nct,ndt->ncd", x, x) / x.shape[-1]
    rows, cols = np.triu_indices(x.shape[1], k=1)
    return corr[:, rows, cols].astype(np.float32)
