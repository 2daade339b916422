"""GPU memory as consumable capacity (``--memory-shares``): what a
shareable GPU's slice entry holds and why the apiserver accepts it, what a
claim's shares are read as, and what the container is told of its share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from toposerve.dra_driver.gpu.config import GpuConfig
from toposerve.dra_driver.gpu.devices import SHARE_STEP, gpu_pool, memory_share_policy
from toposerve.dra_driver.gpu.edits import gpu_edits, memory_grants, resolve
from toposerve.dra_driver.kubeletplugin.claims import ClaimError, allocated_devices
from toposerve.dra_driver.kubeletplugin.device_kind import AllocatedDevice, ClaimRef
from toposerve.dra_driver.resourceslice import slice_plan
from toposerve.topology.model import DomainPath, NodeTopology
from toposerve.topology.profiles import load_profile
from toposerve.topology.quantity import parse_quantity
from toposerve.topology.slice_attributes import check_entry

GI = 2**30
SHARE_A = "0b7c5a52-4a4e-4f57-9a8f-1d2c3b4a5e6f"
SHARE_B = "6e1d8f0a-2b3c-4d5e-8f90-a1b2c3d4e5f6"


def _node(profile: str = "hgx-h100") -> NodeTopology:
    return NodeTopology(name="n1", path=DomainPath(host="n1", rack="r1"), profile=profile,
                        hardware=load_profile(profile).hardware())


def _apiserver_accepts(capacity: dict[str, Any]) -> None:
    """The apiserver's rules for a multi-allocatable device's capacity
    (validateRequestPolicyRange, integer path), restated."""
    value = parse_quantity(capacity["value"])
    policy = capacity["requestPolicy"]
    default = parse_quantity(policy["default"])
    lo = parse_quantity(policy["validRange"]["min"])
    step = parse_quantity(policy["validRange"]["step"])
    assert "validValues" not in policy  # one of validValues / validRange
    assert step > 0 and lo <= value and lo + step <= value
    assert lo <= default <= value and (default - lo) % step == 0


def test_shareable_gpus_are_whole_multi_allocatable_and_unpartitioned() -> None:
    pool = gpu_pool(_node(), memory_shares=True)
    assert [d["name"] for d in pool.devices] == [f"gpu-{i}" for i in range(8)]
    assert pool.shared_counters == ()  # hgx-h100 has MIG partitions: left out
    for d in pool.devices:
        check_entry(dict(d))
        assert d["allowMultipleAllocations"] is True
        assert "consumesCounters" not in d
        # every capacity of a shareable device needs a policy: one without is
        # consumed whole by each share (the allocator's fillEmptyRequest)
        assert list(d["capacity"]) == ["memory"]
        memory = d["capacity"]["memory"]
        assert memory == {"value": "80Gi", "requestPolicy": {
            "default": "80Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}}
        _apiserver_accepts(memory)
    # the publisher cuts it as any pool of whole devices: one slice
    assert [(k, len(c)) for k, c in slice_plan.split(pool)] == [("devices", 8)]


def test_without_the_option_nothing_is_shareable() -> None:
    pool = gpu_pool(_node())
    assert not any("allowMultipleAllocations" in d for d in pool.devices)
    assert not any("requestPolicy" in c for d in pool.devices
                   for c in (d.get("capacity") or {}).values())


@pytest.mark.parametrize("memory, default", [
    (80 * GI, "80Gi"),
    (81559 * 2**20, "79Gi"),  # what NVML reports of an H100 80GB: a step short of 80Gi
    (2 * GI, "2Gi"),
])
def test_policy_default_is_all_the_whole_steps(memory: int, default: str) -> None:
    policy = memory_share_policy(memory)
    assert policy is not None and policy["default"] == default
    _apiserver_accepts({"value": str(memory), "requestPolicy": policy})
    # what is left beside the default is under one step, the smallest share:
    # a claim that asks no memory keeps the GPU to itself
    assert memory - parse_quantity(default) < SHARE_STEP


def test_a_gpu_under_two_steps_stays_exclusive() -> None:
    assert memory_share_policy(SHARE_STEP + SHARE_STEP // 2) is None


def _claim(results: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"uid": "u1"}, "status": {"allocation": {"devices": {
        "results": results}}}}


def _share(device: str, share: str, memory: str, request: str = "gpu") -> dict[str, Any]:
    return {"request": request, "driver": "gpu.toposerve.io", "pool": "n1", "device": device,
            "shareID": share, "consumedCapacity": {"memory": memory}}


def _allocated(results: list[dict[str, Any]]) -> list[AllocatedDevice]:
    return allocated_devices(_claim(results), ClaimRef("ns", "c", "u1"), "gpu.toposerve.io",
                             "n1", {"n1"}, lambda p: p)


def test_a_share_is_read_with_its_id_and_consumed_capacity() -> None:
    got = _allocated([_share("gpu-0", SHARE_A, "30Gi")])
    assert [(d.device, d.share_id, dict(d.consumed)) for d in got] == [
        ("gpu-0", SHARE_A, {"memory": "30Gi"})]


def test_a_share_id_not_of_the_uid_format_fails_the_claim() -> None:
    with pytest.raises(ClaimError, match=r"shareID '\.\./x' is not a Kubernetes UID"):
        _allocated([_share("gpu-0", "../x", "30Gi")])


def _dev_root(tmp: Path) -> Path:
    for n in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"):
        (tmp / n).touch()
    return tmp


def test_the_container_is_told_its_memory_per_gpu(tmp_path: Path) -> None:
    node = _node()
    published = {d["name"]: d for d in gpu_pool(node, memory_shares=True).devices}
    # two shares of gpu-0 (two requests of one claim) and gpu-1 held whole
    devices = _allocated([_share("gpu-0", SHARE_A, "30Gi", "a"),
                          _share("gpu-0", SHARE_B, "10Gi", "b"),
                          {"request": "c", "driver": "gpu.toposerve.io", "pool": "n1",
                           "device": "gpu-1"}])
    grants = memory_grants(devices, published)
    assert grants == {"gpu-0": 40 * GI, "gpu-1": 80 * GI}
    gpus = resolve([d.device for d in devices], published, node.hardware)
    edits = gpu_edits(gpus, node.hardware, GpuConfig(), _dev_root(tmp_path), grants)
    env = edits.common.env
    assert len(env["NVIDIA_VISIBLE_DEVICES"].split(",")) == 2
    assert env["TOPOSERVE_GPU_MEMORY_BYTES"] == f"{40 * GI},{80 * GI}"
    assert edits.data["gpu-0"]["memoryBytes"] == 40 * GI


def test_whole_gpu_claims_are_told_nothing_new(tmp_path: Path) -> None:
    node = _node()
    published = {d["name"]: d for d in gpu_pool(node).devices}
    devices = _allocated([{"request": "gpu", "driver": "gpu.toposerve.io", "pool": "n1",
                           "device": "gpu-0"}])
    assert memory_grants(devices, published) == {}
    gpus = resolve(["gpu-0"], published, node.hardware)
    edits = gpu_edits(gpus, node.hardware, GpuConfig(), _dev_root(tmp_path))
    assert "TOPOSERVE_GPU_MEMORY_BYTES" not in edits.common.env
    assert "memoryBytes" not in edits.data["gpu-0"]


def test_a_share_without_memory_is_refused() -> None:
    devices = [AllocatedDevice(request="gpu", pool="n1", device="gpu-0", share_id=SHARE_A,
                               consumed={"cores": "1"})]
    with pytest.raises(ValueError, match="consumes no memory"):
        memory_grants(devices, {})
