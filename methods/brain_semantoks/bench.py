"""Brain-Semantoks' pretraining step: scans/s, the tokenizer's share, and its formulation.

    python -m launch.bench --methods=brain_semantoks

One process, the `small` config (batch 64, two crops of 100 TRs, 48 ROIs in 6 networks):
  1. the whole training step (`core.train`'s jitted step: both views through student and
     teacher, the three losses, AdamW, the EMA) in scans/s;
  2. the tokenizer alone, forward + gradient on the student's two views and forward on the
     teacher's, as a share of that step;
  3. the tokenizer as Toeplitz matmuls (`model.tokenize_networks`) against sliding windows (the
     formulation it replaced: a gather of every tap, then an einsum per branch), forward + grad.
  4. the official PyTorch step (`bench_official.py`, in a process of its own) on our weights and
     the same two views and masks: its loss, loss parts and gradient norm checked equal to ours
     first, then its step time against ours. It needs torch and einops (the `bench` extra) and
     a checkout of the official code named by BRAIN_SEMANTOKS_OFFICIAL; without them `notes`
     says what is missing.
Both steps are timed as the first steps of a run: the TTR term on (weight 0.5), masking on half
the steps. Ours also crops and augments the views and draws the masks inside the step; the
official step is given them ready (its data loader makes them in worker processes).
"""

import functools
import json
import os
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from configs import brain_semantoks as bs_config
from core import train
from core.benchmark import Ratio, Result, median_seconds, step_seconds
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


def _torch_linear(p) -> dict:
    out = {"weight": np.asarray(p["w"]).T}
    return out | ({"bias": np.asarray(p["b"])} if "b" in p else {})


def official_state(cfg, params, buffers) -> dict[str, np.ndarray]:
    """Our weights in the official `SimDINOModel`'s state-dict names (the teacher a copy of the
    student, as at its initialisation; its mask predictor is its predictor, under both names)."""
    enc, tok = {}, params["tokenizer"]
    for n in range(cfg.networks):
        at = lambda a, n=n: np.asarray(a[n])
        pre = f"network_tokenizers.synthetic.{n}."
        enc[pre + "branches.0.weight"] = at(tok["dense"]["w"]).transpose(2, 1, 0)  # [O, R, taps]
        enc[pre + "branches.0.bias"] = at(tok["dense"]["b"])
        for i, piece in enumerate(tok["sg"]["pieces"]):
            enc[pre + f"branches.1.slconv.kernel_list.{i}"] = at(piece)  # [H, R, k]
        enc[pre + "branches.1.slconv.D"] = at(tok["sg"]["skip"])
        enc[pre + "branches.1.slconv.kernel_norm"] = at(buffers["kernel_norm"])
        enc[pre + "branches.1.slconv.kernel_norm_initialized"] = np.array(True)
        proj = {"w": at(tok["sg"]["proj"]["w"]), "b": at(tok["sg"]["proj"]["b"])}
        for k, v in _torch_linear(proj).items():  # input channels (roi, head), as ours
            enc[pre + f"branches.1.projection.{k}"] = v
        enc[pre + "norm.weight"] = at(tok["norm"]["scale"])
        enc[pre + "norm.bias"] = at(tok["norm"]["bias"])
    inter = "inter_network_transformer."
    enc[inter + "mask_embedding"] = np.asarray(params["mask_token"])[None]
    enc[inter + "cls_token"] = np.asarray(params["cls"])[None, None]
    enc[inter + "network_learnable_pos_embedding.weight"] = np.asarray(params["row_embedding"])
    norm = lambda p: {"weight": np.asarray(p["scale"]), "bias": np.asarray(p["bias"])}
    for i, b in enumerate(params["blocks"]):
        pre = f"{inter}transformer_blocks.{i}."
        named = {"norm1": norm(b["norm1"]), "norm2": norm(b["norm2"]),
                 "attn.qkv": _torch_linear(b["qkv"]), "attn.proj": _torch_linear(b["proj"]),
                 "mlp.0": _torch_linear(b["fc1"]), "mlp.3": _torch_linear(b["fc2"])}  # fmt: skip
        enc |= {f"{pre}{m}.{k}": v for m, d in named.items() for k, v in d.items()}
        enc[pre + "ls1.gamma"] = np.asarray(b["ls1"])
        enc[pre + "ls2.gamma"] = np.asarray(b["ls2"])
    enc |= {f"norm.{k}": v for k, v in norm(params["norm"]).items()}
    head = {f"mlp.{m}.{k}": v for m, name in ((0, "fc1"), (2, "fc2"))
            for k, v in _torch_linear(params["head"][name]).items()}  # fmt: skip
    return {f"{who}_{part}.{k}": np.ascontiguousarray(v, np.float32 if v.dtype != bool else bool)
            for who in ("student", "teacher")
            for part, d in (("encoder", enc), ("predictor", head), ("mask_predictor", head))
            for k, v in d.items()}  # fmt: skip


def _masked_key(cfg, ssl, x):
    """A step key whose step masks (the official loss then has all three terms)."""
    for i in range(100):
        key = jax.random.key(i)
        if bool(bs.views_and_masks(cfg, ssl, key, x)[2]):
            return key
    raise RuntimeError("no masking step in 100 keys")


def official_comparison(c, cfg, params, buffers, repeats: int) -> tuple[dict, dict]:
    """(ours, theirs): the loss parts and gradient norm of one step's inputs under our
    `ssl_loss` and the official forward; theirs also its step time (or its import error)."""
    import optax

    x = jnp.asarray(bs.pretraining(c).x_NCT[: c.train.batch_size])
    key = _masked_key(cfg, c.ssl, x)
    views, masks, _ = bs.views_and_masks(cfg, c.ssl, key, x)
    extra = {"teacher": params, "buffers": buffers, "ttr_weight": jnp.float32(c.ssl.ttr_weight)}

    def loss(p):
        return bs.ssl_loss(cfg, c.ssl, p, {"x": x}, rng=key, extra=extra)

    (total, m), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    ours = {"loss": float(total), "cls_loss": float(m["cls_loss"]),
            "network_loss": c.ssl.ttr_weight * float(m["ttr_loss"]),
            "mask_loss": c.ssl.mask_weight * float(m["token_loss"]),
            "grad_norm": float(optax.global_norm(grads))}  # fmt: skip
    settings = {k: getattr(cfg, k) for k in ("patch", "crop", "dim", "depth", "heads", "mlp",
                "layer_scale", "networks", "roi_per_network", "head_hidden", "head_out",
                "dense_channels", "sg_channels", "sg_kernel", "sg_scales", "sg_decay")}  # fmt: skip
    settings |= {"momentum": c.ssl.momentum, "mask_weight": c.ssl.mask_weight,
                 "ttr_weight": c.ssl.ttr_weight, "lr": c.optim.lr,
                 "weight_decay": c.optim.weight_decay, "steps": c.train.steps,
                 "repeats": repeats}  # fmt: skip
    arrays = official_state(cfg, params, buffers)
    arrays |= {"v1": np.asarray(views[0]), "v2": np.asarray(views[1]),
               "m1": np.asarray(masks[0]), "m2": np.asarray(masks[1])}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "inputs.npz")
        np.savez(path, settings=json.dumps(settings), **arrays)
        proc = subprocess.run(
            [sys.executable, "-m", "methods.brain_semantoks.bench_official", path],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
    if proc.returncode:
        raise RuntimeError(f"the official comparator failed: {proc.stderr.strip()[-2000:]}")
    return ours, json.loads(proc.stdout.strip().splitlines()[-1])


def measure(*, smoke: bool = False) -> Result:
    c = bs_config.get_config("size=smoke" if smoke else "size=small")
    c.dtype = "float32"
    repeats = 2 if smoke else 10
    session = train.init(c, bs.make(c), devices=jax.devices()[:1])
    step_s = step_seconds(session, session.next_batch(), repeats)
    state = session.state
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
    notes = []
    ours, theirs = official_comparison(c, cfg, state.params, buffers, repeats)
    if "import_error" in theirs:
        notes.append(f"the official PyTorch step is not measured ({theirs['import_error']}): "
                     "install the bench extra and set BRAIN_SEMANTOKS_OFFICIAL to a checkout of "
                     "github.com/SamGijsen/Brain-Semantoks")  # fmt: skip
    else:
        # Both in float32 on the same inputs; the parts are O(1) sums over thousands of terms and
        # a Cholesky, computed in another order: 1e-4 relative.
        for k, v in ours.items():
            np.testing.assert_allclose(theirs[k], v, rtol=1e-4, atol=1e-5, err_msg=k)
        ratios.append(Ratio("pretraining step: official PyTorch / ours (JAX)", "official",
                            theirs["step_seconds"], "ours", step_s, "s"))  # fmt: skip
        details |= {"official_step_seconds": theirs["step_seconds"],
                    "official_scans_per_second": scans / theirs["step_seconds"],
                    "official_over_ours": theirs["step_seconds"] / step_s,
                    "official_torch": theirs["torch"], "official_threads": theirs["threads"],
                    "checked_equal": {k: [v, theirs[k]] for k, v in ours.items()}}  # fmt: skip
    return Result(ratios, details, notes)
