"""Brain-Semantoks' three losses, their schedules, and the views and masks they are computed on.

- `mcr_loss`: SimDINO's coding-rate loss (the official `MCRLoss`, expa_type=1, no_diag):
  compression = the mean over (teacher view i, student view j), i != j, of mean_b <t_i, s_j>;
  expansion R = gamma * mean over views of 1/2 logdet(I + p / (B eps) Zbar^T Zbar), Zbar =
  (s_v + t_v) / 2, the half log-determinant from the Cholesky diagonal, gamma = (p + B) / (p B);
  loss = -compression - R. The teacher comes in under stop_gradient, so R's gradient reaches
  only the student half of Zbar.
- TTR: the same loss on each network's patch-averaged tokens, B N samples, weighted by
  `ttr_weight` (0.5 * cosine decay to 0 over the first `fraction` of the steps).
- `token_loss`: -(mean cosine over a row's masked tokens), averaged over rows (both views).
- `views`: two crops with independent uniform starts, each augmented (ROIs zeroed, a time block
  zeroed, amplitude scaling, Gaussian noise), in-jit from one key.
- `slice_masks`: the official slice masker's integer rules.
"""

import jax
import jax.numpy as jnp

EPS = 0.05  # the coding-rate precision epsilon


def half_logdet(m_pp):
    """1/2 logdet of a symmetric positive-definite matrix, from its Cholesky diagonal."""
    return jnp.log(jnp.diagonal(jnp.linalg.cholesky(m_pp), axis1=-2, axis2=-1)).sum(-1)


def coding_rate(z_VBp, eps: float = EPS):
    """gamma * mean over views of 1/2 logdet(I + p / (B eps) Z^T Z), float32."""
    z = z_VBp.astype(jnp.float32)
    _, b, p = z.shape
    cov_Vpp = jnp.einsum("vbc,vbd->vcd", z, z, precision=jax.lax.Precision.HIGHEST)
    rate = half_logdet(jnp.eye(p) + (p / (b * eps)) * cov_Vpp).mean()
    return rate * (p + b) / (p * b)


def compression(student_VBp, teacher_VBp):
    """The mean over cross-view pairs (teacher i, student j != i) of mean_b <t_i, s_j>."""
    sim_VV = jnp.einsum("ibp,jbp->ij", teacher_VBp, student_VBp) / student_VBp.shape[1]
    v = sim_VV.shape[0]
    return (sim_VV.sum() - jnp.trace(sim_VV)) / (v * v - v)


def mcr_loss(student_VBp, teacher_VBp, eps: float = EPS):
    """(loss, compression, expansion): module docstring. Both inputs are L2-normalised."""
    teacher_VBp = jax.lax.stop_gradient(teacher_VBp)
    comp = compression(student_VBp, teacher_VBp)
    expa = coding_rate((student_VBp + teacher_VBp) / 2, eps)
    return -comp - expa, comp, expa


def ttr_weight(step, total_steps: int, fraction: float, weight: float = 0.5):
    """The TTR weight at `step`: weight * 1/2 (1 + cos(pi step / S)) for step < S, then 0,
    S = round(fraction * total_steps) (fraction 1: the whole run; 0: never)."""
    span = max(1, round(fraction * total_steps))
    step = jnp.asarray(step, jnp.float32)
    w = weight * 0.5 * (1 + jnp.cos(jnp.pi * step / span))
    return jnp.where((step < span) & (fraction > 0), w, 0.0)


def token_loss(student_VBGPp, teacher_VBGPp, mask_VBGP):
    """-(mean over a row's masked tokens of cos(student, teacher)), averaged over the V B rows;
    the outputs are L2-normalised, so the cosine is the dot product."""
    cos = jnp.sum(student_VBGPp * jax.lax.stop_gradient(teacher_VBGPp), axis=-1)
    m = mask_VBGP.astype(jnp.float32)
    per_row = (cos * m).sum((-2, -1)) / jnp.maximum(m.sum((-2, -1)), 1.0)
    return -per_row.mean()


def network_counts(rows: int, ratio: tuple[float, float]) -> tuple[int, int]:
    """The official network masker's range: randint(max(1, int(r0 G)), min(G, int(r1 G))),
    upper bound exclusive (torch.randint)."""
    low, high = max(1, int(rows * ratio[0])), min(rows, int(rows * ratio[1]))
    return low, max(high, low + 1)


def block_length(ratio, patches: int):
    """The official temporal masker's block: min(max(1, ceil(r P)), P) - 1 patches."""
    return jnp.minimum(jnp.maximum(1, jnp.ceil(ratio * patches)), patches).astype(jnp.int32) - 1


def slice_masks(rng, batch: int, rows: int, patches: int, ratio=(0.65, 0.85)):
    """[B, G, P] bool, one mask per example: with probability 1/2 a random set of whole rows
    (networks; `network_counts`), else one contiguous block of patches (`block_length`, the
    ratio ~ U(ratio)), its start uniform over the places it fits."""
    k_kind, k_count, k_perm, k_ratio, k_start = jax.random.split(rng, 5)
    low, high = network_counts(rows, ratio)
    count_B = jax.random.randint(k_count, (batch,), low, high)
    rank_BG = jnp.argsort(jax.random.uniform(k_perm, (batch, rows)), axis=-1).argsort(-1)
    rows_BG = rank_BG < count_B[:, None]
    length_B = block_length(jax.random.uniform(k_ratio, (batch,), minval=ratio[0],
                                               maxval=ratio[1]), patches)  # fmt: skip
    start_B = jax.random.randint(k_start, (batch,), 0, patches - length_B + 1)
    p = jnp.arange(patches)
    cols_BP = (p >= start_B[:, None]) & (p < (start_B + length_B)[:, None])
    by_rows_B = jax.random.bernoulli(k_kind, 0.5, (batch,))
    return jnp.where(by_rows_B[:, None, None], rows_BG[:, :, None], cols_BP[:, None, :])


def crop(x_BCT, start_B, length: int):
    """x[b, :, start_b : start_b + length] for every b."""
    idx_BL = start_B[:, None] + jnp.arange(length)
    return jnp.take_along_axis(x_BCT, idx_BL[:, None, :], axis=-1)


def augment(rng, x_BCT, rois=(0.0, 0.1), block=(0.0, 0.3), scale=(0.8, 1.2), noise=0.1):
    """The official level-1 augmentation, per example: zero max(1, int(C r)) random ROIs
    (r ~ U(rois)), zero one block of max(1, int(T r)) samples (r ~ U(block)), scale by
    U(scale), add N(0, noise^2)."""
    B, C, T = x_BCT.shape
    ks = jax.random.split(rng, 7)
    ratio = lambda k, r: jax.random.uniform(k, (B,), minval=r[0], maxval=r[1])
    n_roi_B = jnp.maximum(1, (C * ratio(ks[0], rois)).astype(jnp.int32))
    rank_BC = jnp.argsort(jax.random.uniform(ks[1], (B, C)), axis=-1).argsort(-1)
    keep_BC = rank_BC >= n_roi_B[:, None]
    n_t_B = jnp.maximum(1, (T * ratio(ks[2], block)).astype(jnp.int32))
    start_B = jax.random.randint(ks[3], (B,), 0, T - n_t_B + 1)
    t = jnp.arange(T)
    keep_BT = (t < start_B[:, None]) | (t >= (start_B + n_t_B)[:, None])
    gain_B = ratio(ks[4], scale)
    x = x_BCT * (keep_BC[:, :, None] & keep_BT[:, None, :]) * gain_B[:, None, None]
    return x + noise * jax.random.normal(ks[5], x.shape, x.dtype)


def views(rng, x_BCT, length: int, num_views: int = 2):
    """[V, B, C, length]: `num_views` crops of every scan, independent uniform starts."""
    B, _, T = x_BCT.shape
    out = []
    for k in jax.random.split(rng, num_views):
        k_start, k_aug = jax.random.split(k)
        v = crop(x_BCT, jax.random.randint(k_start, (B,), 0, T - length + 1), length)
        out.append(augment(k_aug, v))
    return jnp.stack(out)


def momentum(step, total_steps: int, base: float = 0.99):
    """The teacher's EMA momentum: a cosine from `base` at step 0 to 1 at `total_steps`."""
    cos = 0.5 * (1 + jnp.cos(jnp.pi * jnp.asarray(step, jnp.float32) / max(total_steps, 1)))
    return 1.0 - (1.0 - base) * cos
