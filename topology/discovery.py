"""Discovery of accelerators, NICs and their PCIe/NUMA placement from a
sysfs root (``/sys`` on a real node, a generated tree in tests).

Placement comes from the device's real path under ``devices/``: the first
component is the root (``pci0000:15``); when at least two bridges sit
between root port and device, the innermost switch is named by its upstream
port, the device's grandparent.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from toposerve.topology.model import (
    BDF_RE,
    Device,
    DeviceKind,
    NodeHardware,
    NumaNode,
    PcieRoot,
    PcieSwitch,
)
from toposerve.topology.profiles import DeviceModel, catalog
from toposerve.topology.quantity import parse_quantity

# PCI vendors whose display/processing-accelerator functions are accelerators.
ACCELERATOR_VENDORS = {"0x10de", "0x1002"}
ACCELERATOR_CLASS = re.compile(r"^0x(03|12)")


@dataclass
class _Found:
    bdf: str
    kind: DeviceKind
    vendor: str
    device: str
    numa: int
    root: str
    switch: str | None
    net: dict[str, str] = field(default_factory=dict)
    rdma: str | None = None


def _read(path: Path) -> str:
    return path.read_text().strip()


def _bdf_key(bdf: str) -> tuple[int, ...]:
    dom, bus, rest = bdf.split(":")
    dev, fn = rest.split(".")
    return int(dom, 16), int(bus, 16), int(dev, 16), int(fn, 16)


def _placement(sysfs: Path, bdf: str) -> tuple[str, str | None]:
    real = Path(os.path.realpath(sysfs / "bus/pci/devices" / bdf))
    parts = real.parts
    roots = [i for i, p in enumerate(parts) if p.startswith("pci")]
    if not roots:
        raise ValueError(f"{bdf}: cannot find its PCIe root in {real}")
    chain = [p for p in parts[roots[-1] + 1:] if BDF_RE.fullmatch(p)]
    switch = chain[-3] if len(chain) >= 4 else None
    return parts[roots[-1]], switch


def _pci_function(sysfs: Path, bdf: str, kind: DeviceKind) -> _Found:
    base = sysfs / "bus/pci/devices" / bdf
    numa = int(_read(base / "numa_node")) if (base / "numa_node").exists() else -1
    root, switch = _placement(sysfs, bdf)
    return _Found(bdf=bdf, kind=kind, vendor=_read(base / "vendor"),
                  device=_read(base / "device"), numa=max(numa, 0), root=root, switch=switch)


def _device_link_bdf(entry: Path) -> str | None:
    link = entry / "device"
    if not link.exists():
        return None  # virtual interface (bridge, veth, loopback)
    name = Path(os.path.realpath(link)).name
    return name if BDF_RE.fullmatch(name) else None


def _scan(sysfs: Path) -> list[_Found]:
    found: dict[str, _Found] = {}
    pci = sysfs / "bus/pci/devices"
    for entry in sorted(pci.iterdir()) if pci.exists() else []:
        cls, vendor = _read(entry / "class"), _read(entry / "vendor")
        if ACCELERATOR_CLASS.match(cls) and vendor in ACCELERATOR_VENDORS:
            found[entry.name] = _pci_function(sysfs, entry.name, DeviceKind.GPU)
    net = sysfs / "class/net"
    for entry in sorted(net.iterdir()) if net.exists() else []:
        bdf = _device_link_bdf(entry)
        if bdf is None:
            continue
        f = found.setdefault(bdf, _pci_function(sysfs, bdf, DeviceKind.NIC))
        f.net = {"interface": entry.name, "mac": _read(entry / "address"),
                 "mtu": _read(entry / "mtu"), "speed": _read(entry / "speed")}
    ib = sysfs / "class/infiniband"
    for entry in sorted(ib.iterdir()) if ib.exists() else []:
        bdf = _device_link_bdf(entry)
        if bdf in found:
            found[bdf].rdma = entry.name
    return sorted(found.values(), key=lambda f: _bdf_key(f.bdf))


def _device(f: _Found, index: int, known: dict[tuple[str, str], DeviceModel]) -> Device:
    m = known.get((f.vendor, f.device))
    model = m.model if m else f"unknown-{f.vendor}-{f.device}"
    common = dict(name=f"{f.kind.value}-{index}", kind=f.kind, model=model,
                  vendor_id=f.vendor, device_id=f.device, pci_bus_id=f.bdf)
    if f.kind == DeviceKind.GPU:
        mem = parse_quantity(m.memory) if m and m.memory else None
        return Device(**common, memory_bytes=mem)
    speed = int(f.net["speed"]) if f.net.get("speed", "-1").lstrip("-").isdigit() else -1
    return Device(**common,
                  interface=f.net.get("interface"), mac=f.net.get("mac"),
                  mtu=int(f.net["mtu"]) if f.net.get("mtu") else None,
                  speed_mbps=speed if speed >= 0 else None, rdma_device=f.rdma)


def _cpulists(sysfs: Path) -> dict[int, str]:
    nodes = sysfs / "devices/system/node"
    out: dict[int, str] = {}
    for entry in nodes.glob("node[0-9]*") if nodes.exists() else []:
        cpulist = entry / "cpulist"
        out[int(entry.name[4:])] = _read(cpulist) if cpulist.exists() else ""
    return out


def discover(sysfs: str | Path = "/sys",
             known: dict[tuple[str, str], DeviceModel] | None = None) -> NodeHardware:
    """The node's hardware as the model describes it."""
    root = Path(sysfs)
    if not (root / "bus/pci/devices").exists() and not (root / "class/net").exists():
        raise FileNotFoundError(f"{root} does not look like a sysfs tree (no bus/pci/devices)")
    known = catalog() if known is None else known
    counters = {DeviceKind.GPU: 0, DeviceKind.NIC: 0}
    tree: dict[int, dict[str, dict[str | None, list[Device]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list)))
    for f in _scan(root):
        d = _device(f, counters[f.kind], known)
        counters[f.kind] += 1
        tree[f.numa][f.root][f.switch].append(d)
    cpus = _cpulists(root)
    numas = []
    for numa_id in sorted(set(cpus) | set(tree)):
        roots = []
        for root_name in sorted(tree[numa_id], key=lambda r: _bdf_key(r[3:] + ":00.0")):
            by_switch = tree[numa_id][root_name]
            switches = tuple(PcieSwitch(bdf=s, devices=tuple(by_switch[s]))
                             for s in sorted((s for s in by_switch if s), key=_bdf_key))
            roots.append(PcieRoot(name=root_name, switches=switches,
                                  devices=tuple(by_switch.get(None, []))))
        numas.append(NumaNode(id=numa_id, cpus=cpus.get(numa_id, ""), roots=tuple(roots)))
    return NodeHardware(numa_nodes=tuple(numas))
