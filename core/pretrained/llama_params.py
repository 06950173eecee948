"""Llama checkpoints (Hugging Face or GGUF tensor names) -> one parameter tree of
`core.nn.transformer`, and the checks that a tree fits a model.

Both routes give the same tree for the same weights. The convention is the half-split RoPE
layout (cfg.rope_layout "half", Hugging Face's and the transformer's default): GGUF stores q/k
rows permuted per head for llama.cpp's interleaved rotation, and those rows are un-permuted
here. Why this way and not rope_layout="interleaved": the loaded params then equal the HF
folder's bit for bit, and they start any method whose transformer uses the default layout
(`train.init_from=pretrained:...`) without a layout field to carry along.

Stored matrices are [out, in] (torch Linear, dequantized GGUF); our kernels are [in, out].
"""

import dataclasses
from collections.abc import Mapping

import jax
import numpy as np

from core.nn import positions, transformer
from core.pretrained.errors import PretrainedError
from core.sharding import path_str, tree_shardings


@dataclasses.dataclass(frozen=True)
class Tensor:
    """One checkpoint tensor: our "/"-joined param path, its names in the two formats, its
    stored shape, whether it is a matrix to transpose, and (q/k only) the heads to un-permute."""

    path: str
    hf: str
    gguf: str
    shape: tuple[int, ...]
    transpose: bool = False
    rope_heads: int = 0


def tensor_table(cfg) -> list[Tensor]:
    """Every tensor a Llama of `cfg` has (lm_head only when untied)."""
    D, F, V, K = cfg.d_model, cfg.d_ff, cfg.vocab_size, cfg.head_dim
    H, G = cfg.num_heads, cfg.num_kv_heads or cfg.num_heads
    rows = [Tensor("embed/embedding", "model.embed_tokens.weight", "token_embd.weight", (V, D))]
    linears = (  # ours, HF module, GGUF name, [out, in], rope heads
        ("attn/q", "self_attn.q_proj", "attn_q", (H * K, D), H),
        ("attn/k", "self_attn.k_proj", "attn_k", (G * K, D), G),
        ("attn/v", "self_attn.v_proj", "attn_v", (G * K, D), 0),
        ("attn/o", "self_attn.o_proj", "attn_output", (D, H * K), 0),
        ("mlp/gate", "mlp.gate_proj", "ffn_gate", (F, D), 0),
        ("mlp/up", "mlp.up_proj", "ffn_up", (F, D), 0),
        ("mlp/down", "mlp.down_proj", "ffn_down", (D, F), 0),
    )
    norms = (
        ("attn_norm", "input_layernorm", "attn_norm"),
        ("mlp_norm", "post_attention_layernorm", "ffn_norm"),
    )
    for i in range(cfg.num_layers):
        hf, gg = f"model.layers.{i}.", f"blk.{i}."
        for ours, hf_name, gg_name in norms:
            rows.append(
                Tensor(
                    f"blocks/{i}/{ours}/scale",
                    hf + hf_name + ".weight",
                    gg + gg_name + ".weight",
                    (D,),
                )
            )
        for ours, hf_name, gg_name, shape, heads in linears:
            rows.append(
                Tensor(
                    f"blocks/{i}/{ours}/kernel",
                    hf + hf_name + ".weight",
                    gg + gg_name + ".weight",
                    shape,
                    True,
                    heads,
                )
            )
    rows.append(Tensor("final_norm/scale", "model.norm.weight", "output_norm.weight", (D,)))
    if not cfg.tie_embeddings:
        rows.append(Tensor("lm_head/kernel", "lm_head.weight", "output.weight", (V, D), True))
    return rows


def name_of(row: Tensor, route: str) -> str:
    return row.hf if route == "hf" else row.gguf


def check_shapes(shapes: Mapping[str, tuple], cfg, route: str, source) -> None:
    """A one-line error for the first tensor of `cfg` that `shapes` (name -> stored shape, the
    file's metadata) lacks or has with another shape."""
    for row in tensor_table(cfg):
        name = name_of(row, route)
        if name not in shapes:
            raise PretrainedError(f"{source}: tensor {name!r} is missing (expected {row.shape})")
        if tuple(shapes[name]) != row.shape:
            raise PretrainedError(
                f"{source}: tensor {name!r} has shape {tuple(shapes[name])}, expected "
                f"{row.shape} from the file's config ({describe(cfg)})"
            )


def describe(cfg) -> str:
    return (
        f"d_model={cfg.d_model}, heads={cfg.num_heads}, kv_heads={cfg.num_kv_heads}, "
        f"d_ff={cfg.d_ff}, vocab={cfg.vocab_size}, layers={cfg.num_layers}"
    )


def params_from_tensors(get, cfg, route: str, source, dtype="float32") -> dict:
    """The parameter tree (numpy leaves of `dtype`) from `get(name)` -> the stored float array
    (HF or GGUF names, `route`), checked against `cfg`'s shapes."""
    flat = {}
    for row in tensor_table(cfg):
        name = name_of(row, route)
        x = np.asarray(get(name), np.float32)
        if x.shape != row.shape:
            raise PretrainedError(
                f"{source}: tensor {name!r} has shape {x.shape}, expected {row.shape} "
                f"({describe(cfg)})"
            )
        x = x.T if row.transpose else x
        if route == "gguf" and row.rope_heads:  # llama.cpp stores q/k for interleaved pairs
            x = positions.interleaved_to_half_columns(x, row.rope_heads)
        flat[row.path] = np.ascontiguousarray(x, dtype=np.dtype(dtype))
    return nest(flat)


def nest(flat: Mapping[str, object]) -> dict:
    """{"blocks/0/attn/q/kernel": x, ...} -> the nested dict `transformer.init_params` gives
    (block indices as int keys)."""
    tree: dict = {}
    for path, value in flat.items():
        keys = [int(k) if k.isdigit() else k for k in path.split("/")]
        node = tree
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return tree


def abstract_params(cfg) -> dict:
    """The ShapeDtypeStructs of the tree `params_from_tensors` gives for `cfg` (from the table:
    nothing traced or read)."""
    return nest(
        {
            row.path: jax.ShapeDtypeStruct(
                row.shape[::-1] if row.transpose else row.shape, np.dtype(cfg.param_dtype)
            )
            for row in tensor_table(cfg)
        }
    )


def check_fits(have, want, what: str) -> None:
    """A one-line error naming the first path where the tree `have` (the checkpoint's, arrays
    or ShapeDtypeStructs) differs from `want` (a method's params) in structure or shape.
    Dtypes may differ: the checkpoint is cast to the method's."""
    have_flat = {path_str(p): x for p, x in jax.tree_util.tree_flatten_with_path(have)[0]}
    want_flat = {path_str(p): x for p, x in jax.tree_util.tree_flatten_with_path(want)[0]}
    for path, x in want_flat.items():
        if path not in have_flat:
            raise PretrainedError(
                f"{what}: the method's parameter {path} {tuple(x.shape)} is not in the "
                f"checkpoint (it has {', '.join(sorted(have_flat)[:4])}, ...)"
            )
        if tuple(have_flat[path].shape) != tuple(x.shape):
            raise PretrainedError(
                f"{what}: parameter {path} is {tuple(have_flat[path].shape)} in the checkpoint "
                f"but {tuple(x.shape)} in the method"
            )
    extra = sorted(set(have_flat) - set(want_flat))
    if extra:
        raise PretrainedError(f"{what}: the checkpoint's parameter {extra[0]} is not the method's")


def placed(params: dict, mesh, fsdp_min_size: int = 2**14) -> dict:
    """`params` as global arrays on `mesh`, laid out as the core lays out a train state's params:
    the transformer's tensor-parallel rules over "model", FSDP over "fsdp", else replicated."""
    from core.initial_state import place  # the core's own host -> global array placement

    shardings = tree_shardings(params, mesh, transformer.SHARDING_RULES, fsdp_min_size)
    return jax.tree.map(place, params, shardings)
