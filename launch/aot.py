"""Compile a config's training step for a TPU or GPU target from this (CPU) machine.

    JAX_PLATFORMS=cpu python -m launch.aot --config=configs/lm.py:size=base --target=v5e:16x16
    JAX_PLATFORMS=cpu python -m launch.aot --table     # every method's largest config, markdown

Needs the `aot` extra (`pip install -e ".[aot]"`). Targets are `core.aot`'s: "v5e:2x2",
"v5e:16x16", "2xv5e:16x16" (two slices), "h100:2x4x8" (64 GPUs, 8 per host). The mesh comes
from the target (`target_mesh`): FSDP over the chips of a slice or a host, data parallel across
slices or hosts, so `train.batch_size` must divide over all chips; "auto" dtype is the target's
(bfloat16) and "auto" kernels are its Pallas kernels. The printed per-chip memory counts
arguments, outputs, temporaries and code, less donated buffers; FLOPs are XLA's count per chip
(TPU only: the GPU compiler gives none); collectives are the per-chip operand bytes of each
collective instruction in the compiled program (one inside a loop counted once).
"""

import dataclasses
import os
import sys
import time

from absl import app, flags

from configs.common import mesh_config
from core.errors import ConfigError

# Each method's largest config, as compiled for the scaling table and the large targets in
# tests/aot. Overrides make the global batch divide over 256 chips (and 64 GPUs) where the
# config's own is smaller; each is named in the table.
LARGEST = {
    "lm": ("configs/lm.py:size=base", {}),
    "selective_rope": ("configs/selective_rope.py:size=small", {"train.batch_size": 256}),
    "nab": ("configs/nab.py:size=paper,views=256", {}),
    "tpc": ("configs/tpc.py:size=paper", {}),
    "rlcr": ("configs/rlcr.py:size=small", {"train.batch_size": 256}),
    "csnn": ("configs/csnn.py", {"data.side": 128, "train.batch_size": 128**2}),
    "deql": ("configs/deql.py", {}),
    "soft_thinking": ("configs/soft_thinking.py:size=full", {"train.batch_size": 256}),
    "flow_mtp": ("configs/flow_mtp.py:size=toy", {"train.batch_size": 256}),
    "vwf_dyslexia": ("configs/vwf_dyslexia.py:size=small", {"train.batch_size": 256}),
    "dupa": ("configs/dupa.py:size=full,arm=dupa", {"train.batch_size": 256}),
    # The digits MLP: the 2-D functions have no batch, so nothing to spread over chips.
    "doit": ("configs/doit.py:size=full,task=digits", {"train.batch_size": 256}),
    # One round per step in the full run; 256 rounds per step over 8 steps: T = 2048.
    "hybrid_online": (
        "configs/hybrid_online.py:size=full",
        {"train.batch_size": 256, "train.steps": 8},
    ),
}

SMOKE = {name: (spec.split(":")[0] + ":size=smoke", {}) for name, (spec, _) in LARGEST.items()}
SMOKE["doit"] = ("configs/doit.py:size=smoke,task=digits", {})  # the 2-D functions have no batch
TABLE_TARGETS = ("v5e:16x16", "h100:2x4x8")

_CONFIG = flags.DEFINE_string("config", None, "configs/<slug>.py[:arg], as launch.train's")
_TARGET = flags.DEFINE_string("target", "v5e:2x2", "a core.aot target")
_TABLE = flags.DEFINE_bool("table", False, "Print the scaling table of every method instead.")


def target_mesh(target: str):
    """The mesh config for `target`: a `configs.common` preset with the slices' or hosts'
    count as its DCN part."""
    from core import aot

    t = aot.parse_target(target)
    if t.platform == "gpu":
        slices, hosts, per_host = (int(n) for n in t.topology.split("x"))
        mesh = mesh_config("gpu_multinode")
        mesh.shape, mesh.dcn_shape = (1, per_host, 1), (slices * hosts, 1, 1)
    elif t.num_slices > 1:
        mesh = mesh_config("tpu_multislice")
        mesh.dcn_shape = (t.num_slices, 1, 1)
    else:
        mesh = mesh_config("tpu")
    return mesh


def target_config(spec: str, overrides: dict, target: str):
    """The config `spec` (+ `overrides`, dotted field -> value) made for `target`: its mesh and
    the target platform's "auto" dtype."""
    from core import aot
    from core.precision import compute_dtype
    from launch.config_cli import load

    config = load(spec)
    for field, value in overrides.items():
        *parents, leaf = field.split(".")
        node = config
        for name in parents:
            node = node[name]
        node[leaf] = value
    config.mesh = target_mesh(target)
    config.dtype = compute_dtype(config.dtype, platform=aot.parse_target(target).platform)
    return config


@dataclasses.dataclass
class Row:
    method: str
    config: str  # spec and overrides
    target: str
    chips: int
    analysis: object  # core.aot.Analysis
    compile_seconds: float


def compile_for(method: str, spec: str, overrides: dict, target: str) -> Row:
    """Compile `spec`'s training step for `target`; the analysis and the compile time."""
    import methods
    from core import aot

    devices = aot.target_devices(target)
    config = target_config(spec, overrides, target)
    start = time.perf_counter()
    compiled = aot.compile_step(config, methods.make(config), devices)
    seconds = time.perf_counter() - start
    analysis = aot.analyse(compiled, aot.device_memory(target))
    text = spec + "".join(f" {k}={v}" for k, v in overrides.items())
    return Row(method, text, target, len(devices), analysis, seconds)


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def markdown(rows: list[Row]) -> str:
    """The scaling table: one row per (method, target)."""
    from core.aot import COLLECTIVES

    short = {"all-reduce": "AR", "all-gather": "AG", "reduce-scatter": "RS",
             "all-to-all": "A2A", "collective-permute": "CP"}  # fmt: skip
    lines = [
        "| method | config | target (chips) | TFLOP/step/chip | memory/chip (of HBM) | "
        "collective bytes/chip | compile s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        a = r.analysis
        flops = "n/a (GPU)" if a.flops is None else f"{a.flops / 1e12:.3g}"
        coll = ", ".join(
            f"{short[k]} {_size(a.collectives[k])}" for k in COLLECTIVES if a.collectives[k]
        )
        lines.append(
            f"| {r.method} | `{r.config}` | {r.target} ({r.chips}) | {flops} | "
            f"{_size(a.memory_bytes)} ({a.memory_fraction:.1%}) | {coll or 'none'} | "
            f"{r.compile_seconds:.1f} |"
        )
    return "\n".join(lines)


def table(targets=TABLE_TARGETS):
    """The scaling table's lines, each row as soon as it is compiled (minutes on 2 cores)."""
    yield from markdown([]).splitlines()
    for method, (spec, overrides) in LARGEST.items():
        for target in targets:
            yield markdown([compile_for(method, spec, overrides, target)]).splitlines()[-1]


def main(argv):
    del argv
    if os.environ.get("JAX_PLATFORMS") != "cpu":
        sys.exit(
            "error: run with JAX_PLATFORMS=cpu (the TPU/GPU plugins must not look for devices)"
        )
    try:
        if _TABLE.value:
            for line in table():
                print(line, flush=True)
            return
        if not _CONFIG.value:
            sys.exit("error: give --config=configs/<slug>.py[:arg] or --table")
        from launch.config_cli import load

        method = load(_CONFIG.value).method
        print(markdown([compile_for(method, _CONFIG.value, {}, _TARGET.value)]))
    except ConfigError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    app.run(main)
