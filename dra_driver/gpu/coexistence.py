"""GPUs that NVIDIA's own software already hands out on this node: the
NVIDIA device plugin (the node's allocatable ``nvidia.com/gpu``) or
NVIDIA's DRA driver (ResourceSlices of ``gpu.nvidia.com`` for this node).
Publishing them too would let two allocators give one GPU to two pods, so
the GPU driver withholds them unless ``--allow-shared-with-nvidia``; it
says so once per change: a log line, ``toposerve_dra_gpus_withheld`` and
an Event on the Node."""

from __future__ import annotations

import json
from typing import Any

import structlog
from prometheus_client import Gauge

from toposerve.dra_driver.gpu.nvml import NvmlNode
from toposerve.kubeapi import events
from toposerve.kubeapi.typed import ApiClient, ResourceV1Api
from toposerve.topology.model import DeviceKind, NodeHardware

log = structlog.get_logger("dra.gpu.coexistence")

DEVICE_PLUGIN_RESOURCE = "nvidia.com/gpu"
NVIDIA_DRA_DRIVER = "gpu.nvidia.com"
NVIDIA_VENDOR = "0x10de"
WITHHELD = Gauge("toposerve_dra_gpus_withheld",
                 "GPUs not published because NVIDIA's device plugin or DRA driver has them",
                 ["driver", "by"])


def device_plugin_gpus(node: Any) -> int:
    """``nvidia.com/gpu`` in the node's allocatable (0 when absent)."""
    allocatable = (node.status.allocatable if node.status is not None else None) or {}
    try:
        return int(allocatable.get(DEVICE_PLUGIN_RESOURCE, "0"))
    except ValueError:
        return 0


def dra_claimed(slices: list[dict[str, Any]], hw: NodeHardware,
                nvml: NvmlNode | None) -> set[str]:
    """Bus ids of our NVIDIA GPUs that NVIDIA's DRA slices name, by PCI bus
    id or by UUID; every NVIDIA GPU when the slices name devices none of
    which we can match (a version that publishes neither)."""
    ours = {p.device.pci_bus_id for p in hw.places()
            if p.device.kind == DeviceKind.GPU and p.device.vendor_id == NVIDIA_VENDOR}
    by_uuid = {g.uuid: bdf for bdf, g in (nvml.gpus.items() if nvml else ())}
    claimed: set[str] = set()
    named = False
    for s in slices:
        for d in (s.get("spec") or {}).get("devices") or []:
            named = True
            attrs = d.get("attributes") or {}
            bdf = (attrs.get("resource.kubernetes.io/pciBusID") or {}).get("string")
            uuid = (attrs.get("uuid") or attrs.get(f"{NVIDIA_DRA_DRIVER}/uuid") or {}).get(
                "string")
            if bdf in ours:
                claimed.add(bdf)
            elif uuid in by_uuid:
                claimed.add(by_uuid[uuid])
    return claimed if claimed or not named else ours


class NvidiaNeighbours:
    """Which GPUs to withhold at each discovery; reports each change once."""

    def __init__(self, api: ApiClient, node_name: str, driver: str) -> None:
        self.api = api
        self.node_name = node_name
        self.driver = driver
        self._last: dict[str, frozenset[str]] = {}

    def _nvidia_slices(self) -> list[dict[str, Any]]:
        resp: Any = ResourceV1Api(self.api).list_resource_slice(  # raw: not a model
            field_selector=f"spec.driver={NVIDIA_DRA_DRIVER},spec.nodeName={self.node_name}",
            _preload_content=False, _request_timeout=20)
        items: list[dict[str, Any]] = json.loads(resp.data).get("items") or []
        return items

    def withheld(self, node: Any, hw: NodeHardware, nvml: NvmlNode | None) -> frozenset[str]:
        nvidia = frozenset(p.device.pci_bus_id for p in hw.places()
                           if p.device.kind == DeviceKind.GPU
                           and p.device.vendor_id == NVIDIA_VENDOR)
        by = {"device-plugin": nvidia if device_plugin_gpus(node) else frozenset(),
              "dra-driver": frozenset(dra_claimed(self._nvidia_slices(), hw, nvml))}
        for who, gpus in by.items():
            WITHHELD.labels(self.driver, who).set(len(gpus))
            if gpus != self._last.get(who, frozenset()):
                self._report(node, who, gpus)
        self._last = by
        return frozenset().union(*by.values())

    def _report(self, node: Any, who: str, gpus: frozenset[str]) -> None:
        name = {"device-plugin": f"NVIDIA's device plugin ({DEVICE_PLUGIN_RESOURCE})",
                "dra-driver": f"NVIDIA's DRA driver ({NVIDIA_DRA_DRIVER})"}[who]
        if not gpus:
            log.info(f"{name} no longer advertises GPUs of this node; publishing them",
                     driver=self.driver, node=self.node_name)
            return
        message = (f"{self.driver} does not publish {len(gpus)} GPU(s) that {name} already "
                   f"advertises on this node ({', '.join(sorted(gpus))}): one GPU would be "
                   f"handed out twice; --allow-shared-with-nvidia publishes them anyway")
        log.warning(message, driver=self.driver, node=self.node_name, by=who)
        meta = node.metadata
        events.warn(self.api, {"apiVersion": "v1", "kind": "Node", "name": self.node_name,
                               "uid": meta.uid if meta is not None else None},
                    "GpusWithheld", message, self.driver, self.node_name)
