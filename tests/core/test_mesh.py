"""Multi-host meshes from fake devices: which devices share a data-parallel row across the slow
network (DCN) on GPU nodes and TPU slices. The CPU tests' devices have no slice_index, so
multi-process CPU runs take the by-process branch; these fakes carry what real GPU and TPU
devices carry, so the by-slice branch that GPU clusters and TPU pods take is tested here."""

import dataclasses
import itertools

import pytest

from configs.common import mesh_config
from core.errors import ConfigError
from core.mesh import make_mesh


@dataclasses.dataclass(frozen=True)
class FakeDevice:
    """The attributes make_mesh and jax's mesh_utils read. Not a tuple: numpy would unpack it."""

    id: int
    process_index: int
    slice_index: int
    platform: str = "gpu"
    device_kind: str = "NVIDIA H100 80GB HBM3"
    coords: tuple = ()
    core_on_chip: int = 0


def gpu_cluster(nodes, gpus_per_node, node_of_process, processes):
    """Devices in jax.devices() order: by process, each process's local GPUs in turn. XLA gives
    every device of one host the same slice_index; `node_of_process` is Slurm's task layout."""
    per_process = nodes * gpus_per_node // processes
    return [
        FakeDevice(id=p * per_process + k, process_index=p, slice_index=node_of_process(p))
        for p in range(processes)
        for k in range(per_process)
    ]


LAYOUTS = {
    # srun's default block distribution, one process per GPU: tasks 0-7 on node 0.
    "process_per_gpu_block": dict(node_of_process=lambda p: p // 8, processes=16),
    # --distribution=cyclic: tasks alternate nodes, so a node's devices are not contiguous ids.
    "process_per_gpu_cyclic": dict(node_of_process=lambda p: p % 2, processes=16),
    # One process per node driving its 8 GPUs.
    "process_per_node": dict(node_of_process=lambda p: p, processes=2),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gpu_nodes_are_the_data_rows_of_the_multinode_mesh(layout):
    devices = gpu_cluster(nodes=2, gpus_per_node=8, **LAYOUTS[layout])
    mesh = make_mesh(mesh_config("gpu_multinode"), devices)
    assert dict(mesh.shape) == {"data": 2, "fsdp": 8, "model": 1}
    for row in range(2):
        # Row r of the DCN axis is node r: FSDP's all-gathers stay on one node's NVLink and
        # only the data-parallel gradient all-reduce crosses the network.
        assert {d.slice_index for d in mesh.devices[row].flat} == {row}
    assert sorted(d.id for d in mesh.devices.flat) == list(range(16))


def test_gpu_mesh_counts_hosts_not_processes():
    # 4 nodes of 4 GPUs under the 8-GPU preset: the -1 asks for 16 / 8 = 2 nodes.
    devices = gpu_cluster(4, 4, node_of_process=lambda p: p // 4, processes=16)
    config = mesh_config("gpu_multinode")
    with pytest.raises(ConfigError, match=r"dcn_shape=\(2, 1, 1\) needs 2 hosts, .* span 4$"):
        make_mesh(config, devices)
    config.shape = (1, 4, 1)
    mesh = make_mesh(config, devices)
    assert dict(mesh.shape) == {"data": 4, "fsdp": 4, "model": 1}
    assert [{d.slice_index for d in row.flat} for row in mesh.devices] == [{0}, {1}, {2}, {3}]


def tpu_v4_slices(num_slices):
    """v4-16 slices: 8 chips in a 2x2x2 cube, 4 chips per host, one process per host."""
    devices = []
    for s, (x, y, z) in itertools.product(range(num_slices), itertools.product(range(2), repeat=3)):
        i = len(devices)
        devices.append(
            FakeDevice(i, i // 4, s, platform="tpu", device_kind="TPU v4", coords=(x, y, z))
        )
    return devices


def test_tpu_slices_are_the_data_rows_of_the_multislice_mesh():
    devices = tpu_v4_slices(2)  # 4 processes, 2 slices: granules must be slices
    mesh = make_mesh(mesh_config("tpu_multislice"), devices)
    assert dict(mesh.shape) == {"data": 2, "fsdp": 8, "model": 1}
    assert [{d.slice_index for d in row.flat} for row in mesh.devices] == [{0}, {1}]
    with pytest.raises(ConfigError, match=r"needs 2 slices, but the devices span 3$"):
        make_mesh(mesh_config("tpu_multislice"), tpu_v4_slices(3))
