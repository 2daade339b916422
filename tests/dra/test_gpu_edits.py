"""The GPU driver's pure parts: GpuConfig validation and merging, and the
CDI edits for NVIDIA and AMD nodes from the topology model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from toposerve.dra_driver.gpu.config import GpuConfig
from toposerve.dra_driver.gpu.devices import gpu_pool
from toposerve.dra_driver.gpu.edits import gpu_edits, resolve
from toposerve.dra_driver.kubeletplugin import merge_opaque, parse_opaque
from toposerve.dra_driver.net.config import NetConfig
from toposerve.topology.model import DomainPath, NodeTopology
from toposerve.topology.profiles import load_profile

CFG = {"apiVersion": "gpu.toposerve.io/v1", "kind": "GpuConfig"}
DEFAULT = GpuConfig()


def parse_gpu_config(parameters: dict[str, Any]) -> GpuConfig:
    return parse_opaque(parameters, GpuConfig)


@pytest.mark.parametrize("params, message", [
    ({**CFG, "nicAlignment": "rack"}, "nicAlignment: Input should be 'switch', 'root'"),
    ({**CFG, "topologyEnv": "maybe"}, "topologyEnv: Input should be a valid boolean"),
    ({**CFG, "nicAligment": "root"}, "nicAligment: Extra inputs are not permitted (unknown field"),
    ({**CFG, "env": {"1BAD": "x"}}, "env: Value error, not an environment variable name: 1BAD"),
    ({**CFG, "kind": "NicConfig"}, "kind: expected 'GpuConfig', got 'NicConfig'"),
    ({"kind": "GpuConfig"}, "apiVersion: expected 'gpu.toposerve.io/v1', got None"),
    ({**CFG, "apiVersion": "net.toposerve.io/v1"},
     "apiVersion: expected 'gpu.toposerve.io/v1', got 'net.toposerve.io/v1'"),
])
def test_bad_config_names_the_field(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_gpu_config(params)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_merge_later_wins_env_accumulates() -> None:
    cls = parse_gpu_config({**CFG, "nicAlignment": "numa", "env": {"A": "class", "B": "b"}})
    claim = parse_gpu_config({**CFG, "topologyEnv": False, "env": {"A": "claim"}})
    # another driver's config among them is not this one's to merge
    got = merge_opaque([cls, NetConfig(mtu=9000), claim], GpuConfig)
    assert (got.nic_alignment, got.topology_env, got.env) == (
        "numa", False, {"A": "claim", "B": "b"})
    assert merge_opaque([], GpuConfig) == DEFAULT


def test_the_old_api_version_is_still_accepted() -> None:
    """``toposerve.io/v1`` (before the group matched the driver's name) is a
    deprecated alias: claims written with it keep working."""
    old = parse_gpu_config({**CFG, "apiVersion": "toposerve.io/v1", "nicAlignment": "root"})
    assert old == parse_gpu_config({**CFG, "nicAlignment": "root"}) != DEFAULT


def test_fields_are_camel_case_on_the_wire_and_snake_case_in_python() -> None:
    cfg = GpuConfig(topology_env=False, nic_alignment="numa")
    assert cfg.model_dump(mode="json") == {"topologyEnv": False, "nicAlignment": "numa",
                                           "env": {}}
    assert parse_gpu_config({**CFG, **cfg.model_dump(mode="json")}) == cfg


def _node(profile: str) -> NodeTopology:
    return NodeTopology(name="n1", path=DomainPath(host="n1", rack="r1"), profile=profile,
                        hardware=load_profile(profile).hardware())


def _dev_root(tmp: Path, names: list[str]) -> Path:
    for n in names:
        (tmp / n).parent.mkdir(parents=True, exist_ok=True)
        (tmp / n).touch()
    return tmp


def test_nvidia_edits(tmp_path: Path) -> None:
    node = _node("hgx-h100")
    pool = {d["name"]: d for d in gpu_pool(node).devices}
    gpus = resolve(["gpu-0", "gpu-1"], pool, node.hardware)
    dev = _dev_root(tmp_path, ["nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm",
                               "nvidia-uvm-tools"])
    edits = gpu_edits(gpus, node.hardware, DEFAULT, dev)
    assert [n.path for n in edits.devices["gpu-1"].device_nodes] == ["/dev/nvidia1"]
    assert edits.devices["gpu-1"].device_nodes[0].host_path == str(dev / "nvidia1")
    env = edits.common.env
    uuids = [pool[g]["attributes"]["uuid"]["string"] for g in ("gpu-0", "gpu-1")]
    assert env["NVIDIA_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"] == ",".join(uuids)
    place = node.hardware.place("gpu-0")
    assert env["TOPOSERVE_GPU_NUMA_NODES"] == str(place.numa)
    assert env["TOPOSERVE_GPU_PCIE_ROOTS"] == place.root
    # the two NICs behind the GPUs' PCIe switch, not the other six
    nics = [p.device for p in node.hardware.places()
            if p.switch == place.switch and p.device.interface]
    assert env["TOPOSERVE_NICS"] == ",".join(n.interface or "" for n in nics) and len(nics) == 2
    assert env["TOPOSERVE_RDMA_DEVICES"] == ",".join(n.rdma_device or "" for n in nics)
    assert sorted(n.path for n in edits.common.device_nodes) == [
        "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl"]
    assert edits.data["gpu-0"]["pciBusID"] == place.device.pci_bus_id


def test_amd_edits_and_missing_device_node(tmp_path: Path) -> None:
    node = _node("mi300x")
    pool = {d["name"]: d for d in gpu_pool(node).devices}
    gpus = resolve(["gpu-3", "gpu-5"], pool, node.hardware)
    with pytest.raises(ValueError, match=r"device node .*dri/card3 does not exist"):
        gpu_edits(gpus, node.hardware, DEFAULT, tmp_path)
    dev = _dev_root(tmp_path, ["kfd", "dri/card3", "dri/renderD131", "dri/card5",
                               "dri/renderD133"])
    cfg = parse_gpu_config({**CFG, "nicAlignment": "none", "env": {"NCCL_DEBUG": "INFO"}})
    edits = gpu_edits(gpus, node.hardware, cfg, dev)
    env = edits.common.env
    assert (env["AMD_VISIBLE_DEVICES"], env["ROCR_VISIBLE_DEVICES"],
            env["HIP_VISIBLE_DEVICES"]) == ("3,5", "0,1", "0,1")
    assert "NVIDIA_VISIBLE_DEVICES" not in env and env["NCCL_DEBUG"] == "INFO"
    assert env["TOPOSERVE_NICS"] == ""
    assert [n.path for n in edits.devices["gpu-5"].device_nodes] == [
        "/dev/dri/card5", "/dev/dri/renderD133"]


def test_partition_edits(tmp_path: Path) -> None:
    node = _node("hgx-h100")
    pool = {d["name"]: d for d in gpu_pool(node).devices}
    part = next(n for n, d in pool.items() if "parentUUID" in d["attributes"]
                and d["attributes"]["index"]["int"] == 2)
    (gpu,) = resolve([part], pool, node.hardware)
    assert gpu.partition and gpu.index == 2 and gpu.visible_id.startswith("MIG-")
    assert gpu.visible_id == resolve([part], pool, node.hardware)[0].visible_id  # stable
    dev = _dev_root(tmp_path, ["nvidia2", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"])
    edits = gpu_edits([gpu], node.hardware, DEFAULT, dev)
    assert [n.path for n in edits.devices[part].device_nodes] == ["/dev/nvidia2"]
    assert edits.common.env["NVIDIA_VISIBLE_DEVICES"] == gpu.visible_id
