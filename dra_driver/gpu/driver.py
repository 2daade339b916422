"""The GPU driver ``gpu.toposerve.io``: discovery from sysfs (placement),
NVML (what each NVIDIA GPU is, ``nvml.py``) and the node's labels -> one
pool (``devices.gpu_pool``) -> the publisher; prepare and unprepare through
the framework (``toposerve.dra_driver.kubeletplugin``); health from sysfs and NVML
(critical XIDs, lost GPUs), each cause a taint of its own (``Faults``).

It does not publish GPUs that NVIDIA's device plugin or NVIDIA's DRA driver
already advertise on the node (``coexistence.py``) unless told to. With
binding conditions on, GPUs on an NVLink fabric bind a pod only once
registered with it (``binding``).
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog

from toposerve.dra_driver.driver_process import DriverProcess, Latest, PluginOptions
from toposerve.dra_driver.gpu.binding import CONDITIONS, fabric_readiness
from toposerve.dra_driver.gpu.coexistence import NvidiaNeighbours
from toposerve.dra_driver.gpu.config import GpuConfig
from toposerve.dra_driver.gpu.devices import DRIVER, gpu_pool, partitions_wanted
from toposerve.dra_driver.gpu.edits import gpu_edits, memory_grants, resolve
from toposerve.dra_driver.gpu.nvml import IGNORED_XIDS, Nvml, XidEvent
from toposerve.dra_driver.kubeletplugin import (
    AllocatedDevice,
    ClaimRef,
    HealthBoard,
    PreparedEdits,
    merge_opaque,
    metrics,
    parse_opaque,
)
from toposerve.dra_driver.kubeletplugin.binding import (
    Readiness,
    State,
    with_binding_conditions,
)
from toposerve.dra_driver.resourceslice import Pool
from toposerve.kubeapi.typed import ApiClient, CoreV1Api
from toposerve.topology.discovery import discover
from toposerve.topology.labels import PRESETS, PROFILE_LABEL, from_labels
from toposerve.topology.model import NodeTopology

log = structlog.get_logger("dra.gpu")

CDI_VENDOR = f"k8s.{DRIVER}"
CDI_CLASS = "gpu"


@dataclass(frozen=True)
class GpuDriverOptions(PluginOptions):
    health_interval_s: float = 10.0
    nvml: bool = True                 # False: sysfs only, NVML not even tried
    nvml_library: Path | None = None  # load this libnvidia-ml.so.1, whatever the root
    nvidia_driver_root: Path | None = None  # else search the library under it
    allow_shared_with_nvidia: bool = False  # publish GPUs NVIDIA's plugins advertise too
    memory_shares: bool = False  # whole GPUs shareable by memory (devices.memory_share_policy)


PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
# NVIDIA's DRA driver's convention: one taint key per cause of ill health
TAINT_XID = f"{DRIVER}/xid"
TAINT_GPU_LOST = f"{DRIVER}/gpu-lost"


class Faults:
    """What NVML said is wrong with each GPU (by PCI bus id): a critical XID
    (the last one's number) or the GPU lost. A lost GPU that answers again
    has been reset, which also clears its XID; otherwise an XID stays until
    the driver restarts (NVML reports no recovery from one). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_gpu: dict[str, dict[str, str]] = {}

    def xid(self, event: XidEvent) -> bool:
        """Record a critical XID; True when the GPU's taints change."""
        with self._lock:
            causes = self._by_gpu.setdefault(event.pci_bus_id, {})
            changed = causes.get(TAINT_XID) != str(event.xid)
            causes[TAINT_XID] = str(event.xid)
        return changed

    def set_lost(self, lost: set[str]) -> bool:
        """The GPUs lost now; True when any GPU's taints changed."""
        changed = False
        with self._lock:
            for bdf in lost:
                causes = self._by_gpu.setdefault(bdf, {})
                changed |= TAINT_GPU_LOST not in causes
                causes[TAINT_GPU_LOST] = ""
            for bdf, causes in list(self._by_gpu.items()):
                if TAINT_GPU_LOST in causes and bdf not in lost:
                    del self._by_gpu[bdf]  # back after a reset: the XID is gone too
                    changed = True
            self._by_gpu = {k: v for k, v in self._by_gpu.items() if v}
        return changed

    def snapshot(self) -> dict[str, dict[str, str]]:
        with self._lock:
            return {k: dict(v) for k, v in self._by_gpu.items()}


def _bdf(device: Mapping[str, Any]) -> str | None:
    value = (device.get("attributes") or {}).get(PCI_BUS_ID) or {}
    return value.get("string")


def fault_taints(pool: Pool, faults: Mapping[str, Mapping[str, str]]) -> Pool:
    """The pool with a NoSchedule taint per cause on each device (whole GPU
    and partitions) of a faulty GPU; the XID taint's value is its number."""
    def tainted(d: Mapping[str, Any]) -> Mapping[str, Any]:
        causes = faults.get(_bdf(d) or "")
        if not causes:
            return d
        taints = [{"key": k, **({"value": v} if v else {}), "effect": "NoSchedule"}
                  for k, v in sorted(causes.items())]
        return {**d, "taints": [*(d.get("taints") or []), *taints]}
    return replace(pool, devices=tuple(tainted(d) for d in pool.devices))


@dataclass
class _Discovered:
    node: NodeTopology
    pool: Pool
    devices: dict[str, Mapping[str, Any]] = field(default_factory=dict)


class GpuKind:
    """The GPU device kind (``device_kind.DeviceKind``)."""

    driver = DRIVER

    def __init__(self, api: ApiClient, opts: GpuDriverOptions) -> None:
        self.api = api
        self.opts = opts
        self.nvml = (Nvml.open(DRIVER, opts.nvml_library, opts.nvidia_driver_root)
                     if opts.nvml else None)
        self.faults = Faults()
        self._neighbours = None if opts.allow_shared_with_nvidia else NvidiaNeighbours(
            api, opts.node_name, DRIVER)
        self._found = Latest(self._discover)
        if opts.binding_conditions and self.nvml is None:
            log.warning("binding conditions: without NVML no GPU is known to be on an NVLink "
                        "fabric, so none is published with them", driver=DRIVER)

    def discover(self) -> _Discovered:
        return self._found.refresh()

    def current(self) -> _Discovered:
        return self._found.get()

    def _discover(self) -> _Discovered:
        hw = discover(self.opts.sysfs_root)
        node = CoreV1Api(self.api).read_node(self.opts.node_name, _request_timeout=20)
        meta = node.metadata
        assert meta is not None
        labels: dict[str, str] = meta.labels or {}
        topo = NodeTopology(
            name=self.opts.node_name,
            path=from_labels(self.opts.node_name, labels, PRESETS[self.opts.dialect]),
            profile=labels.get(PROFILE_LABEL, "discovered"), hardware=hw)
        found = self.nvml.node() if self.nvml is not None else None
        withheld = frozenset[str]()
        if self._neighbours is not None:
            withheld = self._neighbours.withheld(node, hw, found)
        pool = gpu_pool(topo, node_uid=meta.uid or "", partitions=partitions_wanted(labels),
                        nvml=found, withheld=withheld, memory_shares=self.opts.memory_shares)
        return _Discovered(node=topo, pool=pool, devices={d["name"]: d for d in pool.devices})

    # -- DeviceKind ---------------------------------------------------------

    def enumerate(self) -> Sequence[Pool]:
        pool = fault_taints(self.discover().pool, self.faults.snapshot())
        if self.opts.binding_conditions and self.nvml is not None:
            pool = with_binding_conditions(pool, CONDITIONS, self._on_fabric)
        return [pool]

    def _on_fabric(self, device: Mapping[str, Any]) -> bool:
        """A device (whole GPU or partition) of a GPU NVML reports a fabric for."""
        assert self.nvml is not None
        try:
            return self.nvml.fabric(_bdf(device) or "") is not None
        except ValueError:
            return False  # unreadable now: tainted by health, published plain

    def validate_config(self, parameters: Mapping[str, Any]) -> GpuConfig:
        return parse_opaque(parameters, GpuConfig)

    def prepare(self, claim: ClaimRef, devices: Sequence[AllocatedDevice]) -> PreparedEdits:
        found = self.current()
        gpus = resolve([d.device for d in devices], found.devices, found.node.hardware)
        if self.nvml is not None:
            for g in gpus:
                if g.partition:
                    self._check_partition(found.devices[g.name], g.place.device.pci_bus_id)
        configs: list[object] = []
        for d in devices:  # one claim, one set of container env: every device's configs
            configs.extend(c for c in d.configs if c not in configs)
        return gpu_edits(gpus, found.node.hardware, merge_opaque(configs, GpuConfig),
                         self.opts.dev_root, memory_grants(devices, found.devices))

    def _check_partition(self, device: Mapping[str, Any], pci_bus_id: str) -> None:
        """That the partition can exist on its GPU now (MIG mode on, the
        profile and placement possible, capacity left): this driver checks,
        it does not create GPU instances (docs/dra-driver.md, MIG)."""
        attrs = device.get("attributes") or {}
        assert self.nvml is not None
        self.nvml.check_partition(pci_bus_id, attrs["profile"]["string"],
                                  attrs["placementStart"]["int"])

    def unprepare(self, claim: ClaimRef, devices: Sequence[str]) -> None:
        pass  # nothing beyond the CDI spec, which the framework removes

    # -- health ---------------------------------------------------------------

    def check_health(self, board: HealthBoard) -> bool:
        """A GPU is unhealthy (its partitions too) while its PCI function is
        off the bus or NVML has a fault on it (a critical XID, lost); it
        recovers when all are gone. True when the faults (taints) changed."""
        found = self.current()
        changed = self.faults.set_lost(self.nvml.lost()) if self.nvml is not None else False
        faults = self.faults.snapshot()
        pci = self.opts.sysfs_root / "bus/pci/devices"
        results = []
        for name, dev in found.devices.items():
            bdf = _bdf(dev) or ""
            problems = [] if (pci / bdf).exists() else [f"PCI device {bdf} is gone"]
            causes = faults.get(bdf, {})
            if TAINT_XID in causes:
                problems.append(f"critical XID {causes[TAINT_XID]}")
            if TAINT_GPU_LOST in causes:
                problems.append("NVML: GPU is lost")
            results.append((found.pool.name, name, not problems, "; ".join(problems)))
        board.update(results)
        return changed

    def binding_readiness(self, devices: Collection[str]) -> dict[str, Readiness]:
        """Each allocated GPU's fabric registration, asked of NVML now
        (``binding``); a GPU with a fault (critical XID, lost) has failed."""
        found = self.current()
        faults = self.faults.snapshot()
        out = {}
        for name in devices:
            dev = found.devices.get(name)
            if dev is None:
                out[name] = Readiness(State.FAILED, "DeviceGone",
                                      f"{name} is no longer on this node")
                continue
            bdf = _bdf(dev) or ""
            problem = "; ".join(f"{k} {v}".strip() for k, v in sorted(faults.get(bdf, {}).items()))
            fabric = None
            if self.nvml is None:
                problem = problem or "NVML is not available"
            elif not problem:
                try:
                    fabric = self.nvml.fabric(bdf)
                except ValueError as err:
                    problem = str(err)
            out[name] = fabric_readiness(name, fabric, problem)
        return out

    def watch_xid(self, stop: threading.Event, on_fault: Any) -> None:
        """Until ``stop``: critical XID events from NVML into the faults;
        ``on_fault()`` after one that changed a GPU's taints."""
        assert self.nvml is not None
        while not stop.is_set():
            try:
                event = self.nvml.wait_xid(1000)
            except Exception as err:
                metrics.BACKGROUND_ERRORS.labels(DRIVER, "xid").inc()
                log.error("waiting for XID events failed", error=str(err))
                stop.wait(5)
                continue
            if event is None or event.xid in IGNORED_XIDS:
                continue
            log.warning("critical XID", gpu=event.pci_bus_id, xid=event.xid)
            if self.faults.xid(event):
                on_fault()


class GpuDriver(DriverProcess):
    """The whole process: plugin, publisher, health loop, and with NVML a
    thread waiting for XID events."""

    def __init__(self, api: ApiClient, opts: GpuDriverOptions) -> None:
        self.opts = opts
        self.kind = GpuKind(api, opts)
        super().__init__(
            api, self.kind, opts, cdi_vendor=CDI_VENDOR, cdi_class=CDI_CLASS,
            interval_s=opts.health_interval_s, tick=self._check, loop_name="health",
            readiness_of=self.kind.binding_readiness)
        self._xid_stop = threading.Event()
        self._xid = threading.Thread(target=self.kind.watch_xid, name="xid", daemon=True,
                                     args=(self._xid_stop, self._fault))

    def _check(self) -> None:
        if self.kind.check_health(self.plugin.health):
            self._fault()

    def _fault(self) -> None:
        self.kind.check_health(self.plugin.health)
        self.plugin.refresh_pools()  # the taints of a cause are in the pool itself

    def start(self) -> None:
        super().start()
        if self.kind.nvml is not None:
            self._xid.start()

    def stop(self) -> None:
        self._xid_stop.set()
        if self._xid.is_alive():
            self._xid.join(timeout=5)
        super().stop()
        if self.kind.nvml is not None:
            self.kind.nvml.close()
