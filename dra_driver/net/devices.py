"""NIC devices of one node as ResourceSlice JSON, with DRANET's attribute
names (``ifName``, ``pciAddress``, ``mac``, ``mtu``, ``rdma``, ``rdmaDevice``,
``sriov``, ``sriovVfs``, ``isSriovVf``, ``virtual``, ``numaNode``,
``pciVendor``, ``pciDevice``, ``type``, ``encapsulation``, ``state``,
``ipv4``, ``ipv6``) unprefixed, i.e. in our driver's domain, beside the
standard placement attributes and our topology ones; link speed as capacity
``linkSpeed`` (bits a second), so a claim can ask for at least 200G.

Two sources, one vocabulary: ``nic_pool`` from the topology model (what
``driver simulate`` publishes for kwok nodes), ``discovered_pool`` from what
``discovery`` found on a real node.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from toposerve.dra_driver.net.discovery import Nic
from toposerve.dra_driver.resourceslice import Pool
from toposerve.topology.model import Device, DeviceKind, DevicePlace, DomainPath, NodeTopology
from toposerve.topology.profiles import DeviceModel, catalog
from toposerve.topology.slice_attributes import (
    MAX_STRING,
    boolean,
    check_entry,
    device_entry,
    integer,
    string,
)

DRIVER = "net.toposerve.io"
# PCI vendor names as the PCI ID database spells them (pciVendor).
VENDORS = {"0x15b3": "Mellanox Technologies", "0x14e4": "Broadcom Inc. and subsidiaries",
           "0x8086": "Intel Corporation", "0x1d0f": "Amazon.com, Inc.",
           "0x1af4": "Red Hat, Inc."}
MAC = re.compile(r"^([0-9a-f]{2}:){5}[0-9a-f]{2}$")  # an Ethernet MAC (IPoIB's are longer)


def _is_mac(mac: str) -> bool:
    return MAC.fullmatch(mac) is not None


def _dranet(d: Device, numa: int, *, type_: str, encapsulation: str, state: str,
            sriov_vfs: int | None, is_vf: bool) -> dict[str, Any]:
    """The DRANET-named attributes of a PCI NIC (``device_entry`` adds ifName,
    mac, mtu, rdma, rdmaDevice and the placement)."""
    attrs = {
        "pciAddress": string(d.pci_bus_id),
        "numaNode": integer(numa),
        "pciVendor": string(VENDORS.get(d.vendor_id, d.vendor_id)),
        "pciDevice": string(d.model[:MAX_STRING]),
        "type": string(type_),
        "encapsulation": string(encapsulation),
        "state": string(state),
        "sriov": boolean(sriov_vfs is not None),
        "isSriovVf": boolean(is_vf),
        "virtual": boolean(False),
    }
    if sriov_vfs is not None:
        attrs["sriovVfs"] = integer(sriov_vfs)
    return attrs


def nic_pool(node: NodeTopology, *, node_uid: str = "") -> Pool:
    """The node's NICs as one pool named for the node, in PCI order."""
    devices: list[dict[str, Any]] = []
    for place in node.hardware.places():
        d = place.device
        if d.kind != DeviceKind.NIC:
            continue
        entry = device_entry(place, node.path)
        entry["attributes"].update(_dranet(d, place.numa, type_="device",
                                           encapsulation="ether", state="up",
                                           sriov_vfs=None, is_vf=False))
        check_entry(entry)
        devices.append(entry)
    return Pool(name=node.name, node_name=node.name, devices=tuple(devices), node_uid=node_uid)


@cache
def _catalog() -> dict[tuple[str, str], DeviceModel]:
    return catalog()


def _addresses(cidrs: tuple[str, ...]) -> dict[str, Any]:
    """As many CIDRs, comma-separated, as fit in one attribute string."""
    out = ""
    for c in cidrs:
        joined = f"{out},{c}" if out else c
        if len(joined) > MAX_STRING:
            break
        out = joined
    return string(out)


def _pci_entry(nic: Nic, path: DomainPath) -> dict[str, Any]:
    p, link = nic.pci, nic.link
    assert p is not None
    m = _catalog().get((p.vendor, p.device))
    mac = link.mac if link is not None else None
    d = Device(name=nic.name, kind=DeviceKind.NIC,
               model=m.model if m else f"unknown-{p.vendor}-{p.device}",
               vendor_id=p.vendor, device_id=p.device, pci_bus_id=p.bdf,
               interface=nic.if_name, speed_mbps=p.speed_mbps,
               mtu=link.mtu if link is not None and link.mtu >= 68 else None,
               mac=mac if mac is not None and _is_mac(mac) else None,
               rdma_device=p.rdma_device)
    entry = device_entry(DevicePlace(device=d, numa=p.numa, root=p.root, switch=p.switch), path)
    # A NIC away in a pod has no link here: "away" says where it is.
    entry["attributes"].update(_dranet(
        d, p.numa, type_=(link.kind or "device") if link else "device",
        encapsulation=link.encapsulation if link else "ether",
        state=link.state if link else "away",
        sriov_vfs=p.sriov_num_vfs if p.sriov_total_vfs > 0 else None,
        is_vf=p.physfn is not None))
    return entry


def _virtual_entry(nic: Nic) -> dict[str, Any]:
    link = nic.link
    assert link is not None
    attrs: dict[str, Any] = {
        "ifName": string(link.name), "mtu": integer(link.mtu),
        "type": string(link.kind or ("loopback" if link.loopback else "device")),
        "encapsulation": string(link.encapsulation), "state": string(link.state),
        "virtual": boolean(True), "rdma": boolean(False), "sriov": boolean(False),
        "isSriovVf": boolean(False),
    }
    if _is_mac(link.mac):
        attrs["mac"] = string(link.mac)
    return {"name": nic.name, "attributes": attrs}


def discovered_pool(node_name: str, path: DomainPath, nics: list[Nic], *,
                    node_uid: str = "") -> Pool:
    """What discovery found, as one pool named for the node, PCI NICs first."""
    devices = []
    for nic in nics:
        entry = _pci_entry(nic, path) if nic.pci is not None else _virtual_entry(nic)
        if nic.link is not None:
            if nic.link.ipv4:
                entry["attributes"]["ipv4"] = _addresses(nic.link.ipv4)
            if nic.link.ipv6:
                entry["attributes"]["ipv6"] = _addresses(nic.link.ipv6)
        check_entry(entry)
        devices.append(entry)
    return Pool(name=node_name, node_name=node_name, devices=tuple(devices), node_uid=node_uid)
