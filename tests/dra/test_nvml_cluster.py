"""``toposerve driver gpu`` reading its GPUs from our fake NVML
(``harness.fake_nvml``) on a kwok node: the slices it publishes on the real
apiserver carry what NVML says (UUIDs, products, the GB200 fabric's NVLink
domain, MIG profiles), a critical XID and a lost GPU become taints there
and go again, and GPUs NVIDIA's DRA driver already publishes are withheld
with an Event on the Node."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from harness.dra_gpu import DRIVER, NODE, DriverProc, GpuEnv
from harness.fake_nvml import (
    BLACKWELL,
    H100_PROFILES,
    Scenario,
    gpus_of,
    inject_xid,
    set_lost,
)
from harness.waiting import wait_for
from toposerve.topology.profiles import load_profile

pytestmark = pytest.mark.cluster
HW = load_profile("hgx-h100").hardware()
CLUSTER = "4f3c1e2a-7d90-4a8e-9d1c-0b8a3c6e6a57"


def _devices(api: Any) -> dict[str, dict[str, Any]]:
    resp: Any = client.ResourceV1Api(api).list_resource_slice(
        field_selector=f"spec.nodeName={NODE},spec.driver={DRIVER}", _preload_content=False)
    return {d["name"]: d for s in json.loads(resp.data)["items"]
            for d in s["spec"].get("devices") or []}


def _attr(dev: dict[str, Any], key: str) -> Any:
    return next(iter(dev["attributes"][key].values()))


def _taints(api: Any, device: str) -> list[tuple[str, str | None]]:
    dev = _devices(api).get(device) or {}
    return [(t["key"], t.get("value")) for t in dev.get("taints") or []]


def _from_nvml(api: Any) -> bool:
    """Every GPU as the scenario below describes it, with its partitions
    (an earlier test's driver left slices of its own)."""
    devices = _devices(api)
    return all(_attr(devices.get(f"gpu-{i}", {"attributes": {"productName": {"string": ""}}}),
                     "productName") == "NVIDIA GB200" and f"gpu-{i}-1g10gb-6" in devices
               for i in range(8))


@pytest.fixture
def nvml_driver(gpu_env: GpuEnv, tmp_path: Path) -> Iterator[tuple[DriverProc, Path]]:
    """The driver on a GB200-like node with MIG on: NVLink fabric and profiles."""
    scenario = Scenario(gpus_of(HW, name="NVIDIA GB200", arch=BLACKWELL, cc="10.0",
                                memory=199715979264, fabric=(CLUSTER, 4), mig_mode=1,
                                profiles=H100_PROFILES[:2])).write(tmp_path / "scenario")
    d = DriverProc(gpu_env, tmp_path / "driver")
    d.start(nvml=scenario)
    try:
        # an earlier test's driver left its slices: wait for this one's
        wait_for("NVML's GPUs published", lambda: _from_nvml(gpu_env.api), timeout=30)
        yield d, scenario
    finally:
        d.kill()


def test_the_slices_carry_what_nvml_says(gpu_env: GpuEnv,
                                         nvml_driver: tuple[DriverProc, Path]) -> None:
    devices = _devices(gpu_env.api)
    gpu0 = devices["gpu-0"]
    assert _attr(gpu0, "uuid").startswith("GPU-")
    assert _attr(gpu0, "productName") == "NVIDIA GB200"
    assert _attr(gpu0, "architecture") == "Blackwell"
    assert _attr(gpu0, "driverVersion") == "580.65.6"
    assert _attr(gpu0, "cudaDriverVersion") == "13.0.0"
    assert _attr(gpu0, "nvlinkDomain") == f"{CLUSTER}.4"  # the hardware's, not the label's
    assert len({_attr(devices[f"gpu-{i}"], "uuid") for i in range(8)}) == 8
    # 1g.10gb at 7 places and 2g.20gb at 3 on each GPU
    parts = [n for n in devices if n.startswith("gpu-0-")]
    assert sorted(parts) == sorted([f"gpu-0-1g10gb-{i}" for i in range(7)]
                                   + [f"gpu-0-2g20gb-{i}" for i in (0, 2, 4)])
    assert _attr(devices["gpu-0-2g20gb-2"], "parentUUID") == _attr(gpu0, "uuid")


def test_xid_and_lost_gpu_are_taints_until_the_gpu_is_back(
        gpu_env: GpuEnv, nvml_driver: tuple[DriverProc, Path]) -> None:
    _, scenario = nvml_driver
    inject_xid(scenario, 6, 31)  # an application's page fault: no taint
    inject_xid(scenario, 6, 79)
    wait_for("gpu-6 tainted by XID 79",
             lambda: (f"{DRIVER}/xid", "79") in _taints(gpu_env.api, "gpu-6"))
    # its partitions too; they may sit in another slice, written a moment later
    wait_for("gpu-6's partition tainted by XID 79",
             lambda: (f"{DRIVER}/xid", "79") in _taints(gpu_env.api, "gpu-6-1g10gb-3"))
    assert _taints(gpu_env.api, "gpu-5") == []
    set_lost(scenario, [6])
    wait_for("gpu-6 lost", lambda: (f"{DRIVER}/gpu-lost", None) in _taints(gpu_env.api, "gpu-6"))
    set_lost(scenario, [])  # reset: answers again
    wait_for("gpu-6 untainted", lambda: _taints(gpu_env.api, "gpu-6") == [])


def test_gpus_of_nvidias_dra_driver_are_withheld(gpu_env: GpuEnv, tmp_path: Path) -> None:
    res: Any = client.ResourceV1Api(gpu_env.api)
    core: Any = client.CoreV1Api(gpu_env.api)
    bdf = HW.place("gpu-2").device.pci_bus_id
    name = f"{NODE}-gpu.nvidia.com-test"
    res.create_resource_slice({
        "metadata": {"name": name},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": NODE,
                 "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0", "attributes": {
                     "resource.kubernetes.io/pciBusID": {"string": bdf}}}]}})
    scenario = Scenario(gpus_of(HW)).write(tmp_path / "scenario")
    d = DriverProc(gpu_env, tmp_path / "driver")
    try:
        d.start(nvml=scenario)
        wait_for("gpu-2 withheld", lambda: _devices(gpu_env.api).keys() == {
            f"gpu-{i}" for i in range(8) if i != 2}, timeout=30)

        def event() -> Any:
            items = core.list_namespaced_event(
                "default", field_selector=f"involvedObject.name={NODE},reason=GpusWithheld").items
            return items[0] if items else None
        ev = wait_for("the GpusWithheld event", event, timeout=30)
        assert bdf in ev.message and "gpu.nvidia.com" in ev.message
    finally:
        d.kill()
        with contextlib.suppress(ApiException):
            res.delete_resource_slice(name)
