"""Device meshes from config.

`config.mesh` has `shape` (one entry may be -1: filled from the device count), `axes` (names,
conventionally ("data", "fsdp", "model")), `platform` ("auto" or the backend the run expects, so a
TPU config started on a CPU box fails early), and `dcn_shape` (the across-slice / across-node part
for multi-slice TPU or multi-node GPU; empty for one slice). Axis types are always passed
explicitly as Auto: `jax.make_mesh` now defaults to Explicit, which changes how every op in a
method must be written. `make_mesh` takes the devices as an argument so that tests can hand it
fake multi-host GPU and TPU devices (tests/core/test_mesh.py).
"""

import math

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh

from core.errors import ConfigError

DATA_AXES = ("data", "fsdp")  # axes the batch dimension is split over, when present


def resolve_shape(shape, num_devices: int) -> tuple[int, ...]:
    """Replace a single -1 in `shape` so that the product equals `num_devices`."""
    shape = tuple(int(s) for s in shape)
    if shape.count(-1) > 1:
        raise ConfigError(f"mesh.shape={shape} has more than one -1; at most one axis is filled")
    if any(s == 0 or s < -1 for s in shape):
        raise ConfigError(f"mesh.shape={shape} has a non-positive size")
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if num_devices % known:
            raise ConfigError(
                f"mesh.shape={shape} does not fit {num_devices} devices: "
                f"{num_devices} is not divisible by {known}"
            )
        shape = tuple(num_devices // known if s == -1 else s for s in shape)
    if math.prod(shape) != num_devices:
        raise ConfigError(
            f"mesh.shape={shape} needs {math.prod(shape)} devices but {num_devices} are available"
        )
    return shape


def make_mesh(config, devices=None) -> Mesh:
    """The mesh described by `config` (a `config.mesh` ConfigDict) over all (or given) devices."""
    devices = jax.devices() if devices is None else list(devices)
    axes = tuple(config.axes)
    if len(axes) != len(config.shape):
        raise ConfigError(f"mesh.axes={axes} and mesh.shape={tuple(config.shape)} differ in length")
    if len(set(axes)) != len(axes):
        raise ConfigError(f"mesh.axes={axes} has a repeated name")
    platform = devices[0].platform
    if config.platform not in ("auto", platform):
        raise ConfigError(
            f"mesh.platform={config.platform!r} but JAX sees {len(devices)} {platform} devices; "
            "use a mesh preset for this machine (e.g. --config=...:mesh=cpu) or mesh.platform=auto"
        )
    dcn = tuple(int(s) for s in config.get("dcn_shape", ()) or ())
    axis_types = (AxisType.Auto,) * len(axes)
    if not dcn:
        shape = resolve_shape(config.shape, len(devices))
        return jax.make_mesh(shape, axes, axis_types=axis_types, devices=devices)
    if len(dcn) != len(axes):
        raise ConfigError(f"mesh.dcn_shape={dcn} and mesh.axes={axes} differ in length")
    if -1 in dcn:
        # The across-slice/node part is filled from whatever the per-slice part leaves over.
        if -1 in config.shape:
            raise ConfigError(
                f"mesh.shape={tuple(config.shape)} and mesh.dcn_shape={dcn} both have a -1; "
                "give the per-slice/node shape explicitly"
            )
        ici = tuple(config.shape)
        if len(devices) % math.prod(ici):
            raise ConfigError(
                f"mesh.shape={ici} does not divide the {len(devices)} devices into slices/nodes"
            )
        dcn = resolve_shape(dcn, len(devices) // math.prod(ici))
    else:
        dcn = resolve_shape(dcn, math.prod(dcn))
        if len(devices) % math.prod(dcn):
            raise ConfigError(
                f"mesh.dcn_shape={dcn} needs a multiple of {math.prod(dcn)} devices, "
                f"got {len(devices)}"
            )
        ici = resolve_shape(config.shape, len(devices) // math.prod(dcn))
    # The granules of the slow network. A TPU slice has its own slice_index. On a real GPU
    # cluster XLA gives the devices of one host one slice_index (hosts told apart by boot id:
    # BuildGlobalTopology in xla/pjrt/distributed/topology_util.cc; JAX_PARTITION_INDEX
    # overrides it), so a granule is a node whether it runs one process or one per GPU. A GPU
    # target description compiled ahead of time (core.aot) has slice_index 0 everywhere and one
    # process per host: there, and on CPU (no slice_index: several processes on one machine),
    # processes are the granules.
    slices = {getattr(d, "slice_index", None) for d in devices}
    by_process = None in slices or (devices[0].platform != "tpu" and len(slices) == 1)
    granules = (
        len({d.process_index for d in devices})
        if by_process
        else len({d.slice_index for d in devices})
    )
    if granules != math.prod(dcn):
        kind = "processes" if by_process else "hosts" if platform == "gpu" else "slices"
        raise ConfigError(
            f"mesh.dcn_shape={dcn} needs {math.prod(dcn)} {kind}, but the devices span {granules}"
        )
    grid = mesh_utils.create_hybrid_device_mesh(
        ici, dcn, devices=devices, process_is_granule=by_process
    )
    return Mesh(np.asarray(grid), axes, axis_types=axis_types)


def data_axes(mesh: Mesh) -> tuple[str, ...]:
    """The mesh axes the batch dimension is sharded over."""
    return tuple(a for a in DATA_AXES if a in mesh.axis_names)


def data_parallel_size(mesh: Mesh) -> int:
    return math.prod(mesh.shape[a] for a in data_axes(mesh))


def traced_platform() -> str:
    """The platform being traced for: that of the mesh in context (`core.train` traces every
    step with its mesh, so compiling ahead of time for TPU or GPU devices from a CPU machine
    picks those devices' kernels and attention), else the default backend."""
    device = jax.sharding.get_abstract_mesh().abstract_device
    return jax.default_backend() if device is None else device.platform
