"""The GPU driver ``gpu.toposerve.io``: discovery from sysfs and the node's
labels -> one pool (``devices.gpu_pool``) -> the publisher; prepare and
unprepare through the framework (``kubelet_plugin``); health from sysfs.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from kubernetes.client import ApiClient, CoreV1Api

from dra_driver.framework import metrics
from dra_driver.framework.cdi import DEFAULT_CDI_ROOT, CdiSpecs
from dra_driver.framework.checkpoint import BOOT_ID_FILE, read_boot_id
from dra_driver.framework.device_kind import AllocatedDevice, ClaimRef, PreparedEdits
from dra_driver.framework.health import HealthBoard
from dra_driver.framework.kubelet_plugin import KubeletPlugin, PluginConfig
from dra_driver.framework.publisher import Pool, SlicePublisher
from dra_driver.framework.sockets import KUBELET_REGISTRY_DIR, PluginPaths
from dra_driver.gpu.config import GpuConfig, merge, parse_gpu_config
from dra_driver.gpu.devices import DRIVER, gpu_pool
from dra_driver.gpu.edits import gpu_edits, resolve
from topology.discovery import discover
from topology.labels import PRESETS, PROFILE_LABEL, DialectName, from_labels
from topology.model import NodeTopology

CDI_VENDOR = f"k8s.{DRIVER}"
CDI_CLASS = "gpu"
log = structlog.get_logger("dra.gpu")


@dataclass(frozen=True)
class GpuDriverOptions:
    node_name: str
    plugin_dir: Path | None = None
    registry_dir: Path = KUBELET_REGISTRY_DIR
    cdi_root: Path = DEFAULT_CDI_ROOT
    sysfs_root: Path = Path("/sys")
    dev_root: Path = Path("/dev")
    pod_uid: str | None = None
    dialect: DialectName = DialectName.TOPOSERVE
    boot_id_file: Path = BOOT_ID_FILE
    health_interval_s: float = 10.0


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
        self._lock = threading.Lock()
        self._last: _Discovered | None = None

    def discover(self) -> _Discovered:
        hw = discover(self.opts.sysfs_root)
        node = CoreV1Api(self.api).read_node(self.opts.node_name, _request_timeout=20)
        meta = node.metadata
        assert meta is not None
        labels: dict[str, str] = meta.labels or {}
        topo = NodeTopology(
            name=self.opts.node_name,
            path=from_labels(self.opts.node_name, labels, PRESETS[self.opts.dialect]),
            profile=labels.get(PROFILE_LABEL, "discovered"), hardware=hw)
        pool = gpu_pool(topo, node_uid=meta.uid or "")
        found = _Discovered(node=topo, pool=pool, devices={d["name"]: d for d in pool.devices})
        with self._lock:
            self._last = found
        return found

    def current(self) -> _Discovered:
        with self._lock:
            last = self._last
        return last if last is not None else self.discover()

    # -- DeviceKind ---------------------------------------------------------

    def enumerate(self) -> Sequence[Pool]:
        return [self.discover().pool]

    def validate_config(self, parameters: Mapping[str, Any]) -> GpuConfig:
        return parse_gpu_config(parameters)

    def prepare(self, claim: ClaimRef, devices: Sequence[AllocatedDevice]) -> PreparedEdits:
        found = self.current()
        gpus = resolve([d.device for d in devices], found.devices, found.node.hardware)
        configs: list[GpuConfig] = []
        for d in devices:  # one claim, one set of container env: every device's configs
            configs.extend(c for c in d.configs if c not in configs)
        return gpu_edits(gpus, found.node.hardware, merge(configs), self.opts.dev_root)

    def unprepare(self, claim: ClaimRef, devices: Sequence[str]) -> None:
        pass  # nothing beyond the CDI spec, which the framework removes

    # -- health ---------------------------------------------------------------

    def check_health(self, board: HealthBoard) -> None:
        """A GPU whose PCI function left the bus is unhealthy (its partitions
        too); it recovers when the function is back."""
        found = self.current()
        pci = self.opts.sysfs_root / "bus/pci/devices"
        results = []
        for name, dev in found.devices.items():
            index = (dev.get("attributes") or {}).get("index", {}).get("int")
            bdf = found.node.hardware.place(f"gpu-{index}").device.pci_bus_id
            present = (pci / bdf).exists()
            results.append((found.pool.name, name, present,
                            "" if present else f"PCI device {bdf} is gone"))
        board.update(results)


class GpuDriver:
    """The whole process: plugin, publisher, health loop."""

    def __init__(self, api: ApiClient, opts: GpuDriverOptions) -> None:
        self.opts = opts
        self.kind = GpuKind(api, opts)
        self.publisher = SlicePublisher(api, DRIVER, node_name=opts.node_name)
        paths = PluginPaths(driver=DRIVER, registry_dir=opts.registry_dir,
                            plugin_dir=opts.plugin_dir, pod_uid=opts.pod_uid)
        cfg = PluginConfig(driver=DRIVER, node_name=opts.node_name, paths=paths,
                           cdi=CdiSpecs(opts.cdi_root, CDI_VENDOR, CDI_CLASS),
                           boot_id=read_boot_id(opts.boot_id_file),
                           health_timeout_s=max(30, int(opts.health_interval_s * 3)))
        self.plugin = KubeletPlugin(cfg, self.kind, api, self.publisher)
        self._stop = threading.Event()
        self._health = threading.Thread(target=self._health_loop, name="gpu-health", daemon=True)

    def start(self) -> None:
        self.plugin.start()
        self._health.start()

    def stop(self) -> None:
        self._stop.set()
        if self._health.is_alive():
            self._health.join(timeout=5)
        self.plugin.stop()

    def _health_loop(self) -> None:
        while True:
            try:
                self.kind.check_health(self.plugin.health)
            except Exception as err:
                metrics.BACKGROUND_ERRORS.labels(DRIVER, "health").inc()
                log.error("health check failed", error=str(err))
            if self._stop.wait(self.opts.health_interval_s):
                return
