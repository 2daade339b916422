"""The GPU driver through NVIDIA's real binding (pynvml) against our fake
libnvidia-ml.so.1 (tests/dra/fake_nvml, no GPU on this machine): what NVML
says becomes the slices (real UUIDs, products the catalog does not know,
MIG profiles, the NVLink fabric), prepare checks a MIG partition can
exist, XIDs and lost GPUs become taints of their own and go again; GPUs
NVIDIA's own plugins advertise are withheld."""

from __future__ import annotations

import ctypes
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness.fake_nvml import (
    BLACKWELL,
    ENV,
    H100_PROFILES,
    FakeGpu,
    Scenario,
    build,
    gpus_of,
    inject_xid,
    set_lost,
)
from toposerve.dra_driver.gpu import coexistence, driver
from toposerve.dra_driver.gpu import nvml as nvml_module
from toposerve.dra_driver.gpu.config import GpuConfig
from toposerve.dra_driver.gpu.devices import gpu_pool, gpu_uuid
from toposerve.dra_driver.gpu.driver import TAINT_GPU_LOST, TAINT_XID, GpuDriverOptions, GpuKind
from toposerve.dra_driver.gpu.edits import gpu_edits, resolve
from toposerve.dra_driver.gpu.nvml import NVML_AVAILABLE, Nvml, XidEvent, find_library
from toposerve.dra_driver.kubeletplugin import AllocatedDevice, ClaimRef, HealthBoard
from toposerve.dra_driver.kubeletplugin.health import Health
from toposerve.kubeapi import events as kube_events
from toposerve.topology.discovery import discover
from toposerve.topology.model import DomainPath, NodeTopology
from toposerve.topology.profiles import load_profile
from toposerve.topology.quantity import format_bytes
from toposerve.topology.sysfs import write_profile_sysfs

pytestmark = pytest.mark.unit
HW = load_profile("hgx-h100").hardware()
NODE = "node-a"
CLUSTER = "4f3c1e2a-7d90-4a8e-9d1c-0b8a3c6e6a57"


@pytest.fixture(scope="session")
def library() -> Path:
    return build()


@pytest.fixture
def nvml_of(library: Path, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Opens NVML on a scenario; closes what it opened."""
    opened: list[Nvml] = []

    def open_(scenario: Scenario) -> tuple[Nvml, Path]:
        path = scenario.write(tmp_path / "scenario")
        monkeypatch.setenv(ENV, str(path))
        nvml = Nvml.open("gpu.toposerve.io", library)
        assert nvml is not None
        opened.append(nvml)
        return nvml, path

    yield open_
    for n in opened:
        n.close()


def _topo(labels_nvlink: str | None = None) -> NodeTopology:
    return NodeTopology(name=NODE, path=DomainPath(host=NODE, nvlink=labels_nvlink),
                        profile="hgx-h100", hardware=HW)


def _attrs(pool: Any, name: str) -> dict[str, Any]:
    dev = next(d for d in pool.devices if d["name"] == name)
    return {k: next(iter(v.values())) for k, v in dev["attributes"].items()}


def test_an_h100_node_is_published_as_nvml_describes_it(nvml_of: Any, dev_root: Path) -> None:
    gpus = gpus_of(HW)
    nvml, _ = nvml_of(Scenario(gpus))
    node = nvml.node()
    assert (node.driver_version, node.cuda_driver_version) == ("580.65.06", "13.0")
    assert sorted(node.gpus) == sorted(g.bus_id for g in gpus)
    pool = gpu_pool(_topo(), nvml=node)
    assert [d["name"] for d in pool.devices] == [f"gpu-{i}" for i in range(8)]
    a = _attrs(pool, "gpu-3")
    g = node.gpus[HW.place("gpu-3").device.pci_bus_id]
    assert a["uuid"] == g.uuid and a["uuid"].startswith("GPU-")
    assert (a["productName"], a["architecture"], a["brand"]) == (
        "NVIDIA H100 80GB HBM3", "Hopper", "Nvidia")
    assert (a["cudaComputeCapability"], a["driverVersion"], a["cudaDriverVersion"]) == (
        "9.0.0", "580.65.6", "13.0.0")
    assert a["minor"] == 3
    dev = next(d for d in pool.devices if d["name"] == "gpu-3")
    assert dev["capacity"]["memory"] == {"value": format_bytes(85520809984)}
    # the container sees the real UUID, and its own device node by minor
    found = {d["name"]: d for d in pool.devices}
    edits = gpu_edits(resolve(["gpu-3"], found, HW), HW, GpuConfig(), dev_root)
    assert edits.common.env["NVIDIA_VISIBLE_DEVICES"] == g.uuid
    assert [n.path for n in edits.devices["gpu-3"].device_nodes] == ["/dev/nvidia3"]


@pytest.fixture
def dev_root(tmp_path: Path) -> Path:
    dev = tmp_path / "dev"
    dev.mkdir()
    for n in [*(f"nvidia{i}" for i in range(8)), "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]:
        (dev / n).touch()
    return dev


def test_products_the_catalog_does_not_know_carry_nvmls_name(nvml_of: Any,
                                                               tmp_path: Path) -> None:
    gpus = gpus_of(HW, name="NVIDIA L40S", memory=48305799168, arch=8, cc="8.9",
                   pci_device_id="26b9")
    nvml, _ = nvml_of(Scenario(gpus))
    # the sysfs side: an unknown PCI device id, as discovery names it
    pool = gpu_pool(NodeTopology(name=NODE, path=DomainPath(host=NODE), profile="discovered",
                                 hardware=_unknown(tmp_path / "sysfs")), nvml=nvml.node())
    a = _attrs(pool, "gpu-0")
    assert (a["model"], a["productName"], a["architecture"]) == (
        "NVIDIA L40S", "NVIDIA L40S", "Ada Lovelace")
    assert a["cudaComputeCapability"] == "8.9.0"
    assert pool.devices[0]["capacity"]["memory"] == {"value": format_bytes(48305799168)}
    assert not any("unknown" in str(v) for d in pool.devices for v in d["attributes"].values())


def _unknown(hw: Any) -> Any:
    """``hw`` with its GPUs' PCI device id unknown to the catalog."""
    import tempfile

    root = Path(tempfile.mkdtemp()) / "sysfs"
    write_profile_sysfs(load_profile("hgx-h100"), root)
    for gpu in (root / "bus/pci/devices").iterdir():
        if (gpu / "class").read_text().startswith("0x03"):
            (gpu / "device").write_text("0x26b9\n")
    found = discover(root)
    assert found.place("gpu-0").device.model.startswith("unknown-")
    return found


def test_gb200_nvlink_domain_comes_from_the_fabric(nvml_of: Any) -> None:
    gpus = gpus_of(HW, name="NVIDIA GB200", arch=BLACKWELL, cc="10.0", memory=199715979264,
                   fabric=(CLUSTER, 7))
    nvml, _ = nvml_of(Scenario(gpus))
    pool = gpu_pool(_topo(labels_nvlink="from-the-label"), nvml=nvml.node())
    assert _attrs(pool, "gpu-0")["nvlinkDomain"] == f"{CLUSTER}.7"
    assert _attrs(pool, "gpu-0")["architecture"] == "Blackwell"


def test_mig_profiles_are_the_partitions_and_prepare_checks_them(nvml_of: Any) -> None:
    gpus = gpus_of(HW, mig_mode=1, profiles=H100_PROFILES)
    gpus[1] = FakeGpu(**{**gpus[1].__dict__, "mig_mode": 0})
    nvml, _ = nvml_of(Scenario(gpus))
    pool = gpu_pool(_topo(), nvml=nvml.node())
    names = {d["name"] for d in pool.devices}
    # 7 + 3 + 2 + 1 + 1 placements a GPU
    assert len(names) == 8 + 8 * 14
    assert {"gpu-0-1g10gb-6", "gpu-0-2g20gb-4", "gpu-0-3g40gb-4", "gpu-0-7g80gb-0"} <= names
    part = next(d for d in pool.devices if d["name"] == "gpu-0-3g40gb-4")
    assert part["capacity"]["memory"] == {"value": "40192Mi"}
    assert set(part["consumesCounters"][0]["counters"]) == {
        "memory", "multiprocessors", "memory-slice-4", "memory-slice-5", "memory-slice-6",
        "memory-slice-7"}
    counters = pool.shared_counters[0]["counters"]
    assert counters["multiprocessors"] == {"value": "132"}
    assert len([k for k in counters if k.startswith("memory-slice-")]) == 8

    gpu0, gpu1 = (HW.place(f"gpu-{i}").device.pci_bus_id for i in (0, 1))
    nvml.check_partition(gpu0, "3g.40gb", 4)
    with pytest.raises(ValueError, match="MIG mode is off"):
        nvml.check_partition(gpu1, "1g.10gb", 0)
    with pytest.raises(ValueError, match="cannot start at slice 3"):
        nvml.check_partition(gpu0, "3g.40gb", 3)
    with pytest.raises(ValueError, match=r"no MIG profile 1g\.5gb"):
        nvml.check_partition(gpu0, "1g.5gb", 0)


def test_no_capacity_left_fails_the_check(nvml_of: Any) -> None:
    full = tuple(p if p.name != "7g.80gb" else p.__class__(**{**p.__dict__, "remaining": 0})
                 for p in H100_PROFILES)
    nvml, _ = nvml_of(Scenario(gpus_of(HW, mig_mode=1, profiles=full)))
    nvml.node()
    with pytest.raises(ValueError, match=r"no capacity left for a 7g\.80gb"):
        nvml.check_partition(HW.place("gpu-0").device.pci_bus_id, "7g.80gb", 0)


def test_without_the_library_it_is_sysfs_only(tmp_path: Path) -> None:
    assert Nvml.open("gpu.toposerve.io", tmp_path / "libnvidia-ml.so.1") is None
    assert NVML_AVAILABLE.labels("gpu.toposerve.io")._value.get() == 0


# -- the host's driver root, as the pod mounts it ------------------------------


def _driver_root(root: Path, library: Path, lib_dir: str) -> Path:
    """``library`` installed under ``root/lib_dir`` as a driver installs it:
    the versioned file and the soname a relative link to it."""
    d = root / lib_dir
    d.mkdir(parents=True, exist_ok=True)
    shutil.copy(library, d / "libnvidia-ml.so.580.65.06")
    (d / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.580.65.06")
    return d / "libnvidia-ml.so.1"


@pytest.fixture
def loaded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths Nvml.open loads (pynvml's own loader imported CDLL apart)."""
    paths: list[str] = []
    real = ctypes.CDLL

    def spy(name: str, *args: Any, **kw: Any) -> ctypes.CDLL:
        paths.append(name)
        return real(name, *args, **kw)
    monkeypatch.setattr(ctypes, "CDLL", spy)
    return paths


def test_the_library_is_found_under_the_driver_root(
        library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        loaded: list[str]) -> None:
    root = tmp_path / "driver-root"
    found = _driver_root(root, library, "usr/lib/x86_64-linux-gnu")
    _driver_root(root, library, "usr/lib")  # later in the search order
    assert find_library(root) == found
    monkeypatch.setenv(ENV, str(Scenario(gpus_of(HW)).write(tmp_path / "scenario")))
    nvml = Nvml.open("gpu.toposerve.io", driver_root=root)
    assert nvml is not None
    try:
        assert loaded == [str(found)]
        assert len(nvml.node().gpus) == 8
        assert NVML_AVAILABLE.labels("gpu.toposerve.io")._value.get() == 1
    finally:
        nvml.close()


def test_an_empty_driver_root_logs_one_line_and_keeps_sysfs(
        tmp_path: Path, dev_root: Path, loaded: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "driver-root"
    root.mkdir()
    sysfs = write_profile_sysfs(load_profile("hgx-h100"), tmp_path / "sysfs")
    monkeypatch.setattr(driver, "CoreV1Api", _Core())
    opts = GpuDriverOptions(node_name=NODE, sysfs_root=sysfs, dev_root=dev_root,
                            nvidia_driver_root=root, allow_shared_with_nvidia=True)
    logs: list[tuple[str, str, dict[str, Any]]] = []
    # a recorder, not capture_logs: an earlier test may have cached the logger
    monkeypatch.setattr(nvml_module, "log", SimpleNamespace(**{
        level: lambda event, level=level, **kw: logs.append((level, event, kw))
        for level in ("debug", "info", "warning", "error")}))
    kind = GpuKind(api=None, opts=opts)  # type: ignore[arg-type]
    assert kind.nvml is None and loaded == []
    ((level, _, line),) = logs
    assert level == "warning"
    assert line["reason"] == (
        f"no libnvidia-ml.so.1 under the driver root {root} (searched usr/lib64, "
        "usr/lib/x86_64-linux-gnu, usr/lib/aarch64-linux-gnu, lib64, usr/lib)")
    assert NVML_AVAILABLE.labels("gpu.toposerve.io")._value.get() == 0
    kind.discover()
    (pool,) = kind.enumerate()
    # sysfs alone: the stand-in UUID
    assert _attrs(pool, "gpu-0")["uuid"] == gpu_uuid(NODE, HW.place("gpu-0").device.pci_bus_id)


def test_an_explicit_library_wins_over_the_driver_root(
        library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        loaded: list[str]) -> None:
    root = tmp_path / "driver-root"
    _driver_root(root, library, "usr/lib64")
    monkeypatch.setenv(ENV, str(Scenario(gpus_of(HW)).write(tmp_path / "scenario")))
    nvml = Nvml.open("gpu.toposerve.io", library, driver_root=root)
    assert nvml is not None
    nvml.close()
    assert loaded == [str(library)]


# -- the driver's kind: health and taints ---------------------------------------


class _Core:
    def __init__(self, allocatable: dict[str, str] | None = None) -> None:
        from kubernetes.client import V1Node, V1NodeStatus, V1ObjectMeta
        self.node = V1Node(metadata=V1ObjectMeta(name=NODE, uid="u-1", labels={}),
                           status=V1NodeStatus(allocatable=allocatable or {}))
        self.events: list[Any] = []

    def __call__(self, api: Any) -> _Core:
        return self

    def read_node(self, name: str, **_: Any) -> Any:
        return self.node

    def create_namespaced_event(self, namespace: str, body: Any, **_: Any) -> None:
        self.events.append(body)


@pytest.fixture
def kind_of(nvml_of: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
            library: Path, dev_root: Path) -> Iterator[Any]:
    def make(scenario: Scenario, core: _Core | None = None,
             nvidia_slices: list[dict[str, Any]] | None = None,
             allow: bool = False) -> tuple[GpuKind, Path]:
        _, path = nvml_of(scenario)
        core = core or _Core()
        monkeypatch.setattr(driver, "CoreV1Api", core)
        monkeypatch.setattr(kube_events, "CoreV1Api", core)
        monkeypatch.setattr(coexistence.NvidiaNeighbours, "_nvidia_slices",
                            lambda self: nvidia_slices or [])
        sysfs = tmp_path / "sysfs"
        if not sysfs.exists():
            write_profile_sysfs(load_profile("hgx-h100"), sysfs)
        opts = GpuDriverOptions(node_name=NODE, sysfs_root=sysfs, dev_root=dev_root,
                                nvml_library=library, allow_shared_with_nvidia=allow)
        kind = GpuKind(api=None, opts=opts)  # type: ignore[arg-type]
        return kind, path
    yield make


def _taints(kind: GpuKind, name: str) -> list[tuple[str, str | None]]:
    (pool,) = kind.enumerate()
    dev = next(d for d in pool.devices if d["name"] == name)
    return [(t["key"], t.get("value")) for t in dev.get("taints") or []]


def test_an_xid_taints_the_gpu_and_its_partitions(kind_of: Any) -> None:
    kind, path = kind_of(Scenario(gpus_of(HW, mig_mode=1, profiles=H100_PROFILES[:1])))
    board = HealthBoard()
    kind.discover()
    seen: list[int] = []
    stop = threading.Event()
    t = threading.Thread(target=kind.watch_xid, args=(stop, lambda: seen.append(1)))
    t.start()
    try:
        inject_xid(path, 2, 13)   # an application's error: the GPU stays healthy
        inject_xid(path, 2, 79)   # fallen off the bus
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        stop.set()
        t.join()
    assert seen == [1]
    assert _taints(kind, "gpu-2") == [(TAINT_XID, "79")]
    assert _taints(kind, "gpu-2-1g10gb-0") == [(TAINT_XID, "79")]
    assert _taints(kind, "gpu-1") == []
    kind.check_health(board)
    health = {d.device: d for d in board.snapshot()}
    assert health["gpu-2"].health == Health.UNHEALTHY
    assert health["gpu-2"].message == "critical XID 79"
    assert health["gpu-1"].health == Health.HEALTHY


def test_a_lost_gpu_is_tainted_and_recovers_after_a_reset(kind_of: Any) -> None:
    kind, path = kind_of(Scenario(gpus_of(HW)))
    board = HealthBoard()
    kind.discover()
    bdf = HW.place("gpu-5").device.pci_bus_id
    kind.faults.xid(XidEvent(bdf, 48))
    set_lost(path, [5])
    assert kind.check_health(board) is True
    assert _taints(kind, "gpu-5") == [(TAINT_GPU_LOST, None), (TAINT_XID, "48")]
    assert {d.device: d.health for d in board.snapshot()}["gpu-5"] == Health.UNHEALTHY
    assert kind.check_health(board) is False  # nothing new
    set_lost(path, [])
    assert kind.check_health(board) is True
    assert _taints(kind, "gpu-5") == []
    assert {d.device: d.health for d in board.snapshot()}["gpu-5"] == Health.HEALTHY


def test_prepare_refuses_a_partition_that_cannot_exist(kind_of: Any) -> None:
    gpus = gpus_of(HW, mig_mode=1, profiles=H100_PROFILES)
    gpus[0] = FakeGpu(**{**gpus[0].__dict__, "mig_mode": 0})
    kind, _ = kind_of(Scenario(gpus))
    claim = ClaimRef("ns", "c", "uid-1")
    ok = kind.prepare(claim, [AllocatedDevice("gpu", NODE, "gpu-1-1g10gb-2")])
    assert set(ok.devices) == {"gpu-1-1g10gb-2"}
    with pytest.raises(ValueError, match="MIG mode is off"):
        kind.prepare(claim, [AllocatedDevice("gpu", NODE, "gpu-0-1g10gb-2")])


# -- coexistence with NVIDIA's device plugin and DRA driver ----------------------


def test_gpus_of_the_nvidia_device_plugin_are_withheld(kind_of: Any) -> None:
    core = _Core(allocatable={"nvidia.com/gpu": "8"})
    kind, _ = kind_of(Scenario(gpus_of(HW)), core=core)
    (pool,) = kind.enumerate()
    assert pool.devices == ()
    assert len(core.events) == 1
    assert core.events[0]["reason"] == "GpusWithheld"
    assert "NVIDIA's device plugin (nvidia.com/gpu)" in core.events[0]["message"]
    assert coexistence.WITHHELD.labels("gpu.toposerve.io", "device-plugin")._value.get() == 8
    kind.enumerate()
    assert len(core.events) == 1  # said once per change


def test_gpus_of_nvidias_dra_driver_are_withheld_by_bus_id_or_uuid(kind_of: Any) -> None:
    gpus = gpus_of(HW)
    gpus[1] = FakeGpu(**{**gpus[1].__dict__, "uuid": "GPU-11111111-2222-3333-4444-555555555555"})
    nvidia: list[dict[str, Any]] = [{"spec": {"devices": [
        {"name": "gpu-0", "attributes": {
            "resource.kubernetes.io/pciBusID": {"string": gpus[0].bus_id}}},
        {"name": "gpu-1", "attributes": {"uuid": {"string": gpus[1].uuid}}}]}}]
    kind, _ = kind_of(Scenario(gpus), nvidia_slices=nvidia)
    (pool,) = kind.enumerate()
    assert [d["name"] for d in pool.devices] == [f"gpu-{i}" for i in range(2, 8)]


def test_allow_shared_with_nvidia_publishes_them(kind_of: Any) -> None:
    core = _Core(allocatable={"nvidia.com/gpu": "8"})
    kind, _ = kind_of(Scenario(gpus_of(HW)), core=core, allow=True)
    (pool,) = kind.enumerate()
    assert len(pool.devices) == 8 and core.events == []
