"""GGUF checkpoints (llama.cpp's format): metadata, the config, and the tensors dequantized to
float32 with a cache keyed by the file's content.

    reader = open_reader(path)                   # metadata + memory-mapped tensors
    cfg = config_from_reader(reader, path)       # TransformerConfig (checked against shapes)
    tensors = dequantized(reader, path)          # {GGUF name: float32 [out, in]}, cached

The dequantized tensors are stored as one safetensors file named by the GGUF file's sha256
(`registry.cache_dir()/dequantized/`), so a second load reads ~0.5 GB of float32 instead of
dequantizing again, and a changed file (another hash) never gets the old arrays.
"""

import hashlib
import os
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, quants
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from core.nn.transformer_config import TransformerConfig
from core.pretrained import llama_params
from core.pretrained.errors import PretrainedError, one_line
from core.pretrained.registry import cache_dir

# Types `gguf.quants.dequantize` implements in NumPy that llama.cpp checkpoints commonly use
# (floats, the legacy block quants, the k-quants); anything else is refused by name.
SUPPORTED = tuple(
    GGMLQuantizationType[name]
    for name in ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
    + ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
)


def open_reader(path: Path) -> GGUFReader:
    """The file's reader; a missing, truncated or corrupt file is one line naming it."""
    if not path.is_file():
        raise PretrainedError(f"{path}: no such GGUF file")
    try:
        return GGUFReader(path)
    except (ValueError, IndexError, OSError, KeyError) as e:
        raise PretrainedError(
            f"{path}: truncated or corrupt GGUF file ({one_line(e)}); fetch or copy it again"
        ) from None


def fields(reader: GGUFReader) -> dict:
    """Metadata as plain Python values (arrays as lists), e.g. {"llama.block_count": 30}."""
    return {name: field.contents() for name, field in reader.fields.items()}


def stored_shapes(reader: GGUFReader) -> dict[str, tuple[int, ...]]:
    """Tensor name -> [out, in] shape as dequantized (GGUF lists dimensions innermost first)."""
    return {t.name: tuple(int(n) for n in reversed(t.shape)) for t in reader.tensors}


def _field(meta: dict, name: str, path: Path, default=None):
    value = meta.get(name, default)
    if value is None:
        raise PretrainedError(f"{path}: metadata field {name!r} is missing")
    return value


def config_from_reader(
    reader: GGUFReader, path: Path, *, max_len=None, dtype="float32"
) -> TransformerConfig:
    """The transformer config of a llama-architecture GGUF file, from metadata only; every
    tensor's shape is checked against it (and its type against `SUPPORTED`)."""
    meta = fields(reader)
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise PretrainedError(
            f"{path}: general.architecture={arch!r}; only 'llama' checkpoints are supported"
        )
    heads = int(_field(meta, "llama.attention.head_count", path))
    d_model = int(_field(meta, "llama.embedding_length", path))
    head_dim = d_model // heads
    for name in ("llama.rope.dimension_count", "llama.attention.key_length"):
        if int(meta.get(name, head_dim)) != head_dim:
            raise PretrainedError(
                f"{path}: {name}={meta[name]}, but only a rotary/key size of d_model/heads="
                f"{head_dim} is supported"
            )
    scaling = meta.get("llama.rope.scaling.type", "none")
    if scaling != "none":
        raise PretrainedError(f"{path}: llama.rope.scaling.type={scaling!r} is not supported")
    shapes = stored_shapes(reader)
    vocab = meta.get("llama.vocab_size") or shapes.get("token_embd.weight", (None,))[0]
    cfg = TransformerConfig(
        vocab_size=int(_field({"vocab": vocab}, "vocab", path)),
        num_layers=int(_field(meta, "llama.block_count", path)),
        d_model=d_model,
        num_heads=heads,
        num_kv_heads=int(meta.get("llama.attention.head_count_kv", heads)),
        d_ff=int(_field(meta, "llama.feed_forward_length", path)),
        max_len=int(max_len or meta.get("llama.context_length", 2048)),
        rope_base=_decimal(meta.get("llama.rope.freq_base", 10000.0)),
        norm_eps=_decimal(_field(meta, "llama.attention.layer_norm_rms_epsilon", path)),
        tie_embeddings="output.weight" not in shapes,  # llama.cpp omits a tied output
        rope_layout="half",  # q/k are un-permuted on load (llama_params)
        dtype=dtype,
        param_dtype=dtype,
    )
    llama_params.check_shapes(shapes, cfg, "gguf", path)
    for t in reader.tensors:
        if t.tensor_type not in SUPPORTED:
            raise PretrainedError(
                f"{path}: tensor {t.name!r} has quantization type {t.tensor_type.name}, not "
                f"supported (supported: {', '.join(q.name for q in SUPPORTED)})"
            )
    return cfg


def _decimal(value) -> float:
    """A float32 field as the shortest decimal that rounds to it (1e-05, not
    9.999999747378752e-06), so the config equals the one config.json gives."""
    return float(str(np.float32(value)))


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def dequantized(reader: GGUFReader, path: Path) -> dict[str, np.ndarray]:
    """Every tensor of the file as float32 [out, in], from the cache when it holds this file's
    content (its sha256), else dequantized and then cached (written atomically)."""
    cache = cache_dir() / "dequantized" / f"{sha256(path)}.safetensors"
    names = {t.name for t in reader.tensors}
    if cache.is_file():
        try:
            tensors = load_file(cache)
        except (SafetensorError, OSError):
            tensors = {}  # an unreadable cache is rebuilt below
        if set(tensors) == names:
            return tensors
    tensors = {t.name: _dequantize(t, path) for t in reader.tensors}
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = cache.with_name(f"{cache.name}.{os.getpid()}.partial")
    save_file(tensors, partial)
    os.replace(partial, cache)
    return tensors


def _dequantize(tensor, path: Path) -> np.ndarray:
    if tensor.tensor_type not in SUPPORTED:
        raise PretrainedError(
            f"{path}: tensor {tensor.name!r} has unsupported quantization type "
            f"{tensor.tensor_type.name}"
        )
    x = quants.dequantize(tensor.data, tensor.tensor_type)
    shape = tuple(int(n) for n in reversed(tensor.shape))
    return np.ascontiguousarray(x, dtype=np.float32).reshape(shape)
