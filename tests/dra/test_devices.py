"""GPU and NIC device entries built from the topology model: names the
reference drivers use, API rules, and partitions that the counters keep
apart."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from toposerve.dra_driver.gpu.devices import PARTITIONS_LABEL, gpu_pool, partitions_wanted
from toposerve.dra_driver.net.devices import nic_pool
from toposerve.dra_driver.resourceslice import slice_plan
from toposerve.topology.config_file import ConfigError, load_file
from toposerve.topology.model import DomainPath, NodeTopology
from toposerve.topology.profiles import HardwareProfile, bundled_names, load_profile
from toposerve.topology.quantity import parse_quantity
from toposerve.topology.slice_attributes import check_entry

PATH = DomainPath(zone="zone-0", block="b0", rack="b0-r0", nvlink="b0-r0-n0", host="node-a")


def _node(profile: str) -> NodeTopology:
    return NodeTopology(name="node-a", path=PATH, profile=profile,
                        hardware=load_profile(profile).hardware())


def _attr(dev: Mapping[str, Any], key: str) -> Any:
    return next(iter(dev["attributes"][key].values()))


@pytest.mark.parametrize("profile", bundled_names())
def test_every_entry_follows_the_api(profile: str) -> None:
    for pool in (gpu_pool(_node(profile)), nic_pool(_node(profile))):
        assert pool.name == pool.node_name == "node-a"
        names = [d["name"] for d in pool.devices]
        assert len(set(names)) == len(names)
        for d in pool.devices:
            check_entry(dict(d))
            assert len(d.get("consumesCounters", ())) <= 2
        for cs in pool.shared_counters:
            assert len(cs["counters"]) <= 32


def test_gpu_attributes_use_nvidia_names() -> None:
    pool = gpu_pool(_node("hgx-h100"), driver_version="570.124.06")
    gpus = [d for d in pool.devices if _attr(d, "type") == "gpu"]
    assert [d["name"] for d in gpus] == [f"gpu-{i}" for i in range(8)]
    g = gpus[3]
    assert _attr(g, "index") == 3 and _attr(g, "minor") == 3
    assert g["attributes"]["driverVersion"] == {"version": "570.124.6"}
    assert g["attributes"]["cudaComputeCapability"] == {"version": "9.0.0"}
    assert _attr(g, "productName") == "NVIDIA H100 80GB HBM3"
    assert _attr(g, "architecture") == "Hopper" and _attr(g, "brand") == "Nvidia"
    assert _attr(g, "uuid").startswith("GPU-")
    assert g["capacity"]["memory"] == {"value": "80Gi"}
    for key in ("pcieSwitch", "nvlinkDomain", "rack", "block", "zone",
                "resource.kubernetes.io/pcieRoot", "resource.kubernetes.io/pciBusID",
                "resource.kubernetes.io/numaNode"):
        assert key in g["attributes"], key
    assert _attr(g, "nvlinkDomain") == "b0-r0-n0"
    # another node, same PCI address: another UUID; the same node again: the same
    other = NodeTopology(name="node-b", path=PATH, profile="hgx-h100",
                         hardware=load_profile("hgx-h100").hardware())
    assert _attr(gpu_pool(other).devices[3], "uuid") != _attr(g, "uuid")
    assert _attr(gpu_pool(_node("hgx-h100")).devices[3], "uuid") == _attr(g, "uuid")
    # AMD has no CUDA
    amd = gpu_pool(_node("mi300x")).devices[0]
    assert "cudaComputeCapability" not in amd["attributes"]
    assert _attr(amd, "architecture") == "CDNA3"


def _slices(consumption: dict[str, Any]) -> set[str]:
    return {k for k in consumption["counters"] if k.startswith("memory-slice-")}


def test_partitions_share_the_gpus_counters() -> None:
    pool = gpu_pool(_node("hgx-h100"))
    assert len(pool.shared_counters) == 8
    by_set = {cs["name"]: cs["counters"] for cs in pool.shared_counters}
    parts = [d for d in pool.devices if _attr(d, "type") == "mig"]
    assert len(parts) == 8 * (7 + 2)
    assert {d["name"] for d in parts if _attr(d, "index") == 0} == {
        *(f"gpu-0-1g10gb-{i}" for i in range(7)), "gpu-0-3g40gb-0", "gpu-0-3g40gb-4"}
    wholes = {d["name"]: d for d in pool.devices if _attr(d, "type") == "gpu"}
    for d in parts:
        (use,) = d["consumesCounters"]
        have = by_set[use["counterSet"]]
        whole = wholes[f"gpu-{_attr(d, 'index')}"]
        (whole_use,) = whole["consumesCounters"]
        assert whole_use["counterSet"] == use["counterSet"]
        assert _attr(d, "parentUUID") == _attr(whole, "uuid")
        # the whole GPU takes every counter there is, so no partition fits beside it
        assert whole_use["counters"] == have
        for k, v in use["counters"].items():
            assert parse_quantity(v["value"]) <= parse_quantity(have[k]["value"])
    # two partitions of one GPU fit together exactly when their memory slices do not overlap
    gpu0 = [d for d in parts if _attr(d, "index") == 0]
    for a, b in itertools.combinations(gpu0, 2):
        (ua,), (ub,) = a["consumesCounters"], b["consumesCounters"]
        overlap = bool(_slices(ua) & _slices(ub))
        fits = all(parse_quantity(ua["counters"][k]["value"]) +
                   parse_quantity(ub["counters"].get(k, {"value": "0"})["value"])
                   <= parse_quantity(v["value"]) for k, v in by_set["gpu-0-counters"].items()
                   if k in ua["counters"])
        assert fits == (not overlap), (a["name"], b["name"])


def test_partitioned_pool_splits_into_counter_and_device_slices() -> None:
    pool = gpu_pool(_node("hgx-h100"))
    parts = slice_plan.split(pool)
    assert [(k, len(c)) for k, c in parts] == [("sharedCounters", 8), ("devices", 64),
                                               ("devices", 16)]
    plain = gpu_pool(_node("mi300x"))
    assert [(k, len(c)) for k, c in slice_plan.split(plain)] == [("devices", 8)]


def test_partitions_off_publishes_whole_gpus_only() -> None:
    assert partitions_wanted({}) and partitions_wanted({PARTITIONS_LABEL: "on"})
    assert not partitions_wanted({PARTITIONS_LABEL: "off"})
    full, whole = gpu_pool(_node("hgx-h100")), gpu_pool(_node("hgx-h100"), partitions=False)
    assert [d["name"] for d in whole.devices] == [f"gpu-{i}" for i in range(8)]
    assert whole.shared_counters == ()
    assert all("consumesCounters" not in d for d in whole.devices)
    # the same GPUs otherwise: names, UUIDs and placement attributes
    for a, b in zip(full.devices[:8], whole.devices, strict=True):
        assert a["attributes"] == b["attributes"]
    assert [(k, len(c)) for k, c in slice_plan.split(whole)] == [("devices", 8)]


def test_nic_attributes_use_dranet_names() -> None:
    node = _node("hgx-h100")
    nics = nic_pool(node).devices
    assert [d["name"] for d in nics] == [f"nic-{i}" for i in range(8)]
    n = nics[0]
    for key in ("ifName", "pciAddress", "mac", "mtu", "rdma", "rdmaDevice", "sriov",
                "isSriovVf", "virtual", "numaNode", "pciVendor", "pciDevice"):
        assert key in n["attributes"], key
    assert _attr(n, "rdma") is True and _attr(n, "rdmaDevice") == "mlx5_0"
    assert _attr(n, "pciVendor") == "Mellanox Technologies"
    assert n["capacity"]["linkSpeed"] == {"value": "400G"}
    # the NIC behind gpu-0's switch shares its PCIe root and switch
    gpu0 = gpu_pool(node).devices[0]
    for key in ("resource.kubernetes.io/pcieRoot", "pcieSwitch"):
        assert _attr(n, key) == _attr(gpu0, key)


def _profile(tmp_path: Path, partitions: Mapping[str, Any]) -> Path:
    doc = yaml.safe_load((Path(__file__).parents[2] / "topology/profiles/hgx-h100.yaml")
                         .read_text())
    doc["spec"]["models"]["gpu"]["partitions"] = partitions
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(doc))
    return f


def test_bad_partitions_are_a_clear_error(tmp_path: Path) -> None:
    ok: dict[str, Any] = {"memorySlices": 8, "multiprocessors": 132, "profiles": [
        {"name": "1g.10gb", "memory": "10Gi", "multiprocessors": 16, "memorySlices": 1,
         "placements": [0]}]}
    assert load_file(str(_profile(tmp_path, ok)), HardwareProfile, "HardwareProfile")
    bad = {**ok, "profiles": [{**ok["profiles"][0], "placements": [7], "memorySlices": 2}]}
    with pytest.raises(ConfigError, match="placement 7"):
        load_file(str(_profile(tmp_path, bad)), HardwareProfile, "HardwareProfile")
    bad = {**ok, "profiles": [{**ok["profiles"][0], "memory": "100Gi"}]}
    with pytest.raises(ConfigError, match="more than the GPU"):
        load_file(str(_profile(tmp_path, bad)), HardwareProfile, "HardwareProfile")
