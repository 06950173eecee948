"""A class-conditional diffusion transformer: DiT, or DDT's condition encoder + velocity decoder.
Flax NNX inside, pure functions over plain pytrees outside (as `core.nn.transformer`).

    params = init_params(cfg, rng)
    v_BHWC, captured = apply(cfg, params, x_BHWC, t_B, y_B, capture=("encoder/blocks/1",))
    s_BND, _ = encode(cfg, params, x_BHWC, t_B, y_B)       # per-token conditions
    v_BHWC, _ = decode(cfg, params, x_BHWC, t_B, y_B, s_BND)  # = apply's output
    enc, dec = sampler_fns(cfg, params)                    # for core.diffusion's samplers
    v, branches, _ = apply_with_branches(cfg, params, x, t, y)            # + every block's
    v2, _, _ = apply_with_branches(cfg, params, x2, t2, y, cached=branches)  # ... replayed
    enc, dec = sampler_fns(cfg, params, feature_cache=True)  # FORA: share_every=N refreshes
    v, _ = apply(cfg, params, x, t, y, patch=fn)           # fn(module) edits the bound module

Architecture (DDT, "Decoupled Diffusion Transformer"; plain DiT when decoder_blocks == 0):
  c = SiLU(t_emb(t) + y_emb(y))         t_emb: sinusoidal(t * time_scale) -> Linear-SiLU-Linear;
                                         y_emb: a table of num_classes + 1 rows, the last the
                                         null class of classifier-free guidance (`null_label`)
  encoder: s = blocks(embed(patchify(x_t)) [+ positions]; c)      -> per-token conditions s
  decoder: h = blocks(embed(patchify(x_t)) [+ positions]; SiLU(t_emb + s))  (per token)
           v = unpatchify(final(h; SiLU(t_emb + s)))
With decoder_blocks == 0 (plain DiT) the encoder's tokens go straight to the final layer,
conditioned on c: `encode` returns the last hidden tokens and `decode` is the final layer.

`decode` recomputes t_emb at its own t, so a sampler sharing s over r steps (encoder sharing)
conditions the decoder on the current time and a stale s (DDT's own code reuses SiLU(t + s)
with the stale t as well; with r = 1 the two agree).

Blocks are adaLN-Zero: [shift, scale, gate] x 2 = Linear(condition) (zero-initialised), so
x += gate_a * attn(norm(x) * (1 + scale_a) + shift_a); x += gate_m * mlp(... same ...). The
final layer's modulation and output projection are zero-initialised too: at init every block is
the identity and the network outputs exactly zero. Norms are RMSNorm (DDT's); attention is
`core.nn.attention.MultiHeadAttention`, bidirectional; MLPs SwiGLU. Positions (cfg.position):
"sincos" (default: fixed 2-D sin-cos absolute positions added to the tokens, MAE's layout),
"learned" (a [N, D] table per stack, normal(0.02)), "none", or "rope2d" (DDT's: nothing added
to the tokens; inside every attention half of each head's q and k features are rotated by the
patch's row, half by its column, `core.nn.positions.rope2d`, so scores see only 2-D offsets).
cfg.qk_norm (default off; DDT's and SD3's) RMS-normalises q and k per head before the rotation.
With the defaults the parameters and numbers are those of the DiT before either option existed.

Feature cache (FORA; Q&C): `apply_with_branches` returns each block's attention and MLP outputs
before their gates; replaying them (`cached=`) runs only the adaLN modulations (this step's
gates) and the residual adds, so a sampler that refreshes them every N steps skips attention and
MLPs in between. `patch` (every pure function here) edits the freshly bound module before it
runs: `core.quant.patch_linears` swaps linear layers' products for quantised ones.

Capture names (`capture_names`): "encoder/embed" and "decoder/embed" (tokens + additive
positions, before the first block), "encoder/blocks/<k>" and "decoder/blocks/<k>" (the residual
stream after block k), "condition" (s, the encoder's output).

Shape suffixes: B batch, H W C image, N tokens, P patch features (p * p * C), D d_model.
"""

import math

import jax
import jax.numpy as jnp
from flax import nnx

from core.nn import attention, layers
from core.nn.dit_config import DIT_POSITIONS, DiTConfig  # noqa: F401  (re-exported)
from core.nn.image import grid_positions, patchify, sincos_positions, unpatchify
from core.nn.pure import PureModule


def null_label(cfg: DiTConfig) -> int:
    """The label of the null class (classifier-free guidance's unconditional input)."""
    return cfg.num_classes


def drop_labels(cfg: DiTConfig, rng: jax.Array, y_B: jax.Array, p: float) -> jax.Array:
    """y with each label replaced by the null class with probability p (CFG training)."""
    drop_B = jax.random.bernoulli(rng, p, y_B.shape)
    return jnp.where(drop_B, null_label(cfg), y_B)


def timestep_features(t_B: jax.Array, dim: int, max_period: float = 10000.0) -> jax.Array:
    """[cos(t f_j), sin(t f_j)], f_j = max_period^(-j / (dim/2)): float32 [B, dim]."""
    half = dim // 2
    freqs = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / half)
    angles_BJ = t_B.astype(jnp.float32)[:, None] * freqs
    return jnp.concatenate([jnp.cos(angles_BJ), jnp.sin(angles_BJ)], axis=-1)


def _linear(cfg, rngs, d_in, d_out, *, zero=False, init=None):
    """A dense layer with bias through `flat_dot_general`; zero=True for adaLN-Zero layers."""
    kernel_init = nnx.initializers.zeros_init() if zero else init
    kwargs = {} if kernel_init is None else {"kernel_init": kernel_init}
    return nnx.Linear(
        d_in,
        d_out,
        use_bias=True,
        dtype=jnp.dtype(cfg.dtype),
        param_dtype=jnp.dtype(cfg.param_dtype),
        dot_general=layers.flat_dot_general,
        rngs=rngs,
        **kwargs,
    )


def modulate(x_BND, shift, scale):
    return x_BND * (1 + scale) + shift


class TimestepEmbedder(nnx.Module):
    def __init__(self, cfg: DiTConfig, rngs: nnx.Rngs):
        init = nnx.initializers.normal(0.02)
        self.fc1 = _linear(cfg, rngs, cfg.freq_dim, cfg.d_model, init=init)
        self.fc2 = _linear(cfg, rngs, cfg.d_model, cfg.d_model, init=init)
        self.freq_dim, self.time_scale = cfg.freq_dim, cfg.time_scale
        self.dtype = jnp.dtype(cfg.dtype)

    def __call__(self, t_B):
        feats = timestep_features(t_B * self.time_scale, self.freq_dim).astype(self.dtype)
        return self.fc2(jax.nn.silu(self.fc1(feats)))


class AdaLNBlock(nnx.Module):
    """adaLN-Zero transformer block; the condition is [B, 1, D] (per image) or [B, N, D]."""

    def __init__(self, cfg: DiTConfig, rngs: nnx.Rngs):
        norm = layers.norm_factory(cfg)
        self.attn_norm = norm(cfg.d_model)
        self.attn = attention.MultiHeadAttention(
            cfg,
            rngs,
            positions="rope2d" if cfg.position == "rope2d" else "none",
            impl=cfg.attention_impl,
            qk_norm=cfg.qk_norm,
        )
        self.mlp_norm = norm(cfg.d_model)
        self.mlp = layers.SwiGLU(cfg, rngs)
        self.modulation = _linear(cfg, rngs, cfg.d_model, 6 * cfg.d_model, zero=True)

    def __call__(self, x_BND, cond_BND, mask_BNN, positions_BN2=None):
        """positions_BN2: the patches' (row, column) for "rope2d", else None."""
        return self.with_branches(x_BND, cond_BND, mask_BNN, positions_BN2)[0]

    def with_branches(self, x_BND, cond_BND, mask_BNN, positions_BN2=None):
        """(x_out, (attn_BND, mlp_BND)): the block's output and its two branch outputs before
        their gates, what a FORA-style cache keeps (`replay`)."""
        mods = jnp.split(self.modulation(cond_BND), 6, axis=-1)
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = mods
        h_BND = modulate(self.attn_norm(x_BND), shift_a, scale_a)
        y_BND, _ = self.attn(h_BND, positions_BN2, mask_BNN)
        x_BND = x_BND + gate_a * y_BND
        m_BND = self.mlp(modulate(self.mlp_norm(x_BND), shift_m, scale_m))
        return x_BND + gate_m * m_BND, (y_BND, m_BND)

    def replay(self, x_BND, cond_BND, branches):
        """The block with cached branch outputs: x + gate_a * attn + gate_m * mlp, the gates
        from this step's condition (the modulation runs; attention and MLP do not)."""
        attn_BND, mlp_BND = branches
        mods = jnp.split(self.modulation(cond_BND), 6, axis=-1)
        x_BND = x_BND + mods[2] * attn_BND
        return x_BND + mods[5] * mlp_BND


class FinalLayer(nnx.Module):
    """Modulated norm and a projection to patch features, both zero-initialised."""

    def __init__(self, cfg: DiTConfig, rngs: nnx.Rngs):
        self.norm = layers.norm_factory(cfg)(cfg.d_model)
        self.modulation = _linear(cfg, rngs, cfg.d_model, 2 * cfg.d_model, zero=True)
        self.out = _linear(cfg, rngs, cfg.d_model, cfg.patch_dim, zero=True)

    def __call__(self, x_BND, cond_BND):
        shift, scale = jnp.split(self.modulation(cond_BND), 2, axis=-1)
        return self.out(modulate(self.norm(x_BND), shift, scale))


class Stack(nnx.Module):
    """Patch embedding + positions + adaLN blocks: the encoder or the decoder."""

    def __init__(self, cfg: DiTConfig, num_blocks: int, rngs: nnx.Rngs):
        self.embed = _linear(
            cfg, rngs, cfg.patch_dim, cfg.d_model, init=nnx.initializers.xavier_uniform()
        )
        if cfg.position == "learned":
            init = nnx.initializers.normal(0.02)
            shape = (cfg.num_tokens, cfg.d_model)
            self.positions = nnx.Param(init(rngs.params(), shape, jnp.dtype(cfg.param_dtype)))
        self.blocks = nnx.List([AdaLNBlock(cfg, rngs) for _ in range(num_blocks)])
        self.cfg = cfg

    def tokens(self, x_BHWC):
        cfg = self.cfg
        h_BND = self.embed(patchify(x_BHWC.astype(jnp.dtype(cfg.dtype)), cfg.patch_size))
        if cfg.position == "sincos":
            h_BND = h_BND + sincos_positions(cfg.grid, cfg.d_model).astype(h_BND.dtype)
        elif cfg.position == "learned":
            h_BND = h_BND + self.positions[...].astype(h_BND.dtype)
        return h_BND

    def __call__(self, x_BHWC, cond_BND, keep, name, cached=None):
        """(h_BND, branches): the last hidden tokens and every block's (attn, mlp) branch
        outputs, computed, or with `cached` (an earlier call's branches) replayed."""
        h_BND = self.tokens(x_BHWC)
        keep(f"{name}/embed", h_BND)
        if cached is not None:
            for k, (block, branches) in enumerate(zip(self.blocks, cached, strict=True)):
                h_BND = block.replay(h_BND, cond_BND, branches)
                keep(f"{name}/blocks/{k}", h_BND)
            return h_BND, cached
        B, N, _ = h_BND.shape
        mask_BNN = attention.make_mask("bidirectional", jnp.ones((B, N), bool))
        positions_BN2 = None
        if self.cfg.position == "rope2d":
            positions_BN2 = jnp.broadcast_to(grid_positions(self.cfg.grid), (B, N, 2))
        computed = []
        for k, block in enumerate(self.blocks):
            h_BND, branches = block.with_branches(h_BND, cond_BND, mask_BNN, positions_BN2)
            computed.append(branches)
            keep(f"{name}/blocks/{k}", h_BND)
        return h_BND, tuple(computed)


class DiT(nnx.Module):
    def __init__(self, cfg: DiTConfig, rngs: nnx.Rngs):
        self.t_embed = TimestepEmbedder(cfg, rngs)
        self.y_embed = nnx.Embed(
            cfg.num_classes + 1,
            cfg.d_model,
            dtype=jnp.dtype(cfg.dtype),
            param_dtype=jnp.dtype(cfg.param_dtype),
            embedding_init=nnx.initializers.normal(0.02),
            rngs=rngs,
        )
        self.encoder = Stack(cfg, cfg.encoder_blocks, rngs)
        if cfg.decoder_blocks:
            self.decoder = Stack(cfg, cfg.decoder_blocks, rngs)
        self.final = FinalLayer(cfg, rngs)
        self.cfg = cfg

    def encode(self, x_BHWC, t_B, y_B, keep, cached=None):
        """(s_BND, the encoder's branches); `cached`: replay the encoder's blocks from them."""
        c_B1D = jax.nn.silu(self.t_embed(t_B) + self.y_embed(y_B))[:, None]
        s_BND, branches = self.encoder(x_BHWC, c_B1D, keep, "encoder", cached)
        keep("condition", s_BND)
        return s_BND, branches

    def decode(self, x_BHWC, t_B, y_B, s_BND, keep, cached=None):
        """(prediction, the decoder's branches: () for a plain DiT)."""
        cfg = self.cfg
        t_B1D = self.t_embed(t_B)[:, None]
        branches = ()
        if cfg.decoder_blocks:
            cond_BND = jax.nn.silu(t_B1D + s_BND)
            h_BND, branches = self.decoder(x_BHWC, cond_BND, keep, "decoder", cached)
        else:  # plain DiT: s is the last hidden state; the final layer reads c
            cond_BND = jax.nn.silu(t_B1D + self.y_embed(y_B)[:, None])
            h_BND = s_BND
        out_BNP = self.final(h_BND, cond_BND).astype(jnp.float32)
        return unpatchify(out_BNP, cfg.patch_size, cfg.image_size, cfg.image_size), branches


MODULE = PureModule(DiT)


def model(cfg: DiTConfig, params: dict, patch=None) -> DiT:
    """The NNX module holding `params` (for code that walks the layers by hand, e.g. tests).
    `patch(module)`, when given, edits the freshly bound module in place before it runs (e.g.
    `core.quant.patch_linears`: every linear layer's product fake-quantised)."""
    net = MODULE.bind(cfg, params)
    if patch is not None:
        patch(net)
    return net


def init_params(cfg: DiTConfig, rng: jax.Array) -> dict:
    """Fresh parameters as a nested dict of arrays (params["encoder"]["blocks"][0]["attn"]
    ["q"]["kernel"], ...). Safe under `jax.eval_shape`."""
    return MODULE.init(cfg, rng)


def capture_names(cfg: DiTConfig) -> tuple[str, ...]:
    """Every name `capture=` accepts (module docstring)."""
    names = ["encoder/embed", *(f"encoder/blocks/{k}" for k in range(cfg.encoder_blocks))]
    names.append("condition")
    if cfg.decoder_blocks:
        names.append("decoder/embed")
        names += [f"decoder/blocks/{k}" for k in range(cfg.decoder_blocks)]
    return tuple(names)


def _keeper(cfg, capture):
    unknown = sorted(set(capture) - set(capture_names(cfg)))
    if unknown:
        raise ValueError(
            f"unknown capture name(s) {', '.join(unknown)}; expected any of: "
            + ", ".join(capture_names(cfg))
        )
    captured = {}

    def keep(name, value):
        if name in capture:
            captured[name] = value

    return captured, keep


def _check_inputs(cfg, x_BHWC, t_B, y_B):
    expected = (cfg.image_size, cfg.image_size, cfg.channels)
    if x_BHWC.ndim != 4 or tuple(x_BHWC.shape[1:]) != expected:
        raise ValueError(
            f"x has shape {tuple(x_BHWC.shape)}, expected [B, {', '.join(map(str, expected))}]"
        )
    B = x_BHWC.shape[0]
    for name, value in (("t", t_B), ("y", y_B)):
        if tuple(value.shape) != (B,):
            raise ValueError(f"{name} has shape {tuple(value.shape)}, expected ({B},)")


def encode(cfg: DiTConfig, params: dict, x_BHWC, t_B, y_B, *, capture=(), patch=None):
    """(s_BND, captured): the per-token conditions (plain DiT: the last hidden tokens) and the
    encoder-side intermediates named in `capture`. `patch`: as `model`'s."""
    _check_inputs(cfg, x_BHWC, t_B, y_B)
    captured, keep = _keeper(cfg, capture)
    return model(cfg, params, patch).encode(x_BHWC, t_B, y_B, keep)[0], captured


def decode(cfg: DiTConfig, params: dict, x_BHWC, t_B, y_B, s_BND, *, capture=(), patch=None):
    """(v_BHWC float32, captured): the output given the conditions s from `encode` (possibly
    computed at an earlier step of a sampler)."""
    _check_inputs(cfg, x_BHWC, t_B, y_B)
    captured, keep = _keeper(cfg, capture)
    return model(cfg, params, patch).decode(x_BHWC, t_B, y_B, s_BND, keep)[0], captured


def apply(cfg: DiTConfig, params: dict, x_BHWC, t_B, y_B, *, capture=(), patch=None):
    """(v_BHWC float32, captured): the network's output (a velocity for the flow, a noise
    prediction for DDPM) at x_t [B, H, W, C], times t [B] and labels y [B] (int; the null class
    `null_label(cfg)` for the unconditional model), with the intermediates named in `capture`
    (`capture_names`)."""
    return apply_with_branches(cfg, params, x_BHWC, t_B, y_B, capture=capture, patch=patch)[::2]


def apply_with_branches(
    cfg: DiTConfig, params: dict, x_BHWC, t_B, y_B, *, cached=None, capture=(), patch=None
):
    """(v_BHWC, branches, captured). Without `cached`: the full forward, and every block's
    attention and MLP branch outputs before their gates ({"encoder": ((attn_BND, mlp_BND), ...
    per block), "decoder": (...)}), what a FORA-style feature cache keeps. With `cached` (an
    earlier call's branches): every block replayed from them (`AdaLNBlock.replay`: the residual
    adds with this step's gates; attention and MLPs do not run). Replaying the branches of the
    same inputs gives `apply`'s output."""
    _check_inputs(cfg, x_BHWC, t_B, y_B)
    captured, keep = _keeper(cfg, capture)
    net = model(cfg, params, patch)
    enc_cached, dec_cached = (
        (None, None) if cached is None else (cached["encoder"], cached["decoder"])
    )
    s_BND, enc_branches = net.encode(x_BHWC, t_B, y_B, keep, enc_cached)
    v_BHWC, dec_branches = net.decode(x_BHWC, t_B, y_B, s_BND, keep, dec_cached)
    return v_BHWC, {"encoder": enc_branches, "decoder": dec_branches}, captured


def sampler_fns(cfg: DiTConfig, params: dict, *, feature_cache: bool = False, patch=None):
    """(encode_fn, decode_fn) for `core.diffusion`'s samplers: encode_fn(x, t, y) -> s and
    decode_fn(x, t, y, s) -> prediction, without captures.

    feature_cache=True: s is every block's branch outputs (`apply_with_branches`), so the
    samplers' `share_every=N` is FORA's cache: all branches recomputed at steps 0, N, 2N, ...
    and replayed in between (N = 1 gives the uncached sampler's numbers)."""
    if feature_cache:
        enc = lambda x, t, y: apply_with_branches(cfg, params, x, t, y, patch=patch)[1]  # noqa: E731
        dec = lambda x, t, y, s: apply_with_branches(  # noqa: E731
            cfg, params, x, t, y, cached=s, patch=patch
        )[0]
        return enc, dec
    enc = lambda x, t, y: encode(cfg, params, x, t, y, patch=patch)[0]  # noqa: E731
    dec = lambda x, t, y, s: decode(cfg, params, x, t, y, s, patch=patch)[0]  # noqa: E731
    return enc, dec
