"""The re-test's PTP student (issue 47): LoRA on the frozen code teacher, the official layout.

    settings = LoraSettings()                       # rank 8, alpha 8, every linear of the blocks
    params = init_params(teacher.params, settings, cfg.net.d_model, rng)  # {"lora", "u_anchors"}
    logits_BLV = slot_logits(cfg, settings, teacher.params, params, context_BC, mask_BC, u_BL)
    method = make_method(teacher, cfg, settings, pool, batch_size)

What the official code (mandt-lab/ptp 261b802) does, and what is kept here:
- The student is the teacher with PEFT LoRA adapters (`transformer.py` TransformerModel,
  `LoraConfig(**lora_config)`; the paper's configs: `target_modules: all-linear`, r 256 on
  TinyLlama's d = 2048 and r 128 on Vicuna-7B's 4096, lora_alpha unset, so PEFT's default 8).
  Here: every linear of every block (attention q, k, v, o; MLP gate, up, down; not the
  embedding or the output projection, as "all-linear" leaves the output layer out), rank 8 =
  d / 8 (TinyLlama's ratio on this d = 64 teacher), alpha 8 (scaling alpha / r = 1); A
  uniform in +-1/sqrt(fan-in) (PEFT's kaiming_uniform(a = sqrt 5)), B = 0, so the student
  starts as the teacher. The teacher's weights are constants of the loss, never parameters:
  only the adapters and the u-embedding's anchors train (PEFT freezes the base model; the
  u-embedding is a module beside it, trained).
- The context is the teacher's own pass (`MixedTransformerModel.forward`: `ar_forward` with
  the adapters disabled gives the KV cache; the slots run with them enabled against it), so
  here the context fills a KV cache under the frozen teacher and the L slots run through
  teacher + LoRA against it: slot k sees the context's teacher keys and values and slots <= k.
- Slot positions shifted by -1 (`shift_positions=True`, the official default): slot k
  (0-based) at n - 1 + k for n real context tokens, the first slot at the last context
  token's position, where the teacher's head predicts the first completion token.

LoRA's product x A B s is applied as the merged kernel W + s A B (the same linear map; its
gradient reaches A and B), one matmul per layer at this size.
"""

import dataclasses
import re

import jax
import jax.numpy as jnp

import methods.flow_mtp as flow_mtp
from core import data
from core.method import Method
from core.nn import transformer
from methods.flow_mtp import bins, model

# "all-linear" of the blocks: the attention projections and the SwiGLU MLP's three kernels.
NUM_ANCHORS = 3  # the LinearInterpolationEmbedding default (u = 0, 1/2, 1)
ALL_LINEAR = r"^blocks/\d+/(attn/(q|k|v|o)|mlp/(gate|up|down))/kernel$"


@dataclasses.dataclass(frozen=True)
class LoraSettings:
    rank: int = 8
    alpha: float = 8.0
    targets: str = ALL_LINEAR  # re.search on "/"-joined parameter paths
    shift_positions: bool = True  # the official default (module docstring)

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def _path(key_path) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in key_path)


def target_paths(net_params, settings: LoraSettings) -> list[str]:
    """The "/"-joined paths of the kernels that get adapters (one-line error if none)."""
    paths = [
        _path(kp)
        for kp, _ in jax.tree_util.tree_leaves_with_path(net_params)
        if re.search(settings.targets, _path(kp))
    ]
    if not paths:
        raise ValueError(f"LoRA targets {settings.targets!r} match no parameter of the teacher")
    return paths


def init_params(net_params, settings: LoraSettings, d_model: int, rng) -> dict:
    """{"lora": {path: {"a": [in, r], "b": [r, out]}}, "u_anchors": [3, D]}: B = 0, so the
    adapted network is the teacher at initialisation."""
    flat = {_path(kp): v for kp, v in jax.tree_util.tree_leaves_with_path(net_params)}
    paths = target_paths(net_params, settings)
    keys = jax.random.split(rng, len(paths) + 1)
    lora = {}
    for key, path in zip(keys[1:], paths, strict=True):
        fan_in, fan_out = flat[path].shape
        bound = 1.0 / jnp.sqrt(fan_in)
        a = jax.random.uniform(key, (fan_in, settings.rank), jnp.float32, -bound, bound)
        lora[path] = {"a": a, "b": jnp.zeros((settings.rank, fan_out), jnp.float32)}
    # model.py's anchors: the scale of a token embedding's rows, so neither input dominates.
    anchors = jax.random.normal(keys[0], (NUM_ANCHORS, d_model), jnp.float32) / jnp.sqrt(d_model)
    return {"lora": lora, "u_anchors": anchors}


def merged(net_params, lora: dict, settings: LoraSettings):
    """The adapted network's parameters: W + scaling A B at every adapted kernel."""

    def adapt(key_path, w):
        path = _path(key_path)
        if path not in lora:
            return w
        return w + settings.scaling * (lora[path]["a"] @ lora[path]["b"]).astype(w.dtype)

    return jax.tree_util.tree_map_with_path(adapt, net_params)


def slot_logits(cfg: model.StudentConfig, settings, net_params, params, context_BC, mask_BC, u_BL):
    """Slot logits [B, L, V] (float32): the context through the frozen teacher into a KV cache,
    the u-slots through teacher + LoRA against it. mask_BC: True on real (right-aligned)
    tokens; positions count real tokens from 0."""
    model.check_inputs(cfg, context_BC, u_BL)
    B, C = context_BC.shape
    L = u_BL.shape[1]
    mask_BC = mask_BC.astype(bool)
    net_params = jax.lax.stop_gradient(net_params)
    cache = transformer.init_cache(cfg.net, B, C + L)
    _, cache = transformer.apply(
        cfg.net,
        net_params,
        context_BC,
        positions_BT=jnp.cumsum(mask_BC, axis=1, dtype=jnp.int32) - 1,
        key_mask_BT=mask_BC,
        cache=cache,
    )
    n_B1 = mask_BC.sum(axis=1, keepdims=True, dtype=jnp.int32)
    slot_positions_BL = n_B1 + jnp.arange(L, dtype=jnp.int32)[None] - int(settings.shift_positions)
    logits_BLV, _ = transformer.apply(
        cfg.net,
        merged(net_params, params["lora"], settings),
        embeddings_BTD=model.u_embedding(params["u_anchors"], u_BL),
        positions_BT=slot_positions_BL,
        cache=cache,
    )
    return logits_BLV


def proposer(cfg, settings, net_params, params):
    """propose(context_BC, mask_BC, u_BL) for `decode.generate`: each slot's argmax."""

    def propose(context_BC, mask_BC, u_BL):
        logits_BLV = slot_logits(cfg, settings, net_params, params, context_BC, mask_BC, u_BL)
        return jnp.argmax(logits_BLV, axis=-1).astype(jnp.int32)

    return propose


POOL_KEYS = ("context", "context_mask", "completion", "left", "right")


def make_method(teacher, cfg: model.StudentConfig, settings, pool: dict, batch_size: int):
    """O-PTP on a pool of teacher completions (`code_drafters.teacher_pool`): u ~ Beta(0.3,
    0.3) in the teacher's precomputed bins, the slots' cross-entropy; only adapters and
    anchors are parameters."""

    def init(rng, batch_spec):
        del batch_spec
        return {"params": init_params(teacher.params, settings, cfg.net.d_model, rng)}

    def loss(params, batch, *, rng, extra=None):
        del extra
        u_BL = bins.sample_u(rng, batch["left"], batch["right"], train=True)
        logits_BLV = slot_logits(
            cfg, settings, teacher.params, params, batch["context"], batch["context_mask"], u_BL
        )
        m = flow_mtp.completion_metrics(logits_BLV, batch["completion"])
        return m["nll_B"].mean(), {"correct": m["correct_B"].mean()}

    def dataset(which, *, shard, seed):
        del which
        arrays = {k: pool[k] for k in POOL_KEYS}
        return data.in_memory(arrays, global_batch=batch_size, seed=seed, shard=shard)

    return Method(init=init, loss=loss, dataset=dataset)
