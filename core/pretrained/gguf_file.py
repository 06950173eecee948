"""GGUF checkpoints (llama.cpp's format): metadata, the config, and the tensors dequantized to
float32 with a cache keyed by the file's content.

    f = GGUFFile(path)                 # metadata: from the cache when it holds this file
    cfg = f.config(max_len=None, dtype="float32")   # TransformerConfig, shapes/types checked
    tensors = f.tensors()              # {GGUF name: float32 [out, in]}, dequantized once

The dequantized tensors are stored as one safetensors file named by the GGUF file's sha256
(`registry.cache_dir()/dequantized/`), with the file's metadata (fields, tensor shapes and
types) in its header: a second load hashes the file (~0.1 s) and reads that file, neither
parsing the GGUF (~3 s for SmolLM2's vocabulary) nor dequantizing again, and a changed file
(another hash) never gets the old arrays.
"""

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, quants
from safetensors import SafetensorError, safe_open
from safetensors.numpy import load_file, save_file

from core.nn.transformer_config import TransformerConfig
from core.pretrained import llama_params
from core.pretrained.errors import PretrainedError, one_line
from core.pretrained.registry import cache_dir
from core.pretrained.tokenizer import fields_from_reader

# Types `gguf.quants.dequantize` implements in NumPy that llama.cpp checkpoints commonly use
# (floats, the legacy block quants, the k-quants); anything else is refused by name.
SUPPORTED = tuple(
    GGMLQuantizationType[name]
    for name in ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
    + ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
)
META_KEY = "gguf_metadata"  # the cache file's header entry holding `Metadata` as JSON


@dataclasses.dataclass(frozen=True)
class Metadata:
    """What the loader needs of a GGUF file besides tensor data."""

    fields: dict  # plain Python values, e.g. {"llama.block_count": 30}
    shapes: dict  # tensor name -> [out, in] shape as dequantized
    types: dict  # tensor name -> GGML type name ("Q4_1")


class GGUFFile:
    """One GGUF file: its metadata (from the dequantized cache's header when that holds this
    file's content, else parsed), its config, and its dequantized tensors."""

    def __init__(self, path: Path):
        if not path.is_file():
            raise PretrainedError(f"{path}: no such GGUF file")
        self.path = path
        self.cache = cache_dir() / "dequantized" / f"{sha256(path)}.safetensors"
        self._reader = None
        self.meta = self._cached_metadata() or metadata_of(self.reader)

    @property
    def reader(self) -> GGUFReader:
        if self._reader is None:
            self._reader = open_reader(self.path)
        return self._reader

    def config(self, *, max_len=None, dtype="float32") -> TransformerConfig:
        return config_from_metadata(self.meta, self.path, max_len=max_len, dtype=dtype)

    def tensors(self) -> dict[str, np.ndarray]:
        """Every tensor as float32 [out, in]: the cache's, else dequantized and cached
        (written beside its final name, then moved there: never half-written)."""
        if self._reader is None:  # the metadata came from the cache: so do the tensors
            try:
                tensors = load_file(self.cache)
            except (SafetensorError, OSError):
                tensors = {}  # unreadable: rebuilt below
            if set(tensors) == set(self.meta.shapes):
                return tensors
        tensors = {t.name: dequantize(t, self.path) for t in self.reader.tensors}
        self.cache.parent.mkdir(parents=True, exist_ok=True)
        partial = self.cache.with_name(f"{self.cache.name}.{os.getpid()}.partial")
        save_file(tensors, partial, metadata={META_KEY: json.dumps(dataclasses.asdict(self.meta))})
        os.replace(partial, self.cache)
        return tensors

    def _cached_metadata(self) -> Metadata | None:
        if not self.cache.is_file():
            return None
        try:
            with safe_open(self.cache, framework="numpy") as f:
                stored = json.loads((f.metadata() or {})[META_KEY])
        except (SafetensorError, OSError, KeyError, ValueError):
            return None  # an unreadable cache is rebuilt by `tensors`
        shapes = {name: tuple(shape) for name, shape in stored["shapes"].items()}
        return Metadata(stored["fields"], shapes, stored["types"])


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


def metadata_of(reader: GGUFReader) -> Metadata:
    """Fields as plain Python values, and each tensor's [out, in] shape as dequantized (GGUF
    lists dimensions innermost first) and type name."""
    return Metadata(
        fields=fields_from_reader(reader),
        shapes={t.name: tuple(int(n) for n in reversed(t.shape)) for t in reader.tensors},
        types={t.name: t.tensor_type.name for t in reader.tensors},
    )


def _field(fields: dict, name: str, path: Path):
    if fields.get(name) is None:
        raise PretrainedError(f"{path}: metadata field {name!r} is missing")
    return fields[name]


def config_from_metadata(
    meta: Metadata, path: Path, *, max_len=None, dtype="float32"
) -> TransformerConfig:
    """The transformer config of a llama-architecture GGUF file; every tensor's shape is
    checked against it and its type against `SUPPORTED`."""
    f = meta.fields
    arch = f.get("general.architecture")
    if arch != "llama":
        raise PretrainedError(
            f"{path}: general.architecture={arch!r}; only 'llama' checkpoints are supported"
        )
    heads = int(_field(f, "llama.attention.head_count", path))
    d_model = int(_field(f, "llama.embedding_length", path))
    head_dim = d_model // heads
    for name in ("llama.rope.dimension_count", "llama.attention.key_length"):
        if int(f.get(name, head_dim)) != head_dim:
            raise PretrainedError(
                f"{path}: {name}={f[name]}, but only a rotary/key size of d_model/heads="
                f"{head_dim} is supported"
            )
    scaling = f.get("llama.rope.scaling.type", "none")
    if scaling != "none":
        raise PretrainedError(f"{path}: llama.rope.scaling.type={scaling!r} is not supported")
    embed_rows = meta.shapes.get("token_embd.weight", (None,))[0]
    cfg = TransformerConfig(
        vocab_size=int(f.get("llama.vocab_size") or _field({"": embed_rows}, "", path)),
        num_layers=int(_field(f, "llama.block_count", path)),
        d_model=d_model,
        num_heads=heads,
        num_kv_heads=int(f.get("llama.attention.head_count_kv", heads)),
        d_ff=int(_field(f, "llama.feed_forward_length", path)),
        max_len=int(max_len or f.get("llama.context_length", 2048)),
        rope_base=_decimal(f.get("llama.rope.freq_base", 10000.0)),
        norm_eps=_decimal(_field(f, "llama.attention.layer_norm_rms_epsilon", path)),
        tie_embeddings="output.weight" not in meta.shapes,  # llama.cpp omits a tied output
        rope_layout="half",  # q/k are un-permuted on load (llama_params)
        dtype=dtype,
        param_dtype=dtype,
    )
    llama_params.check_shapes(meta.shapes, cfg, "gguf", path)
    supported = {q.name for q in SUPPORTED}
    for name, type_name in meta.types.items():
        if type_name not in supported:
            raise PretrainedError(
                f"{path}: tensor {name!r} has quantization type {type_name}, not supported "
                f"(supported: {', '.join(q.name for q in SUPPORTED)})"
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


def dequantize(tensor, path: Path) -> np.ndarray:
    """One reader tensor as float32 [out, in]."""
    if tensor.tensor_type not in SUPPORTED:
        raise PretrainedError(
            f"{path}: tensor {tensor.name!r} has unsupported quantization type "
            f"{tensor.tensor_type.name}"
        )
    x = quants.dequantize(tensor.data, tensor.tensor_type)
    shape = tuple(int(n) for n in reversed(tensor.shape))
    return np.ascontiguousarray(x, dtype=np.float32).reshape(shape)
