"""The GPU driver ``gpu.toposerve.io``: discovery from sysfs and the node's
labels -> one pool (``devices.gpu_pool``) -> the publisher; prepare and
unprepare through the framework (``dra_driver.kubeletplugin``); health from sysfs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client import ApiClient, CoreV1Api

from dra_driver.driver_process import DriverProcess, Latest, PluginOptions
from dra_driver.gpu.config import GpuConfig
from dra_driver.gpu.devices import DRIVER, gpu_pool, partitions_wanted
from dra_driver.gpu.edits import gpu_edits, resolve
from dra_driver.kubeletplugin import (
    AllocatedDevice,
    ClaimRef,
    HealthBoard,
    PreparedEdits,
    merge_opaque,
    parse_opaque,
)
from dra_driver.resourceslice import Pool
from topology.discovery import discover
from topology.labels import PRESETS, PROFILE_LABEL, from_labels
from topology.model import NodeTopology

CDI_VENDOR = f"k8s.{DRIVER}"
CDI_CLASS = "gpu"


@dataclass(frozen=True)
class GpuDriverOptions(PluginOptions):
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
        self._found = Latest(self._discover)

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
        pool = gpu_pool(topo, node_uid=meta.uid or "", partitions=partitions_wanted(labels))
        return _Discovered(node=topo, pool=pool, devices={d["name"]: d for d in pool.devices})

    # -- DeviceKind ---------------------------------------------------------

    def enumerate(self) -> Sequence[Pool]:
        return [self.discover().pool]

    def validate_config(self, parameters: Mapping[str, Any]) -> GpuConfig:
        return parse_opaque(parameters, GpuConfig)

    def prepare(self, claim: ClaimRef, devices: Sequence[AllocatedDevice]) -> PreparedEdits:
        found = self.current()
        gpus = resolve([d.device for d in devices], found.devices, found.node.hardware)
        configs: list[object] = []
        for d in devices:  # one claim, one set of container env: every device's configs
            configs.extend(c for c in d.configs if c not in configs)
        return gpu_edits(gpus, found.node.hardware, merge_opaque(configs, GpuConfig),
                         self.opts.dev_root)

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


class GpuDriver(DriverProcess):
    """The whole process: plugin, publisher, health loop."""

    def __init__(self, api: ApiClient, opts: GpuDriverOptions) -> None:
        self.opts = opts
        self.kind = GpuKind(api, opts)
        super().__init__(
            api, self.kind, opts, cdi_vendor=CDI_VENDOR, cdi_class=CDI_CLASS,
            interval_s=opts.health_interval_s,
            tick=lambda: self.kind.check_health(self.plugin.health), loop_name="health")
