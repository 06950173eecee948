"""Compile a config's training step for a TPU or GPU target from this (CPU) machine.

    JAX_PLATFORMS=cpu python -m launch.aot --config=configs/lm.py:size=base --target=v5e:16x16
    JAX_PLATFORMS=cpu python -m launch.aot --table     # every method's largest config, markdown

The table compiles each configs/<slug>.py's declared largest config (`DECLARATIONS.largest` and
its overrides, `core.declarations`: the overrides make the global batch divide over 256 chips
where the config's own is smaller; each is named in the table); no list of methods is kept here.
A method that trains nothing has its eval step compiled (`core.aot.compile_step`).

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


def for_target(config, target: str):
    """`config` made for `target`: its mesh and the target platform's "auto" dtype."""
    from core import aot
    from core.precision import compute_dtype

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


def compile_config(method: str, text: str, config, make, target: str) -> Row:
    """Compile `config`'s program (`core.aot.compile_step`: the training step, or the eval step
    of a method that trains nothing) for `target`, the Method from `make(config)`; `text` names
    the config in the table."""
    from core import aot

    devices = aot.target_devices(target)
    config = for_target(config, target)
    start = time.perf_counter()
    compiled = aot.compile_step(config, make(config), devices)
    seconds = time.perf_counter() - start
    analysis = aot.analyse(compiled, aot.device_memory(target))
    return Row(method, text, target, len(devices), analysis, seconds)


def compile_for(entry, arg: str, overrides: dict, target: str) -> Row:
    """Compile config `arg` (+ `overrides`, dotted field -> value) of `entry` (a
    `core.declarations.Entry`) for `target`: e.g. `*entry.largest` or `*entry.aot_smoke`."""
    text = entry.spec(arg) + "".join(f" {k}={v}" for k, v in overrides.items())
    return compile_config(entry.name, text, entry.config(arg, overrides), entry.method, target)


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
    """The scaling table's lines, each row as soon as it is compiled (minutes on 2 cores): every
    config's declared largest variant (`core.declarations`), in the order of the slugs."""
    from core import declarations

    yield from markdown([]).splitlines()
    for entry in declarations.entries():
        for target in targets:
            yield markdown([compile_for(entry, *entry.largest, target)]).splitlines()[-1]


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
        import methods
        from launch.config_cli import load

        config = load(_CONFIG.value)
        row = compile_config(config.method, _CONFIG.value, config, methods.make, _TARGET.value)
        print(markdown([row]))
    except ConfigError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    app.run(main)
