"""The official Brain-Semantoks pretraining step (PyTorch) on our weights and inputs, run by
`bench.py` in a process of its own:

    BRAIN_SEMANTOKS_OFFICIAL=/path/to/Brain-Semantoks \\
        python -m methods.brain_semantoks.bench_official IN.npz

IN.npz (`bench.official_inputs`): the official model's state dict in torch's names (our
student's weights, the teacher a copy), two views, their slice masks, and the config. The
official code (github.com/SamGijsen/Brain-Semantoks: `simdino.SimDINOModel`, which needs torch
and einops) is imported from the checkout that BRAIN_SEMANTOKS_OFFICIAL names. Prints one JSON
line: the loss and its parts on the inputs, the gradient's global norm, and the median seconds of
the official training step (forward, backward, clipping at 1, AdamW, the teacher's EMA; masking
on every other step, as its masking frequency 0.5), or {"import_error": ...} when torch, einops
or the checkout is missing. Nothing here runs on JAX: only torch's threads work.
"""

import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np


def _model(settings: dict, network_map: str):
    from simdino import SimDINOModel

    s = settings
    dense = dict(type="dense", kernel_size=3, depthwise=False, out_channels=s["dense_channels"])
    sgconv = dict(type="sgconv", kernel_size=s["sg_kernel"], num_scales=s["sg_scales"],
                  decay_min=s["sg_decay"], decay_max=s["sg_decay"],
                  out_channels=s["sg_channels"])  # fmt: skip
    return SimDINOModel(
        patch_size=s["patch"],
        target_time_length=s["crop"],
        embedding_dim=s["dim"],
        depth=s["depth"],
        heads=s["heads"],
        mlp_dim=s["mlp"],
        layer_scale_init_value=s["layer_scale"],
        network_data_path=network_map,
        atlas_names=["synthetic"],
        atlas_network_counts=[s["networks"]],
        projection_hidden_dim=s["head_hidden"],
        projection_output_dim=s["head_out"],
        projection_bottleneck_dim=s["head_out"],
        projection_nlayers=2,
        base_teacher_momentum=s["momentum"],
        mask_loss_weight=s["mask_weight"],
        network_loss_weight=s["ttr_weight"],
        do_masking=True,
        tokenizer_config=[dense, sgconv],
        tokenizer_final_norm="layer",
    )


# Official state entries our weights do not set: buffers it computes itself (the SGConv's decay
# multiplier, the sin-cos positions) and a LayerNorm its forward never applies.
_OWN = ("slconv.multiplier", "temporal_pos_embedding", "inter_network_transformer.norm.")


def main(path: str) -> dict:
    try:
        import torch

        sys.path.insert(0, os.environ["BRAIN_SEMANTOKS_OFFICIAL"])
        import simdino  # noqa: F401
    except (ImportError, KeyError) as e:
        return {"import_error": repr(e)}
    torch.set_num_threads(os.cpu_count())
    with np.load(path) as z:
        arrays = dict(z)
    settings = json.loads(str(arrays.pop("settings")))
    v1, v2, m1, m2 = (torch.from_numpy(arrays.pop(k)) for k in ("v1", "v2", "m1", "m2"))
    with tempfile.TemporaryDirectory() as tmp:
        network_map = os.path.join(tmp, "network_mapping.npz")
        rois = settings["networks"] * settings["roi_per_network"]
        np.savez(network_map, **{f"network_map_synthetic_{settings['networks']}n":
                                 np.arange(rois) // settings["roi_per_network"]})  # fmt: skip
        model = _model(settings, network_map)
    state = {k: torch.from_numpy(v) for k, v in arrays.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    wrong = [k for k in missing if not any(own in k for own in _OWN)] + list(unexpected)
    if wrong:
        raise KeyError(f"the official state dict and ours differ in {wrong[:5]}")
    model.train()
    loss, parts = model(v1, v2, [0, 0], [m1, m2])
    loss.backward()
    params = [p for p in model.parameters() if p.requires_grad]
    # (the unused LayerNorm gets no gradient)
    norms = [p.grad.norm() for p in params if p.grad is not None]
    grad_norm = float(torch.linalg.vector_norm(torch.stack(norms)))
    out = {"loss": float(loss), "cls_loss": parts["cls_loss"],
           "network_loss": parts["network_loss"], "mask_loss": parts["mask_loss"],
           "grad_norm": grad_norm}  # fmt: skip

    opt = torch.optim.AdamW(params, lr=settings["lr"], weight_decay=settings["weight_decay"])
    none = torch.zeros_like(m1)

    def step(i: int) -> float:
        start = time.perf_counter()
        opt.zero_grad()
        masks = [m1, m2] if i % 2 == 0 else [none, none]
        loss, _ = model(v1, v2, [0, 0], masks)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, max_norm=1.0)
        opt.step()
        model.update_teacher(i, settings["steps"])
        return time.perf_counter() - start

    step(0)
    step(1)  # warm-up: the first calls allocate
    times = [step(i) for i in range(2 * settings["repeats"])]
    # A masked and an unmasked step each pair: the mean of the two medians is a step's expectation.
    out["step_seconds"] = (statistics.median(times[0::2]) + statistics.median(times[1::2])) / 2
    out["torch"] = torch.__version__
    out["threads"] = torch.get_num_threads()
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
