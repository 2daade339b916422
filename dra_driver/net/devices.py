"""NIC devices of one node as ResourceSlice JSON, from the topology model,
with DRANET's attribute names (``ifName``, ``pciAddress``, ``mac``, ``mtu``,
``rdma``, ``rdmaDevice``, ``sriov``, ``isSriovVf``, ``virtual``,
``numaNode``, ``pciVendor``, ``pciDevice``, ``type``, ``encapsulation``,
``state``) unprefixed, i.e. in our driver's domain, beside the standard
placement attributes and our topology ones; link speed as capacity
``linkSpeed`` (bits a second), so a claim can ask for at least 200G.
"""

from __future__ import annotations

from typing import Any

from dra_driver.framework.publisher import Pool
from topology.model import DeviceKind, NodeTopology
from topology.resourceslice import boolean, check_entry, device_entry, integer, string

DRIVER = "net.toposerve.io"
# PCI vendor names as the PCI ID database spells them (pciVendor).
VENDORS = {"0x15b3": "Mellanox Technologies", "0x14e4": "Broadcom Inc. and subsidiaries",
           "0x8086": "Intel Corporation", "0x1d0f": "Amazon.com, Inc."}


def nic_pool(node: NodeTopology, *, node_uid: str = "") -> Pool:
    """The node's NICs as one pool named for the node, in PCI order."""
    devices: list[dict[str, Any]] = []
    for place in node.hardware.places():
        d = place.device
        if d.kind != DeviceKind.NIC:
            continue
        entry = device_entry(place, node.path)
        entry["attributes"].update({
            "pciAddress": string(d.pci_bus_id),
            "numaNode": integer(place.numa),
            "pciVendor": string(VENDORS.get(d.vendor_id, d.vendor_id)),
            "pciDevice": string(d.model),
            "type": string("device"),
            "encapsulation": string("ether"),
            "state": string("up"),
            "sriov": boolean(False),
            "isSriovVf": boolean(False),
            "virtual": boolean(False),
        })
        check_entry(entry)
        devices.append(entry)
    return Pool(name=node.name, node_name=node.name, devices=tuple(devices), node_uid=node_uid)
