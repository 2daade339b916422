"""Devices -> ResourceSlice device entries (``resource.k8s.io/v1``).

Standard attributes use the ``resource.kubernetes.io/`` prefix so that
claims can align a GPU and a NIC with
``matchAttribute: resource.kubernetes.io/pcieRoot``; unprefixed names belong
to the publishing driver.
"""

from __future__ import annotations

from typing import Any

from topology.model import DeviceKind, DevicePlace, DomainPath
from topology.quantity import format_bytes

STD = "resource.kubernetes.io"
MAX_ATTRIBUTES = 32  # attributes + capacities per device (API limit)
MAX_STRING = 64


def _s(v: str) -> dict[str, Any]:
    if len(v) > MAX_STRING:
        raise ValueError(f"attribute string longer than {MAX_STRING} characters: {v!r}")
    return {"string": v}


def device_entry(place: DevicePlace, path: DomainPath | None = None) -> dict[str, Any]:
    """One entry of ``spec.devices`` for a device at ``place``."""
    d = place.device
    attrs: dict[str, Any] = {
        f"{STD}/pcieRoot": _s(place.root),
        f"{STD}/pciBusID": _s(d.pci_bus_id),
        f"{STD}/numaNode": {"int": place.numa},
        "kind": _s(d.kind.value),
        "model": _s(d.model),
        "vendorID": _s(d.vendor_id),
        "deviceID": _s(d.device_id),
    }
    if place.switch is not None:
        attrs["pcieSwitch"] = _s(place.switch)
    if path is not None:
        # Domains above the node, so a claim can ask for devices in one rack.
        for key, value in (("zone", path.zone), ("block", path.block), ("rack", path.rack),
                           ("nvlinkDomain", path.nvlink)):
            if value is not None:
                attrs[key] = _s(value)
    capacity: dict[str, Any] = {}
    if d.kind == DeviceKind.GPU and d.memory_bytes is not None:
        capacity["memory"] = {"value": format_bytes(d.memory_bytes)}
    if d.kind == DeviceKind.NIC:
        if d.interface:
            attrs["ifName"] = _s(d.interface)
        if d.speed_mbps is not None:
            attrs["speedMbps"] = {"int": d.speed_mbps}
        attrs["rdma"] = {"bool": d.rdma_device is not None}
        if d.rdma_device:
            attrs["rdmaDevice"] = _s(d.rdma_device)
        if d.mac:
            attrs["macAddress"] = _s(d.mac)
    if len(attrs) + len(capacity) > MAX_ATTRIBUTES:
        raise ValueError(f"device {d.name}: more than {MAX_ATTRIBUTES} attributes and capacities")
    entry: dict[str, Any] = {"name": d.name, "attributes": attrs}
    if capacity:
        entry["capacity"] = capacity
    return entry
