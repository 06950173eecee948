"""Hugging Face Llama folders: config.json + model.safetensors (or shards listed in
model.safetensors.index.json), read without torch.

    cfg = config_from_folder(folder)            # TransformerConfig, shapes checked (headers only)
    get = tensor_getter(folder)                 # get("model.norm.weight") -> float32 array

Tied embeddings (config `tie_word_embeddings`): `lm_head.weight` is absent or equal to the
embedding; an untied head must be present.
"""

import json
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open

from core.nn.transformer_config import TransformerConfig
from core.pretrained import llama_params
from core.pretrained.errors import PretrainedError, one_line

INDEX = "model.safetensors.index.json"


def _config_json(folder: Path) -> dict:
    path = folder / "config.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise PretrainedError(f"{path}: no such file (a Hugging Face folder needs it)") from None
    except (OSError, ValueError) as e:
        raise PretrainedError(f"{path}: unreadable JSON ({one_line(e)})") from None


def _field(c: dict, name: str, folder: Path):
    if c.get(name) is None:
        raise PretrainedError(f"{folder / 'config.json'}: field {name!r} is missing")
    return c[name]


def config_from_folder(folder: Path, *, max_len=None, dtype="float32") -> TransformerConfig:
    """The transformer config of a Llama folder; refuses what the transformer does not implement
    and checks every tensor's shape from the safetensors headers."""
    c = _config_json(folder)
    where = folder / "config.json"
    if c.get("model_type") != "llama":
        raise PretrainedError(
            f"{where}: model_type={c.get('model_type')!r}; only 'llama' checkpoints are supported"
        )
    unsupported = {  # field: the value this port implements
        "hidden_act": "silu",
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
    }
    for name, want in unsupported.items():
        if c.get(name, want) != want:
            raise PretrainedError(f"{where}: {name}={c[name]!r}; this loader needs {want!r}")
    d_model = int(_field(c, "hidden_size", folder))
    heads = int(_field(c, "num_attention_heads", folder))
    if c.get("head_dim", d_model // heads) != d_model // heads:
        raise PretrainedError(f"{where}: head_dim={c['head_dim']}; only hidden_size/heads works")
    cfg = TransformerConfig(
        vocab_size=int(_field(c, "vocab_size", folder)),
        num_layers=int(_field(c, "num_hidden_layers", folder)),
        d_model=d_model,
        num_heads=heads,
        num_kv_heads=int(c.get("num_key_value_heads") or heads),
        d_ff=int(_field(c, "intermediate_size", folder)),
        max_len=int(max_len or c.get("max_position_embeddings", 2048)),
        rope_base=float(c.get("rope_theta", 10000.0)),
        norm_eps=float(c.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(c.get("tie_word_embeddings", False)),
        rope_layout="half",
        dtype=dtype,
        param_dtype=dtype,
    )
    llama_params.check_shapes(shapes(folder), cfg, "hf", folder)
    return cfg


def _files(folder: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (one file, or the index's shards)."""
    index = folder / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as e:
            raise PretrainedError(f"{index}: unreadable index ({one_line(e)})") from None
        return {name: folder / file for name, file in weight_map.items()}
    single = folder / "model.safetensors"
    if not single.is_file():
        raise PretrainedError(f"{folder}: no model.safetensors (nor {INDEX})")
    return {name: single for name in _open(single).keys()}  # noqa: SIM118 (not a dict)


def _open(path: Path):
    if not path.is_file():
        raise PretrainedError(f"{path}: no such safetensors file")
    try:
        return safe_open(path, framework="numpy")
    except (SafetensorError, OSError) as e:
        raise PretrainedError(
            f"{path}: truncated or corrupt safetensors file ({one_line(e)})"
        ) from None


def shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape, from the files' headers (no tensor is read)."""
    by_file: dict[Path, list[str]] = {}
    for name, path in _files(folder).items():
        by_file.setdefault(path, []).append(name)
    out = {}
    for path, names in by_file.items():
        f = _open(path)
        for name in names:
            try:
                out[name] = tuple(f.get_slice(name).get_shape())
            except SafetensorError as e:
                raise PretrainedError(
                    f"{path}: tensor {name!r} unreadable ({one_line(e)})"
                ) from None
    return out


def tensor_getter(folder: Path):
    """`get(name)` -> that tensor as float32 numpy (bfloat16/float16 files are widened)."""
    files, handles = _files(folder), {}

    def get(name: str) -> np.ndarray:
        if name not in files:
            raise PretrainedError(f"{folder}: tensor {name!r} is missing")
        path = files[name]
        if path not in handles:
            handles[path] = _open(path)
        try:
            return np.asarray(handles[path].get_tensor(name), np.float32)
        except (SafetensorError, OSError) as e:
            raise PretrainedError(f"{path}: tensor {name!r} unreadable ({one_line(e)})") from None

    return get


def check_tied_head(folder: Path, get, cfg) -> None:
    """A tied model's file may still carry lm_head.weight: it must equal the embedding."""
    if not (cfg.tie_embeddings and "lm_head.weight" in _files(folder)):
        return
    if not np.array_equal(get("lm_head.weight"), get("model.embed_tokens.weight")):
        raise PretrainedError(
            f"{folder}: tie_word_embeddings is true but tensor 'lm_head.weight' differs "
            "from 'model.embed_tokens.weight'"
        )
