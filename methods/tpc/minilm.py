"""all-MiniLM-L6-v2 (sentence-transformers) in Flax NNX, and its per-layer activations, cached.

The files (weights, tokenizer, configs) are found, fetched and read by `minilm_files`; `load`
puts them together.

    model = load()                                   # cfg, params, tokenizer, max_len, fingerprint
    batch = tokenize(model.tokenizer, texts)         # numpy int32 [B, T]: ids, mask, types
    h_LBTD = encode(model.params, batch["ids"], batch["mask"], batch["types"], cfg=model.cfg)
    x_BD = mean_pool(h_LBTD[3], batch["mask"])       # layer 3, mean over real tokens
    e_BD = sentence_embeddings(model.params, batch["ids"], batch["mask"], batch["types"])
    x_ND = activations(texts, 3, batch_size=64, cache_path="acts/minilm_l3.npy")

`encode` returns the hidden states of every layer like Hugging Face's `output_hidden_states`:
L + 1 arrays [B, T, D], index 0 the embedding output, index l the output of layer l.
`sentence_embeddings` is the sentence-transformers pipeline of this model (modules.json:
Transformer -> Pooling (mean over tokens, 1_Pooling/config.json) -> Normalize), checked by `load`.
`activations` mean-pools one layer over many texts, stored on disk under a hash of everything
the numbers depend on (`cache_key`).

Architecture (BERT, post-LN): embeddings word + token type + position -> LayerNorm, then L x
[self-attention -> residual -> LayerNorm; dense D->F, exact (erf) GELU, dense F->D -> residual ->
LayerNorm]. The attention is `core.nn.attention`'s (a bidirectional mask over real keys,
`attend`) between BERT's own q/k/v/o projections, which carry biases (their names are the
checkpoint mapping's, `minilm_files`). Everything in float32; matmuls at precision HIGHEST so
that accelerators (TF32 on GPU, bfloat16 passes on TPU by default) give the same numbers as the
float32 reference.

Shape suffixes: B batch, T tokens, S key tokens, H heads, K head dim, D hidden, F intermediate,
L layers (+1 with the embeddings), N texts.
"""

import dataclasses
import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from core.errors import ConfigError
from core.nn import attention
from core.nn.layers import flat_dot_general
from core.nn.pure import PureModule
from methods.tpc import minilm_files
from methods.tpc.minilm_files import MINILM_L6, PACKAGE, PACKAGE_VERSION, MiniLMConfig

HIGHEST = jax.lax.Precision.HIGHEST
CACHE_FORMAT = 1  # bump when activations' numbers change for the same inputs


# ---------------------------------------------------------------------------------------------
# Loading and tokenising


def tokenize(tokenizer, texts, *, pad_to: int | None = None) -> dict[str, np.ndarray]:
    """{"ids", "mask", "types"}: int32 [B, T], right-padded with id 0 / mask 0 / type 0 to the
    longest text, or to `pad_to` (a fixed shape, so that jit compiles once)."""
    if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
        raise ConfigError("tokenize: texts must be a list of strings")
    encodings = tokenizer.encode_batch(list(texts))
    longest = max((len(e.ids) for e in encodings), default=1)
    if pad_to is not None and pad_to < longest:
        raise ConfigError(f"tokenize: pad_to={pad_to} is shorter than the longest text ({longest})")
    T = longest if pad_to is None else pad_to
    out = {k: np.zeros((len(encodings), T), np.int32) for k in ("ids", "mask", "types")}
    for b, e in enumerate(encodings):
        n = len(e.ids)
        out["ids"][b, :n] = e.ids
        out["mask"][b, :n] = e.attention_mask
        out["types"][b, :n] = e.type_ids
    return out


class MiniLM(NamedTuple):
    """Everything `activations` needs. `fingerprint` identifies the weights in cache keys."""

    cfg: MiniLMConfig
    params: dict
    tokenizer: Any
    max_len: int
    fingerprint: str


@functools.lru_cache(maxsize=4)
def load(folder: str | os.PathLike | None = None, max_len: int | None = None) -> MiniLM:
    """Loads the model from `folder` (default `minilm_files.model_dir()`); max_len defaults to
    sentence-transformers' max_seq_length (256)."""
    if folder is None:
        folder = minilm_files.model_dir()
    folder = minilm_files.require_files(Path(folder))
    minilm_files.check_pipeline(folder)
    cfg = minilm_files.config_from_json(folder)
    max_len = max_len or minilm_files.max_seq_length(folder)
    if not 2 <= max_len <= cfg.max_positions:
        raise ConfigError(f"max_len={max_len}; expected 2..{cfg.max_positions}")
    params = jax.tree.map(jnp.asarray, minilm_files.load_params(folder, cfg))
    tokenizer = minilm_files.load_tokenizer(folder, max_len)
    return MiniLM(cfg, params, tokenizer, max_len, minilm_files.weights_sha256(folder))


# ---------------------------------------------------------------------------------------------
# The network


class Embeddings(nnx.Module):
    def __init__(self, cfg: MiniLMConfig, rngs: nnx.Rngs):
        D = cfg.hidden
        self.word = nnx.Embed(cfg.vocab_size, D, rngs=rngs)
        self.position = nnx.Embed(cfg.max_positions, D, rngs=rngs)
        self.token_type = nnx.Embed(cfg.type_vocab_size, D, rngs=rngs)
        self.norm = _layer_norm(cfg, rngs)

    def __call__(self, ids_BT, types_BT):
        T = ids_BT.shape[1]
        # Hugging Face's summation order: (word + token type) + position.
        x_BTD = self.word(ids_BT) + self.token_type(types_BT)
        return self.norm(x_BTD + self.position(jnp.arange(T))[None])


class Layer(nnx.Module):
    def __init__(self, cfg: MiniLMConfig, rngs: nnx.Rngs):
        D, F = cfg.hidden, cfg.intermediate
        dense = functools.partial(
            nnx.Linear, precision=HIGHEST, dot_general=flat_dot_general, rngs=rngs
        )
        self.q, self.k, self.v, self.o = dense(D, D), dense(D, D), dense(D, D), dense(D, D)
        self.attn_norm = _layer_norm(cfg, rngs)
        self.up, self.down = dense(D, F), dense(F, D)
        self.mlp_norm = _layer_norm(cfg, rngs)
        self.cfg = cfg

    def __call__(self, x_BTD, mask_BTS):
        B, T, _ = x_BTD.shape
        H, K = self.cfg.num_heads, self.cfg.head_dim
        q_BTHK = self.q(x_BTD).reshape(B, T, H, K)
        k_BSHK = self.k(x_BTD).reshape(B, T, H, K)
        v_BSHK = self.v(x_BTD).reshape(B, T, H, K)
        out_BTHK = attention.attend(q_BTHK, k_BSHK, v_BSHK, mask_BTS, impl="xla", precision=HIGHEST)
        x_BTD = self.attn_norm(x_BTD + self.o(out_BTHK.reshape(B, T, H * K)))
        # Hugging Face's "gelu" is the exact erf form, not the tanh approximation.
        y_BTD = self.down(jax.nn.gelu(self.up(x_BTD), approximate=False))
        return self.mlp_norm(x_BTD + y_BTD)


class Encoder(nnx.Module):
    def __init__(self, cfg: MiniLMConfig, rngs: nnx.Rngs):
        self.embeddings = Embeddings(cfg, rngs)
        self.layers = nnx.List([Layer(cfg, rngs) for _ in range(cfg.num_layers)])

    def __call__(self, ids_BT, mask_BT, types_BT) -> list[jax.Array]:
        # Every query reads every real key (padding queries too, as in Hugging Face BERT, whose
        # additive float32-minimum mask gives padding keys a softmax weight of exactly 0). A row
        # with no real key (a filler row of a padded batch) gets an attention output of 0.
        mask_BTS = attention.make_mask("bidirectional", mask_BT.astype(bool))
        hidden = [self.embeddings(ids_BT, types_BT)]
        for layer in self.layers:
            hidden.append(layer(hidden[-1], mask_BTS))
        return hidden


def _layer_norm(cfg: MiniLMConfig, rngs: nnx.Rngs) -> nnx.LayerNorm:
    # Two-pass variance, torch's formula (flax's default E[x^2] - E[x]^2 loses digits when
    # |mean| >> std; on the reference sentences the two agree to 1e-7).
    return nnx.LayerNorm(cfg.hidden, epsilon=cfg.layer_norm_eps, use_fast_variance=False, rngs=rngs)


ENCODER = PureModule(Encoder)


def init_params(cfg: MiniLMConfig, rng: jax.Array) -> dict:
    """Random parameters (tests, small configs); same pytree as `load`'s."""
    return ENCODER.init(cfg, rng)


def encode(params: dict, ids_BT, mask_BT, types_BT=None, *, cfg=MINILM_L6) -> list[jax.Array]:
    """Hidden states of every layer: L + 1 float32 arrays [B, T, D], [0] the embeddings.
    Padding positions hold numbers too (they attend to the real tokens); pool with the mask."""
    if types_BT is None:
        types_BT = jnp.zeros_like(ids_BT)
    if ids_BT.shape[1] > cfg.max_positions:
        raise ConfigError(f"encode: {ids_BT.shape[1]} tokens > max_positions={cfg.max_positions}")
    model = ENCODER.bind(cfg, params)
    return model(jnp.asarray(ids_BT), jnp.asarray(mask_BT), jnp.asarray(types_BT))


def mean_pool(h_BTD, mask_BT) -> jax.Array:
    """Mean over real tokens [B, D] (sentence-transformers' mean pooling, with its 1e-9 floor
    on the token count, so an all-padding row gives zeros)."""
    m_BT1 = jnp.asarray(mask_BT, jnp.float32)[..., None]
    return (h_BTD * m_BT1).sum(1) / jnp.maximum(m_BT1.sum(1), 1e-9)


def sentence_embeddings(params, ids_BT, mask_BT, types_BT=None, *, cfg=MINILM_L6) -> jax.Array:
    """SentenceTransformer.encode: mean pool of the last layer, L2-normalised [B, D] (torch's
    F.normalize floor of 1e-12 on the norm)."""
    e_BD = mean_pool(encode(params, ids_BT, mask_BT, types_BT, cfg=cfg)[-1], mask_BT)
    return e_BD / jnp.maximum(jnp.linalg.norm(e_BD, axis=-1, keepdims=True), 1e-12)


@functools.partial(jax.jit, static_argnames=("cfg", "layer"))
def _pooled(params, ids_BT, mask_BT, types_BT, *, cfg, layer):
    # Under jit the layers above `layer` are dead code and XLA drops them.
    return mean_pool(encode(params, ids_BT, mask_BT, types_BT, cfg=cfg)[layer], mask_BT)


# ---------------------------------------------------------------------------------------------
# Activations for many texts


def activations(
    texts,
    layer: int,
    *,
    batch_size: int,
    cache_path: str | os.PathLike | None = None,
    model: MiniLM | None = None,
) -> np.ndarray:
    """Mean-pooled hidden states of `layer` (0 = embeddings, L = last), float32 [N, D].

    Every batch has one shape, [batch_size, T] with T the longest text rounded up to 16
    (filler rows are all padding and dropped), so jit compiles once per call. With
    `cache_path` (a .npy), the result is stored there with a sidecar `<name>.json` holding a
    hash of the texts, layer, truncation length and weights; a cache whose hash differs is
    recomputed, never reused.
    """
    model = model or load()
    if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
        raise ConfigError("activations: texts must be a list of strings")
    texts = list(texts)
    _check_int("layer", layer, 0, model.cfg.num_layers)
    _check_int("batch_size", batch_size, 1, None)
    key = cache_key(texts, layer, model)
    if cache_path is not None:
        cached = _read_cache(Path(cache_path), key, (len(texts), model.cfg.hidden))
        if cached is not None:
            return cached
    out_ND = _compute(texts, layer, batch_size, model)
    if cache_path is not None:
        _write_cache(Path(cache_path), key, out_ND, layer, model)
    return out_ND


def _check_int(name: str, value, lo: int, hi: int | None) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and lo <= value
    if not ok or (hi is not None and value > hi):
        expected = f"{lo}..{hi}" if hi is not None else f"an int >= {lo}"
        raise ConfigError(f"activations: {name}={value!r}; expected {expected}")


@functools.partial(jax.jit, static_argnames=("cfg", "layers"))
def _pooled_layers(params, ids_BT, mask_BT, types_BT, *, cfg, layers):
    hidden = encode(params, ids_BT, mask_BT, types_BT, cfg=cfg)
    return jnp.stack([mean_pool(hidden[layer], mask_BT) for layer in layers])


def activations_layers(
    texts, layers, *, batch_size: int, cache_paths, model: MiniLM | None = None
) -> list[np.ndarray]:
    """`activations(texts, layer, cache_path=path)` for every (layer, path) pair, the missing
    ones from one pass of the encoder (a layer scan pays for the deepest layer once, not for
    every layer's prefix again)."""
    model = model or load()
    texts, layers, paths = list(texts), tuple(layers), [Path(p) for p in cache_paths]
    if len(paths) != len(layers):
        raise ConfigError(f"activations_layers: {len(layers)} layers, {len(paths)} cache paths")
    for layer in layers:
        _check_int("layer", layer, 0, model.cfg.num_layers)
    keys = [cache_key(texts, layer, model) for layer in layers]
    shape = (len(texts), model.cfg.hidden)
    out = [_read_cache(p, k, shape) for p, k in zip(paths, keys, strict=True)]
    missing = tuple(i for i, x in enumerate(out) if x is None)
    if missing:
        computed = _compute(texts, tuple(layers[i] for i in missing), batch_size, model)
        for i, x_ND in zip(missing, computed, strict=True):
            _write_cache(paths[i], keys[i], x_ND, layers[i], model)
            out[i] = x_ND
    return out


def _compute(texts: list[str], layer, batch_size: int, model: MiniLM) -> np.ndarray:
    """[N, D] for one layer, [L, N, D] for a tuple of L layers (one pass)."""
    lengths = [len(e.ids) for e in model.tokenizer.encode_batch(texts)] or [1]
    T = min(-(-max(lengths) // 16) * 16, model.cfg.max_positions)
    layers = layer if isinstance(layer, tuple) else (layer,)
    out = np.zeros((len(layers), len(texts), model.cfg.hidden), np.float32)
    for start in range(0, len(texts), batch_size):
        chunk = texts[start : start + batch_size]
        batch = tokenize(model.tokenizer, chunk + [""] * (batch_size - len(chunk)), pad_to=T)
        batch["mask"][len(chunk) :] = 0  # filler rows: "" still tokenises to [CLS] [SEP]
        args = (model.params, batch["ids"], batch["mask"], batch["types"])
        if isinstance(layer, tuple):
            x_LBD = _pooled_layers(*args, cfg=model.cfg, layers=layers)
        else:
            x_LBD = _pooled(*args, cfg=model.cfg, layer=layer)[None]
        out[:, start : start + len(chunk)] = np.asarray(x_LBD)[:, : len(chunk)]
    return out if isinstance(layer, tuple) else out[0]


def cache_key(texts: list[str], layer: int, model: MiniLM) -> str:
    """sha256 of everything the activations depend on. Each text is length-prefixed so that
    ["ab", "c"] and ["a", "bc"] differ."""
    h = hashlib.sha256()
    head = {"format": CACHE_FORMAT, "layer": layer, "max_len": model.max_len}
    head |= {"weights": model.fingerprint, "cfg": dataclasses.asdict(model.cfg)}
    h.update(json.dumps(head, sort_keys=True).encode())
    for t in texts:
        b = t.encode("utf-8")
        h.update(len(b).to_bytes(8, "little") + b)
    return h.hexdigest()


def _sidecar(path: Path) -> Path:
    return path.with_suffix(".json")


def _read_cache(path: Path, key: str, shape: tuple[int, int]) -> np.ndarray | None:
    try:
        meta = json.loads(_sidecar(path).read_text())
        if meta.get("key") != key:
            return None
        x = np.load(path)
    except (OSError, ValueError):
        return None  # absent or unreadable: recompute
    return x if x.shape == shape and x.dtype == np.float32 else None


def _write_cache(path: Path, key: str, x_ND: np.ndarray, layer: int, model: MiniLM) -> None:
    """Array first, sidecar last, each by rename: a crash leaves no sidecar matching a
    partial array."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _sidecar(path).unlink(missing_ok=True)
    tmp = path.with_name(path.name + ".tmp.npy")
    np.save(tmp, x_ND)
    os.replace(tmp, path)
    meta = {"key": key, "layer": layer, "num_texts": len(x_ND), "max_len": model.max_len}
    meta |= {"model": f"{PACKAGE}=={PACKAGE_VERSION}", "weights_sha256": model.fingerprint}
    tmp_meta = path.with_name(path.name + ".tmp.json")
    tmp_meta.write_text(json.dumps(meta, indent=1) + "\n")
    os.replace(tmp_meta, _sidecar(path))
