"""TTE_u's pluggable embedding heads over a frozen reasoner's hidden states (Think-Then-Embed).

    name = reasoner_states(decoder_cfg, head_cfg)               # "blocks/3" or "final_norm"
    h_BTD = transformer.forward(decoder_cfg, reasoner_params, tokens_BT, key_mask_BT=mask_BT,
                                capture=(name,), head=False).captured[name]
    head_params = init_head(head_cfg, decoder_cfg, reasoner_params, rng)
    e_BD = head_embed(head_cfg, decoder_cfg, head_params, h_BTD, mask_BT)

Two heads, as the paper compares them:
  "mhsa":   copies of the reasoner's blocks layer+1 .. layer+num_blocks and its final norm, run
            causally (rotary positions 0..T-1, like the reasoner) over the output of block
            `layer`; the embedding is the last valid token's state. Initialised from the
            backbone, so at init the head reproduces the reasoner's own final-norm state when
            it copies every block above `layer` (the paper's winner).
  "pooler": num_queries learned query vectors cross-attending to the final-norm states of the
            valid tokens (masked keys), the outputs averaged over queries, then an RMSNorm.

Positions are 0..T-1, the reasoner's default under `forward` (right padding, as in
methods/tte/tasks.py); a reasoner run with other positions_BT needs them here too.
Shape suffixes: B batch, T tokens, D d_model, Q queries, H heads, K head dim.
"""

import dataclasses
import numbers

import jax
import jax.numpy as jnp
from flax import nnx

from core.contrastive import last_valid
from core.errors import ConfigError
from core.nn import attention, layers, transformer
from core.nn.pure import PureModule
from core.nn.transformer_config import TransformerConfig

KINDS = ("mhsa", "pooler")


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class HeadConfig:
    """Which head, and where it reads the reasoner; sizes and dtypes come from the decoder's
    TransformerConfig, passed beside it."""

    kind: str = "mhsa"  # KINDS
    layer: int = 0  # mhsa: reads "blocks/{layer}"; the pooler reads "final_norm"
    num_blocks: int = 1  # mhsa: reasoner blocks copied on top of `layer`
    num_queries: int = 1  # pooler: learned queries, outputs averaged

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ConfigError(f"HeadConfig.kind={self.kind!r}; expected one of {', '.join(KINDS)}")
        if not _is_int(self.layer) or self.layer < 0:
            raise ConfigError(f"HeadConfig.layer must be an int >= 0, got {self.layer!r}")
        for name in ("num_blocks", "num_queries"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ConfigError(f"HeadConfig.{name} must be an int >= 1, got {value!r}")


def check(head_cfg: HeadConfig, decoder_cfg: TransformerConfig) -> None:
    """The copied blocks must exist in the reasoner (ConfigError otherwise)."""
    top = head_cfg.layer + head_cfg.num_blocks
    if head_cfg.kind == "mhsa" and top >= decoder_cfg.num_layers:
        raise ConfigError(
            f"HeadConfig: layer={head_cfg.layer} + num_blocks={head_cfg.num_blocks} must be < "
            f"the reasoner's num_layers={decoder_cfg.num_layers}"
        )


def reasoner_states(decoder_cfg: TransformerConfig, head_cfg: HeadConfig) -> str:
    """The `transformer.forward(..., capture=...)` name whose states the head reads."""
    check(head_cfg, decoder_cfg)
    return f"blocks/{head_cfg.layer}" if head_cfg.kind == "mhsa" else "final_norm"


# --- "mhsa": a sub-stack run by the transformer itself ---------------------------------------


def _stack_cfg(head_cfg: HeadConfig, decoder_cfg: TransformerConfig) -> TransformerConfig:
    """The decoder with only the head's blocks; a 1-row tied embedding so the module has no
    lm_head (the head never projects to a vocabulary, and never embeds tokens)."""
    return dataclasses.replace(
        decoder_cfg, num_layers=head_cfg.num_blocks, vocab_size=1, tie_embeddings=True
    )


def _init_mhsa(head_cfg, decoder_params) -> dict:
    first = head_cfg.layer + 1
    blocks = {i: decoder_params["blocks"][first + i] for i in range(head_cfg.num_blocks)}
    # Copies, not aliases: a trainer may donate the head's buffers while the reasoner's live.
    return jax.tree.map(jnp.copy, {"blocks": blocks, "final_norm": decoder_params["final_norm"]})


def _embed_mhsa(head_cfg, decoder_cfg, head_params, h_BTD, mask_BT):
    cfg = _stack_cfg(head_cfg, decoder_cfg)
    # The unused embedding row forward's module expects; embeddings_BTD bypasses it.
    unused = {"embedding": jnp.zeros((1, cfg.d_model), jnp.dtype(cfg.param_dtype))}
    out = transformer.forward(
        cfg,
        {**head_params, "embed": unused},
        embeddings_BTD=h_BTD,
        key_mask_BT=mask_BT,
        capture=("final_norm",),
        head=False,
    )
    return last_valid(out.captured["final_norm"], mask_BT)


# --- "pooler": learned queries cross-attending to the final-norm states ----------------------


class Pooler(nnx.Module):
    """Learned queries [Q, D] cross-attending to [B, T, D] states; the mean over Q, normed."""

    def __init__(self, key: tuple[HeadConfig, TransformerConfig], rngs: nnx.Rngs):
        head_cfg, cfg = key
        dense = layers.dense_factory(cfg, rngs)
        D, KV = cfg.d_model, cfg.kv_heads * cfg.head_dim
        # Unit-scale queries, like the RMS-normalised states they are compared with.
        q_QD = jax.random.normal(rngs.params(), (head_cfg.num_queries, D))
        self.queries = nnx.Param(q_QD.astype(jnp.dtype(cfg.param_dtype)))
        self.q, self.k, self.v, self.o = dense(D, D), dense(D, KV), dense(D, KV), dense(D, D)
        self.norm = layers.norm_factory(cfg)(D)
        self.cfg = cfg

    def __call__(self, h_BTD, mask_BT):
        cfg = self.cfg
        B, T, _ = h_BTD.shape
        H, G, K = cfg.num_heads, cfg.kv_heads, cfg.head_dim
        x_QD = self.queries[...].astype(jnp.dtype(cfg.dtype))
        Q = x_QD.shape[0]
        q_BQHK = jnp.broadcast_to(self.q(x_QD).reshape(1, Q, H, K), (B, Q, H, K))
        k_BTGK = self.k(h_BTD).reshape(B, T, G, K)
        v_BTGK = self.v(h_BTD).reshape(B, T, G, K)
        # Every query sees every valid key and no padded one (no positions: a set pooler).
        mask_BQT = jnp.broadcast_to(mask_BT[:, None, :], (B, Q, T))
        out_BQHK = attention.attend(q_BQHK, k_BTGK, v_BTGK, mask_BQT, impl=cfg.attention_impl)
        y_BQD = self.o(out_BQHK.reshape(B, Q, H * K))
        return self.norm(jnp.mean(y_BQD.astype(jnp.float32), axis=1))


POOLER = PureModule(Pooler)


# --- the pure API ----------------------------------------------------------------------------


def init_head(
    head_cfg: HeadConfig, decoder_cfg: TransformerConfig, decoder_params: dict, rng: jax.Array
) -> dict:
    """The head's parameters: mhsa copies the reasoner's blocks layer+1 .. layer+num_blocks and
    its final norm (rng unused); the pooler draws fresh ones from rng."""
    check(head_cfg, decoder_cfg)
    if head_cfg.kind == "mhsa":
        return _init_mhsa(head_cfg, decoder_params)
    return POOLER.init((head_cfg, decoder_cfg), rng)


def head_embed(
    head_cfg: HeadConfig,
    decoder_cfg: TransformerConfig,
    head_params: dict,
    h_BTD: jax.Array,
    mask_BT: jax.Array,
) -> jax.Array:
    """The embeddings [B, D] of the reasoner states h_BTD (`reasoner_states`' capture);
    mask_BT is True on real tokens."""
    check(head_cfg, decoder_cfg)
    if h_BTD.ndim != 3 or h_BTD.shape[-1] != decoder_cfg.d_model:
        raise ConfigError(
            f"head_embed: h_BTD {h_BTD.shape}, expected [B, T, {decoder_cfg.d_model}]"
        )
    if mask_BT.shape != h_BTD.shape[:2]:
        raise ConfigError(f"head_embed: mask_BT {mask_BT.shape}, expected {h_BTD.shape[:2]}")
    mask_BT = mask_BT.astype(bool)
    if head_cfg.kind == "mhsa":
        return _embed_mhsa(head_cfg, decoder_cfg, head_params, h_BTD, mask_BT)
    return POOLER.bind((head_cfg, decoder_cfg), head_params)(h_BTD, mask_BT)
