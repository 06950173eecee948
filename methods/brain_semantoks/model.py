"""Brain-Semantoks' encoder as pure functions of a params dict (the official `CNN_TF`).

    params, buffers = init(cfg, rng)
    tokens_BSD = encode(cfg, params, buffers, x_BCT, mask_BGP)   # S = 1 + G * P, CLS first
    z_BSp = project(params["head"], tokens_BSD)                  # L2-normalised head outputs

Tokenizer (cfg.tokens == "network"): one tokenizer per network, stacked and applied to all
networks at once (networks must have equal ROI counts). Each maps one network's patch
[R ROIs, L samples] to a token through two branches in parallel:
- dense: Conv1d R -> `dense_channels`, kernel 3, "same" padding;
- SGConv: a depthwise long convolution per ROI with H = ceil(sg_channels / R) heads, its kernel
  of length kernel_size * 2^(scales - 1) built from `scales` learnable length-`kernel_size`
  pieces (piece i nearest-upsampled by 2^max(0, i - 1), times 2^(scales - i - 1)), divided by
  its norm at initialisation (`buffers["kernel_norm"]`, never trained), "same" length (7 samples
  of left padding, 8 of right for 16 taps), plus a learnable skip D x; then Linear(H R ->
  sg_channels);
then GELU, the mean over the patch's L samples, and a LayerNorm. tokens == "roi" (the official
"max_spatial"): every ROI is its own row, tokenized by one shared Linear(L -> D).

Encoder: masked tokens replaced by a learned mask embedding *before* positions (they keep their
place), + a learned row (network) embedding + fixed sin-cos patch positions, CLS prepended,
pre-LN blocks with LayerScale, a final LayerNorm. Head: Linear -> GELU -> Linear, L2-normalised
(the DINO head without its last layer). Initialisations follow PyTorch's defaults where the
official code keeps them (uniform +- 1/sqrt(fan_in)), N(0, 0.02) for the embeddings and the
truncated N(0, 0.02) of the DINO head.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from core.errors import ConfigError
from core.nn.attention import attend
from core.nn.image import sincos_1d

LN_EPS = 1e-5  # torch.nn.LayerNorm's


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    rois: int = 48
    networks: int = 6
    crop: int = 100
    patch: int = 20
    tokens: str = "network"  # or "roi" (the official max_spatial)
    dim: int = 64
    depth: int = 3
    heads: int = 2
    mlp: int = 256
    head_hidden: int = 128
    head_out: int = 32  # p: the MCR loss's dimension
    dense_channels: int = 32
    sg_channels: int = 32
    dense_kernel: int = 3
    sg_kernel: int = 4
    sg_scales: int = 3
    sg_decay: float = 2.0
    layer_scale: float = 0.1
    dtype: str = "float32"

    def __post_init__(self):
        checks = [
            (self.tokens in ("network", "roi"), f"tokens={self.tokens!r}: network or roi"),
            (self.rois % self.networks == 0, f"{self.rois} ROIs in {self.networks} networks "
             "of equal size (the stacked tokenizers need equal ROI counts)"),
            (self.crop % self.patch == 0, f"crop={self.crop} must be a multiple of patch="
             f"{self.patch}"),
            (self.sg_length <= self.patch, f"the SGConv kernel ({self.sg_length} taps) must fit"
             f" in a patch of {self.patch}"),
            (self.dim % self.heads == 0 and self.dim % 2 == 0, f"dim={self.dim} must be even "
             f"and divisible by heads={self.heads}"),
            (self.tokens == "roi" or self.dense_channels + self.sg_channels == self.dim,
             f"dense_channels + sg_channels = {self.dense_channels + self.sg_channels} must "
             f"equal dim={self.dim} (the tokenizer's output is the encoder's width)"),
        ]  # fmt: skip
        for ok, why in checks:
            if not ok:
                raise ConfigError(f"brain_semantoks model: {why}")

    @property
    def patches(self) -> int:
        return self.crop // self.patch

    @property
    def rows(self) -> int:
        return self.networks if self.tokens == "network" else self.rois

    @property
    def roi_per_network(self) -> int:
        return self.rois // self.networks

    @property
    def sg_heads(self) -> int:
        return math.ceil(self.sg_channels / self.roi_per_network)

    @property
    def sg_length(self) -> int:
        return self.sg_kernel * 2 ** (self.sg_scales - 1)


def _uniform(rng, shape, fan_in):
    bound = 1.0 / math.sqrt(fan_in)
    return jax.random.uniform(rng, shape, jnp.float32, -bound, bound)


def _linear(rng, fan_in, fan_out, lead=()):
    kw, kb = jax.random.split(rng)
    return {
        "w": _uniform(kw, (*lead, fan_in, fan_out), fan_in),
        "b": _uniform(kb, (*lead, fan_out), fan_in),
    }


def _norm(dim, lead=()):
    return {"scale": jnp.ones((*lead, dim)), "bias": jnp.zeros((*lead, dim))}


def layer_norm(p, x):
    """LayerNorm over the last axis, its statistics in float32, the result in x's dtype."""
    h = x.astype(jnp.float32)
    mean = h.mean(-1, keepdims=True)
    var = jnp.square(h - mean).mean(-1, keepdims=True)
    return ((h - mean) * jax.lax.rsqrt(var + LN_EPS) * p["scale"] + p["bias"]).astype(x.dtype)


def gelu(x):
    return jax.nn.gelu(x, approximate=False)  # torch.nn.GELU's default (erf)


def sg_kernel(cfg: ModelConfig, pieces) -> jax.Array:
    """The SGConv kernel [..., H, R, sg_length] from its `sg_scales` pieces [..., H, R, k]."""
    parts = []
    for i, piece in enumerate(pieces):
        up = jnp.repeat(piece, 2 ** max(0, i - 1), axis=-1)  # nearest upsampling
        parts.append(up * cfg.sg_decay ** (cfg.sg_scales - i - 1))
    return jnp.concatenate(parts, axis=-1)


def _init_tokenizer(cfg: ModelConfig, rng):
    n, r, h, k = cfg.networks, cfg.roi_per_network, cfg.sg_heads, cfg.sg_kernel
    ks = jax.random.split(rng, 4 + cfg.sg_scales)
    dense_fan = r * cfg.dense_kernel
    params = {
        "dense": {
            "w": _uniform(ks[0], (n, cfg.dense_kernel, r, cfg.dense_channels), dense_fan),
            "b": _uniform(ks[1], (n, cfg.dense_channels), dense_fan),
        },
        "sg": {
            "pieces": [jax.random.normal(ks[4 + i], (n, h, r, k)) for i in range(cfg.sg_scales)],
            "skip": jax.random.normal(ks[2], (n, h, r)),
            "proj": _linear(ks[3], h * r, cfg.sg_channels, lead=(n,)),
        },
        "norm": _norm(cfg.dim, lead=(n,)),
    }
    norm = jnp.linalg.norm(sg_kernel(cfg, params["sg"]["pieces"]), axis=-1, keepdims=True)
    return params, {"kernel_norm": norm}


def toeplitz(k_J, length: int, left: int):
    """[..., J] -> [..., s, t]: the matrix M with M[s, t] = k[s - t + left] (0 where that is
    outside the kernel), so y[t] = sum_s x[s] M[s, t] = sum_j k[j] x[t - left + j]: a
    "same"-length cross-correlation with `left` samples of zero padding on the left."""
    s, t = np.arange(length)[:, None], np.arange(length)[None, :]
    j = s - t + left
    inside = (j >= 0) & (j < k_J.shape[-1])
    return jnp.where(inside, k_J[..., np.clip(j, 0, k_J.shape[-1] - 1)], 0.0)


def tokenize_networks(cfg: ModelConfig, p, buffers, x_BNRPL):
    """Every network's patches to tokens [B, N, P, D] (module docstring).

    Both convolutions are written as [L, L] Toeplitz matrices per (network, ROI, channel), the
    SGConv's folded into its channel-mixing Linear, so each branch is one matmul per network
    over (ROI, sample): 1.6x faster than sliding windows on CPU (forward and gradient)."""
    B, N, R, P, L = x_BNRPL.shape
    x_NMRL = x_BNRPL.transpose(1, 0, 3, 2, 4).reshape(N, B * P, R, L)
    x_NMRL = x_NMRL.astype(jnp.dtype(cfg.dtype))
    dense_w = p["dense"]["w"].transpose(0, 2, 3, 1)  # [N, R, O, taps]
    dense_T = toeplitz(dense_w, L, (cfg.dense_kernel - 1) // 2).astype(x_NMRL.dtype)
    dtype = x_NMRL.dtype
    dense = jnp.einsum("nmrs,nrost->nmto", x_NMRL, dense_T)
    dense = dense + p["dense"]["b"][:, None, None].astype(dtype)
    sg = p["sg"]
    kernel = sg_kernel(cfg, sg["pieces"]) / buffers["kernel_norm"]  # [N, H, R, taps]
    # torch: conv1d(pad(x, (left, taps - 1 - left)), flip(k)) with left = (taps - 1) // 2: a
    # cross-correlation with the flipped kernel, "same" length and not causal; plus D x.
    taps = cfg.sg_length
    conv_T = toeplitz(kernel[..., ::-1], L, (taps - 1) // 2) + sg["skip"][
        ..., None, None
    ] * jnp.eye(L)
    proj = sg["proj"]["w"].reshape(N, R, -1, cfg.sg_channels)  # channels (roi, head): torch's
    folded = jnp.einsum("nhrst,nrho->nrsto", conv_T, proj)  # "(h c)" of SLConv
    sgc = jnp.einsum("nmrs,nrsto->nmto", x_NMRL, folded.astype(x_NMRL.dtype))
    sgc = sgc + sg["proj"]["b"][:, None, None].astype(dtype)
    pooled = gelu(jnp.concatenate([dense, sgc], axis=-1)).mean(axis=2)  # [N, B P, D]
    tokens = pooled.reshape(N, B, P, -1).transpose(1, 0, 2, 3)
    return layer_norm(jax.tree.map(lambda a: a[:, None], p["norm"]), tokens)


def _init_block(cfg: ModelConfig, rng):
    ks = jax.random.split(rng, 4)
    d = cfg.dim
    return {
        "norm1": _norm(d),
        "qkv": {"w": _uniform(ks[0], (d, 3 * d), d)},  # bias=False in the official Attention
        "proj": _linear(ks[1], d, d),
        "ls1": jnp.full((d,), cfg.layer_scale),
        "norm2": _norm(d),
        "fc1": _linear(ks[2], d, cfg.mlp),
        "fc2": _linear(ks[3], cfg.mlp, d),
        "ls2": jnp.full((d,), cfg.layer_scale),
    }


def _dense(p, x):
    out = x @ p["w"].astype(x.dtype)
    return out + p["b"].astype(x.dtype) if "b" in p else out


def _block(cfg: ModelConfig, p, x_BSD):
    B, S, D = x_BSD.shape
    h = layer_norm(p["norm1"], x_BSD)
    qkv = _dense(p["qkv"], h).reshape(B, S, 3, cfg.heads, D // cfg.heads)
    full_BSS = jnp.ones((B, S, S), bool)
    att = attend(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], full_BSS).reshape(B, S, D)
    dtype = x_BSD.dtype
    x_BSD = x_BSD + p["ls1"].astype(dtype) * _dense(p["proj"], att)
    h = layer_norm(p["norm2"], x_BSD)
    return x_BSD + p["ls2"].astype(dtype) * _dense(p["fc2"], gelu(_dense(p["fc1"], h)))


def init(cfg: ModelConfig, rng) -> tuple[dict, dict]:
    """(params, buffers): the encoder and head's trained parameters, and what is fixed at init
    (the SGConv kernel norms; empty for ROI tokens)."""
    ks = jax.random.split(rng, 7 + cfg.depth)
    if cfg.tokens == "network":
        tokenizer, buffers = _init_tokenizer(cfg, ks[0])
    else:
        tokenizer, buffers = _linear(ks[0], cfg.patch, cfg.dim), {}
    small = lambda k, shape: 0.02 * jax.random.normal(k, shape)
    head = {
        "fc1": {"w": _trunc(ks[4], (cfg.dim, cfg.head_hidden)), "b": jnp.zeros(cfg.head_hidden)},
        "fc2": {"w": _trunc(ks[5], (cfg.head_hidden, cfg.head_out)), "b": jnp.zeros(cfg.head_out)},
    }
    params = {
        "tokenizer": tokenizer,
        "mask_token": small(ks[1], (cfg.dim,)),
        "cls": small(ks[2], (cfg.dim,)),
        "row_embedding": small(ks[3], (cfg.rows, cfg.dim)),
        "blocks": [_init_block(cfg, k) for k in ks[7:]],
        "norm": _norm(cfg.dim),
        "head": head,
    }
    return params, buffers


def _trunc(rng, shape):
    return 0.02 * jax.random.truncated_normal(rng, -2.0 / 0.02, 2.0 / 0.02, shape)


def patches(cfg: ModelConfig, x_BCT):
    """[B, C, T'] -> [B, C, P, L]: non-overlapping patches of length L."""
    B, C, _ = x_BCT.shape
    return x_BCT.reshape(B, C, cfg.patches, cfg.patch)


def tokenize(cfg: ModelConfig, params, buffers, x_BCT):
    """Tokens on the (row, patch) grid [B, G, P, D], G = networks or ROIs."""
    x_BCPL = patches(cfg, x_BCT)
    if cfg.tokens == "roi":
        return _dense(params["tokenizer"], x_BCPL)
    B = x_BCPL.shape[0]
    x_BNRPL = x_BCPL.reshape(B, cfg.networks, cfg.roi_per_network, cfg.patches, cfg.patch)
    return tokenize_networks(cfg, params["tokenizer"], buffers, x_BNRPL)


def encode(cfg: ModelConfig, params, buffers, x_BCT, mask_BGP=None):
    """The encoder's output tokens [B, 1 + G P, D] (CLS first, then row-major over (row,
    patch)); mask_BGP (True: masked) swaps tokens for the mask embedding before positions."""
    dtype = jnp.dtype(cfg.dtype)
    tok_BGPD = tokenize(cfg, params, buffers, x_BCT.astype(dtype))
    if mask_BGP is not None:
        tok_BGPD = jnp.where(mask_BGP[..., None], params["mask_token"].astype(dtype), tok_BGPD)
    positions_PD = jnp.asarray(sincos_1d(np.arange(cfg.patches), cfg.dim), dtype)
    tok_BGPD = tok_BGPD + params["row_embedding"][:, None].astype(dtype) + positions_PD
    B, G, P, D = tok_BGPD.shape
    cls = jnp.broadcast_to(params["cls"].astype(dtype), (B, 1, D))
    x_BSD = jnp.concatenate([cls, tok_BGPD.reshape(B, G * P, D)], axis=1)
    for block in params["blocks"]:
        x_BSD = _block(cfg, block, x_BSD)
    return layer_norm(params["norm"], x_BSD)


def project(head, x_BD):
    """The projection head on any leading shape: Linear -> GELU -> Linear -> L2-normalise
    (torch's F.normalize, eps 1e-12), in float32 for the MCR loss."""
    h = gelu(_dense(head["fc1"], x_BD))
    z = _dense(head["fc2"], h).astype(jnp.float32)
    return z / jnp.maximum(jnp.linalg.norm(z, axis=-1, keepdims=True), 1e-12)


def features(cfg: ModelConfig, params, buffers, x_BCT):
    """The probe's features "cls_avg": [mean of the G P tokens ; CLS], [B, 2D] float32."""
    tokens = encode(cfg, params, buffers, x_BCT).astype(jnp.float32)
    return jnp.concatenate([tokens[:, 1:].mean(1), tokens[:, 0]], axis=-1)
