"""Compile a run's training step ahead of time for TPU or GPU targets, on a CPU-only machine.

    devices = aot.target_devices("v5e:16x16")        # 256 abstract TPU v5e chips
    compiled = aot.compile_step(config, method, devices)
    aot.analyse(compiled, aot.device_memory("v5e:16x16"))  # per-chip bytes, FLOPs, collectives

This is what `core.train` would run, not a copy: `compile_step` takes `core.train.plan`'s jitted
step, state shardings and batch layout, and feeds it `jax.ShapeDtypeStruct`s with those shardings
(no array is materialised). Compiling, not only lowering, is the point: XLA then checks per-chip
memory ("Ran out of memory on HBM"), Mosaic checks each Pallas kernel's VMEM budget and layouts,
and Triton each GPU kernel's shared memory against the target's limits.

Needs the `aot` extra (`pip install -e ".[aot]"`: libtpu for TPU, the CUDA plugin for GPU; no
driver, no accelerator) and `JAX_PLATFORMS=cpu`, which keeps the plugins from looking for
devices (without it the CUDA topology fails with "topology not implemented for cuda").

Targets (`target_devices`):
- TPU: `<generation>:<topology>`, e.g. "v5e:2x2", "v5e:16x16", "v5p:4x4x4", "v6e:8x8"; a
  multi-slice target prefixes the slice count, "2xv5e:16x16" (devices carry `slice_index`,
  so `core.mesh` puts mesh.dcn_shape across slices).
- GPU: "h100:<slices>x<hosts>x<gpus per host>", e.g. "h100:2x4x8" = 64 GPUs, 8 per host; each
  host is one process, what `core.mesh` puts mesh.dcn_shape across.
"""

import dataclasses
import math
import os
import re

import jax
from jax.experimental import topologies
from jax.sharding import NamedSharding

from core import train
from core.errors import ConfigError
from core.method import Method

GiB = 2**30

# Per-chip HBM of each TPU generation, as the topologies report their device kinds.
TPU_HBM_BYTES = {"v4": 32 * GiB, "v5e": 16 * GiB, "v5p": 95 * GiB, "v6e": 32 * GiB}

# An H100 SXM 80 GB as XLA's GpuTargetConfigProto (the fields jaxlib 0.10.2 parses; newer XLA
# specs add collective_memory_granularity, which it rejects). What compiling checks against:
# compute capability 9.0, 132 SMs, 227 KiB opt-in shared memory per block, 80 GB of HBM.
H100_SPEC = """
gpu_device_info {
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: 3352320000000
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: 84942979072
  shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 minor: 0 }
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 10 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""
GPU_SPECS = {"h100": H100_SPEC}
GPU_MEMORY_BYTES = {"h100": 84942979072}  # device_memory_size above

_TPU_TARGET = re.compile(r"^(?:(\d+)x)?(v\d+[a-z]*):(\d+(?:x\d+)*)$")
_GPU_TARGET = re.compile(r"^([a-z]\d+):(\d+x\d+x\d+)$")


@dataclasses.dataclass(frozen=True)
class Target:
    name: str  # as given, e.g. "2xv5e:16x16"
    platform: str  # "tpu" | "gpu"
    kind: str  # TPU generation or GPU model: a key of TPU_HBM_BYTES / GPU_SPECS
    topology: str
    num_slices: int = 1


def parse_target(name: str) -> Target:
    """`name` as a Target, or a ConfigError listing the accepted forms."""
    if m := _TPU_TARGET.match(name):
        slices, kind, topology = m.groups()
        if kind not in TPU_HBM_BYTES:
            raise ConfigError(
                f"target {name!r}: unknown TPU {kind!r}; known: {sorted(TPU_HBM_BYTES)}"
            )
        return Target(name, "tpu", kind, topology, int(slices or 1))
    if m := _GPU_TARGET.match(name):
        kind, topology = m.groups()
        if kind not in GPU_SPECS:
            raise ConfigError(f"target {name!r}: unknown GPU {kind!r}; known: {sorted(GPU_SPECS)}")
        return Target(name, "gpu", kind, topology)
    raise ConfigError(
        f"target {name!r} is not <tpu>:<topology> (v5e:16x16), <slices>x<tpu>:<topology> "
        "(2xv5e:16x16) or <gpu>:<slices>x<hosts>x<gpus per host> (h100:2x4x8)"
    )


def target_devices(name: str) -> list:
    """The abstract devices of target `name` (see the module docstring): compile for them, never
    run on them."""
    target = parse_target(name)
    # Compiling needs no exclusive use of a TPU: without this, libtpu refuses to load while any
    # other process has it loaded ("Internal error when accessing libtpu multi-process lockfile").
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        if target.platform == "tpu":
            topology = topologies.get_topology_desc(
                topology_name=f"{target.kind}:{target.topology}",
                platform="tpu",
                num_slices=target.num_slices,
            )
        else:
            topology = topologies.get_topology_desc(
                "gpu", "cuda", target_config=GPU_SPECS[target.kind], topology=target.topology
            )
    except Exception as e:  # the plugin's own message, one line: missing extra, bad topology
        raise ConfigError(f"target {name!r}: {str(e).splitlines()[0]}") from None
    return list(topology.devices)


def device_memory(name: str) -> int:
    """Bytes of memory per chip of target `name`."""
    target = parse_target(name)
    table = TPU_HBM_BYTES if target.platform == "tpu" else GPU_MEMORY_BYTES
    return table[target.kind]


def abstract(tree, shardings):
    """`tree`'s leaves (arrays or ShapeDtypeStructs) as ShapeDtypeStructs carrying `shardings`
    (a matching tree, or one sharding for every leaf)."""
    if isinstance(shardings, NamedSharding):
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=shardings), tree
        )
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
    )


def compile_step(config, method: Method, devices):
    """`core.train`'s jitted training step of `config` and `method`, compiled for `devices`
    (e.g. `target_devices(...)`) with abstract inputs carrying the trainer's shardings. For a
    method that trains nothing, the program its runs execute is its eval step: that is
    compiled instead, on the batch of the split it evaluates."""
    plan = train.plan(config, method, devices=devices)
    state = abstract(plan.abstract_state, plan.state_shardings)
    batch = abstract(plan.batch_spec, plan.batch_sharding)  # None: a data-free method
    # The concrete mesh in context: Pallas TPU kernels ask it for the chip (pltpu.get_tpu_info).
    with jax.set_mesh(plan.mesh):
        if plan.step is not None:
            return plan.step.trace(state, batch).lower().compile()
        if plan.eval_step is None or batch is None:
            raise ConfigError(
                f"{config.method}: trains nothing and has no jitted eval step: nothing to compile"
            )
        rng = jax.eval_shape(lambda: jax.random.PRNGKey(0))  # as core.evaluation passes it
        return plan.eval_step.trace(state, batch, rng).lower().compile()


# ------------------------------------------------------------------------------ analysis

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2,
          "u16": 2, "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8, "c64": 8,
          "c128": 16}  # fmt: skip
_SHAPE = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+[a-z]*)?)\[([\d,]*)\]")
# "%name = <shape> <opcode>(<operands>), <attributes>": the opcode is the first lowercase word
# followed by "(" (layout tiles such as "T(8,128)" are uppercase).
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+) = (.*?) ([a-z][a-z0-9\-]*)\(")


def shape_bytes(text: str) -> int:
    """Bytes of every array shape written in `text` (HLO: "f32[8,128]{1,0}", tuples alike)."""
    total = 0.0
    for dtype, dims in _SHAPE.findall(text):
        if dtype.startswith("f8"):
            size = 1
        elif dtype in _BYTES:
            size = _BYTES[dtype]
        else:
            continue
        total += size * math.prod(int(d) for d in dims.split(",") if d)
    return int(total)


def _operands(line: str, start: int) -> list[str]:
    """Names of the operands in the parentheses opening at `line[start]` (what follows the
    closing one, e.g. to_apply=%region, is attributes)."""
    depth, end = 0, len(line)
    for i in range(start, len(line)):
        depth += {"(": 1, ")": -1}.get(line[i], 0)
        if depth == 0:
            end = i
            break
    return re.findall(r"%([\w.\-]+)", line[start:end])


def collective_bytes(hlo_text: str) -> dict[str, int]:
    """Per-chip operand bytes of each kind of collective in a compiled (SPMD-partitioned) HLO
    module's text, from the operands' defining instructions (TPU's text prints operands without
    shapes); async pairs count at their "-start". Each instruction counts once: one inside a
    loop body counts once, not per iteration."""
    shapes, found = {}, []
    for line in hlo_text.splitlines():
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        name, shape, opcode = m.groups()
        shapes[name] = shape
        kind = opcode.removesuffix("-start")
        if kind in COLLECTIVES:
            found.append((kind, _operands(line, m.end() - 1)))
    out = dict.fromkeys(COLLECTIVES, 0)
    for kind, operands in found:
        out[kind] += sum(shape_bytes(shapes.get(name, "")) for name in operands)
    return out


@dataclasses.dataclass
class Analysis:
    memory_bytes: int  # per chip: arguments + outputs - donated aliases + temporaries + code
    memory_fraction: float  # of the chip's memory
    flops: float | None  # per chip, XLA's count (None where the backend gives none: GPU)
    collectives: dict[str, int]  # per-chip operand bytes by kind (`collective_bytes`)


def analyse(compiled, chip_memory_bytes: int) -> Analysis:
    mem = compiled.memory_analysis()
    used = (
        mem.argument_size_in_bytes
        + mem.output_size_in_bytes
        - mem.alias_size_in_bytes
        + mem.temp_size_in_bytes
        + mem.generated_code_size_in_bytes
    )
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost  # older jax: one dict per program
    flops = float(cost["flops"]) if cost and "flops" in cost else None
    return Analysis(used, used / chip_memory_bytes, flops, collective_bytes(compiled.as_text()))
