"""Brain-Semantoks' tokenizer against a NumPy transcription of the official PyTorch forward (loops
over networks, channels and taps, as `FlexibleNetworkTokenizer` and `SLConv` compute them), the
SGConv kernel's construction, and the synthetic generator's labels."""

import jax
import numpy as np
import pytest
from scipy.special import erf
from sklearn.linear_model import LogisticRegression

from core.errors import ConfigError
from methods.brain_semantoks import data, model

CFG = model.ModelConfig(dim=16, dense_channels=8, sg_channels=8, heads=2, depth=1, mlp=32,
                        head_hidden=16, head_out=8, rois=12, networks=3)  # fmt: skip


def official_token(cfg, p, norm_k, x_RL):
    """One network's patch [R, L] -> its token [D], step by step as the official code does."""
    r_n, length = x_RL.shape
    w = np.asarray(p["dense"]["w"], np.float64)  # [taps, R, O]: torch's weight[o, r, j]
    xp = np.pad(x_RL, ((0, 0), (1, 1)))  # padding="same" for kernel 3
    dense = np.zeros((w.shape[2], length))
    for o in range(w.shape[2]):
        for t in range(length):
            dense[o, t] = p["dense"]["b"][o] + sum(
                w[j, r, o] * xp[r, t + j] for r in range(r_n) for j in range(3)
            )
    pieces = [np.asarray(a, np.float64) for a in p["sg"]["pieces"]]  # [H, R, k] each
    parts = [np.repeat(a, 2 ** max(0, i - 1), -1) * 2.0 ** (cfg.sg_scales - i - 1)
             for i, a in enumerate(pieces)]  # fmt: skip
    k = np.concatenate(parts, -1) / norm_k  # [H, R, 16]
    taps = k.shape[-1]
    xs = np.pad(x_RL, ((0, 0), ((taps - 1) // 2, taps - 1 - (taps - 1) // 2)))
    heads = k.shape[0]
    sg = np.zeros((r_n * heads, length))  # conv1d(groups=R): channel r * H + h
    skip = np.asarray(p["sg"]["skip"], np.float64)
    for r in range(r_n):
        for h in range(heads):
            flipped = k[h, r, ::-1]
            for t in range(length):
                sg[r * heads + h, t] = (
                    np.dot(flipped, xs[r, t : t + taps]) + skip[h, r] * x_RL[r, t]
                )
    proj = np.asarray(p["sg"]["proj"]["w"], np.float64)
    sgc = proj.T @ sg + np.asarray(p["sg"]["proj"]["b"])[:, None]
    both = np.concatenate([dense, sgc])
    pooled = (0.5 * both * (1 + erf(both / np.sqrt(2)))).mean(-1)
    z = (pooled - pooled.mean()) / np.sqrt(pooled.var() + model.LN_EPS)
    return z * np.asarray(p["norm"]["scale"]) + np.asarray(p["norm"]["bias"])


def test_the_tokenizer_matches_the_official_forward():
    params, buffers = model.init(CFG, jax.random.key(0))
    x = np.asarray(jax.random.normal(jax.random.key(1), (2, CFG.rois, CFG.crop)))
    tokens = np.asarray(model.tokenize(CFG, params, buffers, x))  # [B, N, P, D]
    tok = params["tokenizer"]
    r = CFG.roi_per_network
    for b in range(2):
        for n in range(CFG.networks):
            p_n = jax.tree.map(lambda a, n=n: np.asarray(a[n]), tok)
            norm_n = np.asarray(buffers["kernel_norm"][n], np.float64)
            for p in range(CFG.patches):
                patch = x[b, n * r : (n + 1) * r, p * CFG.patch : (p + 1) * CFG.patch]
                # float32 matmuls against a float64 loop: 1e-4 on unit-scale LayerNorm outputs.
                np.testing.assert_allclose(tokens[b, n, p], official_token(CFG, p_n, norm_n,
                                           patch.astype(np.float64)), atol=1e-4)  # fmt: skip


def test_the_sgconv_kernel_is_built_from_three_scales_and_has_unit_norm_at_init():
    params, buffers = model.init(CFG, jax.random.key(2))
    pieces = params["tokenizer"]["sg"]["pieces"]
    kernel = np.asarray(model.sg_kernel(CFG, pieces))
    assert CFG.sg_length == 16 and kernel.shape[-1] == 16  # 4 + 4 + 8 <= patch 20
    # Scale 0 (x4), scale 1 (x2), scale 2 upsampled by 2 (x1).
    np.testing.assert_allclose(kernel[..., :4], 4 * np.asarray(pieces[0]), rtol=1e-6)
    np.testing.assert_allclose(kernel[..., 4:8], 2 * np.asarray(pieces[1]), rtol=1e-6)
    np.testing.assert_allclose(kernel[..., 8:16:2], np.asarray(pieces[2]), rtol=1e-6)
    np.testing.assert_allclose(kernel[..., 9:16:2], np.asarray(pieces[2]), rtol=1e-6)
    normed = kernel / np.asarray(buffers["kernel_norm"])
    np.testing.assert_allclose(np.linalg.norm(normed, axis=-1), 1.0, rtol=1e-6)


def test_the_convolution_is_same_length_and_not_causal():
    # y[t] = sum_j k[j] x[t - 7 + j] (16 taps, 7 samples of left padding): an impulse at t0
    # reaches t0 - 8 .. t0 + 7, the last tap first.
    k = np.arange(1, 17, dtype=np.float32)
    m = np.asarray(model.toeplitz(k, 20, 7))  # y[t] = sum_s x[s] m[s, t]
    y = np.zeros(20, np.float32)
    y[10] = 1.0
    out = y @ m
    assert out.shape == (20,)
    assert np.flatnonzero(out).tolist() == list(range(2, 18))
    assert out[2] == k[15] and out[17] == k[0]  # cross-correlation, as torch's conv1d


def test_bad_model_settings_end_in_one_line():
    with pytest.raises(ConfigError, match="tokens"):
        model.ModelConfig(tokens="voxel")
    with pytest.raises(ConfigError, match="equal size"):
        model.ModelConfig(rois=50, networks=6)
    with pytest.raises(ConfigError, match="must fit"):
        model.ModelConfig(crop=100, patch=10)


def test_the_labels_change_their_statistic_and_no_mean():
    site = data.Site()
    cohort, hidden = data.cohort(site, 1200, 0, hidden=True)
    rho3 = hidden["rho_NK"][:, data.RHO_NETWORK]
    for b, rho in enumerate(site.rho_b):
        assert np.all(np.abs(rho3[cohort.b_N == b] - rho) <= site.rho_jitter + 1e-12)
    # Phenotype A: network 2 leads network 1 by one TR in the coupled subjects.
    x, net = cohort.x_NCT, site.roi_network
    m = np.stack([x[:, net == k].mean(1) for k in range(site.networks)], 1)
    lagged = (m[:, 1, 1:] * m[:, 2, :-1]).mean(-1) - (m[:, 2, 1:] * m[:, 1, :-1]).mean(-1)
    assert lagged[cohort.a_N == 1].mean() > lagged[cohort.a_N == 0].mean() + 0.05
    # A probe that sees only per-ROI means (of each third of the scan) is at chance.
    means = np.concatenate([x[:, :, i * 80 : (i + 1) * 80].mean(-1) for i in range(3)], 1)
    for y, chance in ((cohort.a_N, 0.5), (cohort.b_N, 1 / 3)):
        fit = LogisticRegression(C=0.1, max_iter=2000).fit(means[:800], y[:800])
        # 400 test subjects: a chance accuracy's standard error is <= 0.025; 3 of them.
        assert abs(fit.score(means[800:], y[800:]) - chance) < 0.075


def test_the_ood_site_shifts_loadings_and_lowers_the_snr():
    site = data.Site()
    shifted = data.ood(site)
    assert shifted.snr < site.snr and shifted.loading_mean != site.loading_mean
    with pytest.raises(ConfigError, match="networks"):
        data.Site(rois=50, networks=6)
