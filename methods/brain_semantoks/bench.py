"""Brain-Semantoks' pretraining step: scans/s, the tokenizer's share, and its formulation.

    python -m launch.bench --methods=brain_semantoks

One process, the `small` config (batch 64, two crops of 100 TRs, 48 ROIs in 6 networks):
  1. the whole training step (`core.train`'s jitted step: both views through student and
     teacher, the three losses, AdamW, the EMA) in scans/s;
  2. the tokenizer alone, forward + gradient on the student's two views and forward on the
     teacher's, as a share of that step;
  3. the tokenizer as Toeplitz matmuls (`model.tokenize_networks`) against sliding windows (the
     formulation it replaced: a gather of every tap, then an einsum per branch), forward + grad.
The official PyTorch step is not measured here: torch is not installed on this machine (its
CPU wheel is not on PyPI's default index); `notes` says so.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from configs import brain_semantoks as bs_config
from core import train
from core.benchmark import Ratio, Result, median_seconds
from methods import brain_semantoks as bs
from methods.brain_semantoks import model


def windows_tokenizer(cfg, p, buffers, x_BNRPL):
    """The sliding-window formulation: every tap gathered, then one einsum per branch."""

    def win(x, taps, left):
        length = x.shape[-1]
        pad = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(left, taps - 1 - left)])
        return pad[..., np.arange(length)[:, None] + np.arange(taps)[None, :]]

    dense = jnp.einsum("bnrplj,njro->bnplo", win(x_BNRPL, 3, 1), p["dense"]["w"])
    dense = dense + p["dense"]["b"][:, None, None]
    sg = p["sg"]
    kernel = model.sg_kernel(cfg, sg["pieces"]) / buffers["kernel_norm"]
    taps = cfg.sg_length
    y = jnp.einsum("bnrplj,nhrj->bnprhl", win(x_BNRPL, taps, (taps - 1) // 2), kernel[..., ::-1])
    y = y + jnp.einsum("bnrpl,nhr->bnprhl", x_BNRPL, sg["skip"])
    B, N, P = y.shape[:3]
    y = y.reshape(B, N, P, -1, y.shape[-1])
    sgc = jnp.einsum("bnpcl,nco->bnplo", y, sg["proj"]["w"]) + sg["proj"]["b"][:, None, None]
    both = model.gelu(jnp.concatenate([dense, sgc], axis=-1)).mean(axis=3)
    return model.layer_norm(jax.tree.map(lambda a: a[:, None], p["norm"]), both)


def _tokenizer_cost(cfg, tokenize, params, buffers, x_BNRPL):
    """Forward + gradient (student) and forward (teacher) of one tokenizer on both views."""

    def student(p):
        return tokenize(cfg, p, buffers, x_BNRPL).sum()

    @jax.jit
    def both(p):
        g = jax.grad(student)(p)
        t = tokenize(cfg, p, buffers, x_BNRPL)
        return g, t

    return lambda: jax.block_until_ready(both(params))


def measure(*, smoke: bool = False) -> Result:
    c = bs_config.get_config("size=smoke" if smoke else "size=small")
    c.dtype = "float32"
    repeats = 2 if smoke else 10
    session = train.init(c, bs.make(c), devices=jax.devices()[:1])
    batch = session.next_batch()
    state = session.state

    def one_step():
        nonlocal state
        state, metrics = session.step(state, batch)
        jax.block_until_ready(metrics)

    step_s = median_seconds(one_step, repeats, warmup=2)
    cfg = bs.model_config(c)
    tok = jax.device_get(state.params["tokenizer"])
    buffers = state.extra["buffers"]
    b = 2 * c.train.batch_size  # both views
    x = jnp.asarray(bs.pretraining(c).x_NCT[: c.train.batch_size, :, : cfg.crop])
    x = jnp.concatenate([x, x])
    x_BNRPL = model.patches(cfg, x).reshape(b, cfg.networks, cfg.roi_per_network, cfg.patches,
                                            cfg.patch)  # fmt: skip
    toeplitz_s = median_seconds(
        _tokenizer_cost(cfg, model.tokenize_networks, tok, buffers, x_BNRPL), repeats
    )
    windows_s = median_seconds(
        _tokenizer_cost(cfg, windows_tokenizer, tok, buffers, x_BNRPL), repeats
    )
    same = functools.partial(np.testing.assert_allclose, atol=1e-4)
    same(np.asarray(model.tokenize_networks(cfg, tok, buffers, x_BNRPL)),
         np.asarray(windows_tokenizer(cfg, tok, buffers, x_BNRPL)))  # fmt: skip
    scans = c.train.batch_size
    ratios = [
        Ratio("pretraining step: tokenizer (fwd + grad + teacher fwd) within the step", "step",
              step_s, "tokenizer", toeplitz_s, "s"),
        Ratio("tokenizer fwd + grad, both views: windows / Toeplitz", "sliding windows",
              windows_s, "Toeplitz matmuls", toeplitz_s, "s"),
    ]  # fmt: skip
    details = {
        "batch_scans": scans,
        "step_seconds": step_s,
        "scans_per_second": scans / step_s,
        "tokenizer_seconds": toeplitz_s,
        "tokenizer_share": toeplitz_s / step_s,
        "windows_seconds": windows_s,
        "windows_over_toeplitz": windows_s / toeplitz_s,
    }
    notes = ["the official PyTorch step is not measured: torch is not installed here"]
    return Result(ratios, details, notes)
