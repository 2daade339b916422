"""Devices -> ResourceSlice device entries (``resource.k8s.io/v1``): the
attribute vocabulary every toposerve driver shares.

Standard attributes use the ``resource.kubernetes.io/`` prefix so that
claims can align a GPU and a NIC with
``matchAttribute: resource.kubernetes.io/pcieRoot``; unprefixed names belong
to the publishing driver. Our topology attributes (``pcieSwitch``,
``nvlinkDomain``, ``rack``, ``block``, ``zone``) come from the same model the
extender and router use, so "same switch" or "same NVLink domain" is a
``matchAttribute`` away. The drivers add their kind's own names on top
(``toposerve.dra_driver.gpu.devices``, ``toposerve.dra_driver.net.devices``).
``held_device`` reads an entry back into the place of a device a pod holds
(``toposerve.topology.transfer``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from typing import Any

from toposerve.topology.model import DeviceKind, DevicePlace, DomainPath
from toposerve.topology.quantity import format_bytes
from toposerve.topology.transfer import HeldDevice

STD = "resource.kubernetes.io"
MAX_ATTRIBUTES = 32  # attributes + capacities per device (API limit)
MAX_STRING = 64
ATTRIBUTE_NAME = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?/)?[A-Za-z_][A-Za-z0-9_]{0,31}$")
SEMVER = re.compile(r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
                    r"(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")
# the domain levels above the node, as attribute names
DOMAIN_ATTRIBUTES = (("zone", "zone"), ("block", "block"), ("rack", "rack"),
                     ("nvlink", "nvlinkDomain"))


def string(v: str) -> dict[str, Any]:
    if len(v) > MAX_STRING:
        raise ValueError(f"attribute string longer than {MAX_STRING} characters: {v!r}")
    return {"string": v}


def integer(v: int) -> dict[str, Any]:
    return {"int": v}


def boolean(v: bool) -> dict[str, Any]:
    return {"bool": v}


def version(v: str) -> dict[str, Any]:
    """A semantic version, read leniently as NVIDIA's driver does: "9.0"
    becomes 9.0.0 and "570.124.06" 570.124.6."""
    core, sep, rest = v.partition("-")
    parts = core.split(".")
    if len(parts) <= 3 and all(p.isdigit() for p in parts):
        v = ".".join([str(int(p)) for p in parts] + ["0"] * (3 - len(parts))) + sep + rest
    if not SEMVER.fullmatch(v) or len(v) > MAX_STRING:
        raise ValueError(f"{v!r} is not a semantic version (such as 1.2.3)")
    return {"version": v}


def quantity(v: str) -> dict[str, Any]:
    return {"value": v}


def format_bits(bits_per_second: int) -> str:
    """A link speed as a decimal quantity in its canonical form: 400G, 25G, 100M."""
    for suffix, unit in (("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if bits_per_second and bits_per_second % unit == 0:
            return f"{bits_per_second // unit}{suffix}"
    return str(bits_per_second)


def place_attributes(place: DevicePlace, path: DomainPath | None = None) -> dict[str, Any]:
    """Where a device sits: the standard PCIe/NUMA attributes, its switch,
    and the node's domains (so a claim can ask for devices in one rack)."""
    attrs: dict[str, Any] = {
        f"{STD}/pcieRoot": string(place.root),
        f"{STD}/pciBusID": string(place.device.pci_bus_id),
        f"{STD}/numaNode": integer(place.numa),
    }
    if place.switch is not None:
        attrs["pcieSwitch"] = string(place.switch)
    for field, key in DOMAIN_ATTRIBUTES if path is not None else ():
        value = getattr(path, field)
        if value is not None:
            attrs[key] = string(value)
    return attrs


def device_entry(place: DevicePlace, path: DomainPath | None = None) -> dict[str, Any]:
    """One entry of ``spec.devices`` for a device at ``place``: placement,
    model facts, and the capacity of its kind (GPU memory, NIC link speed)."""
    d = place.device
    attrs = place_attributes(place, path)
    attrs.update({"kind": string(d.kind.value), "model": string(d.model),
                  "vendorID": string(d.vendor_id), "deviceID": string(d.device_id)})
    capacity: dict[str, Any] = {}
    if d.kind == DeviceKind.GPU and d.memory_bytes is not None:
        capacity["memory"] = quantity(format_bytes(d.memory_bytes))
    if d.kind == DeviceKind.NIC:
        if d.interface:
            attrs["ifName"] = string(d.interface)
        attrs["rdma"] = boolean(d.rdma_device is not None)
        if d.rdma_device:
            attrs["rdmaDevice"] = string(d.rdma_device)
        if d.mac:
            attrs["mac"] = string(d.mac)
        if d.mtu is not None:
            attrs["mtu"] = integer(d.mtu)
        if d.speed_mbps is not None:
            capacity["linkSpeed"] = quantity(format_bits(d.speed_mbps * 10**6))
    entry: dict[str, Any] = {"name": d.name, "attributes": attrs}
    if capacity:
        entry["capacity"] = capacity
    check_entry(entry)
    return entry


@cache
def _valid_name(key: str) -> bool:
    return ATTRIBUTE_NAME.fullmatch(key) is not None


def check_entry(entry: dict[str, Any]) -> None:
    """The API's rules for one device entry; a ``ValueError`` naming what broke."""
    name = entry.get("name", "?")
    attrs, capacity = entry.get("attributes", {}), entry.get("capacity", {})
    if len(attrs) + len(capacity) > MAX_ATTRIBUTES:
        raise ValueError(f"device {name}: {len(attrs) + len(capacity)} attributes and "
                         f"capacities, the API allows {MAX_ATTRIBUTES}")
    for key in (*attrs, *capacity):
        if not _valid_name(key):
            raise ValueError(f"device {name}: {key!r} is not a valid attribute name")
    for key, value in attrs.items():
        if len(value) != 1 or next(iter(value)) not in ("int", "bool", "string", "version"):
            raise ValueError(f"device {name}: attribute {key} needs exactly one of "
                             "int, bool, string, version")


def _attribute(attrs: Mapping[str, Any], driver: str, name: str) -> Any:
    """An attribute's value by its name, unprefixed names being the
    driver's: ``kind`` and ``<driver>/kind`` are one attribute."""
    value = attrs.get(name)
    if value is None and "/" not in name:
        value = attrs.get(f"{driver}/{name}")
    return next(iter(value.values())) if isinstance(value, dict) and len(value) == 1 else None


def held_device(driver: str, pool: str, entry: Mapping[str, Any]) -> HeldDevice:
    """A published device entry read back into its place: this vocabulary's
    names, and NVIDIA's (``type: gpu`` or ``mig`` for a GPU without ``kind``).
    A value of the wrong type is left unknown."""
    attrs = entry.get("attributes") or {}
    if not isinstance(attrs, Mapping):
        attrs = {}

    def text(name: str) -> str | None:
        v = _attribute(attrs, driver, name)
        return v if isinstance(v, str) else None

    kind_text = text("kind") or ("gpu" if text("type") in ("gpu", "mig") else None)
    numa = _attribute(attrs, driver, f"{STD}/numaNode")
    if numa is None:
        numa = _attribute(attrs, driver, "numaNode")
    return HeldDevice(
        driver=driver, pool=pool, name=str(entry.get("name", "")),
        kind=DeviceKind(kind_text) if kind_text in ("gpu", "nic") else None,
        nvlink_domain=text("nvlinkDomain"), pcie_switch=text("pcieSwitch"),
        pcie_root=text(f"{STD}/pcieRoot"),
        numa=numa if isinstance(numa, int) and not isinstance(numa, bool) else None)
