"""Writing a fake sysfs tree from the model, laid out as Linux lays out
the real one, so tests and hardware-less trials run the same discovery
code as real nodes."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from toposerve.topology.model import Device, DeviceKind, NodeHardware, PcieRoot
from toposerve.topology.profiles import HardwareProfile

ROOT_PORT = ("0x8086", "0x347a", "0x060400")  # vendor, device, class: a CPU root port
SWITCH_PORT = ("0x1000", "0xc030", "0x060400")  # a PCIe switch port (PEX-class)
PCI_CLASS = {DeviceKind.GPU: "0x030200", DeviceKind.NIC: "0x020000"}


def _bus_of(bdf: str) -> tuple[str, int]:
    domain, bus, _ = bdf.split(":")
    return domain, int(bus, 16)


def _pci_dir(path: Path, vendor: str, device: str, pci_class: str, numa: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    for name, value in (("vendor", vendor), ("device", device), ("class", pci_class),
                        ("numa_node", str(numa))):
        (path / name).write_text(value + "\n")


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(target, link.parent))


class _Writer:
    def __init__(self, out: Path, pci_classes: dict[str, str]) -> None:
        self.out = out
        self.pci_classes = pci_classes  # model name -> PCI class

    def device(self, parent: Path, d: Device, numa: int) -> None:
        pci_class = self.pci_classes.get(d.model, PCI_CLASS[d.kind])
        path = parent / d.pci_bus_id
        _pci_dir(path, d.vendor_id, d.device_id, pci_class, numa)
        _link(self.out / "bus/pci/devices" / d.pci_bus_id, path)
        if d.kind == DeviceKind.NIC and d.interface:
            net = path / "net" / d.interface
            net.mkdir(parents=True)
            (net / "address").write_text(f"{d.mac or '00:00:00:00:00:00'}\n")
            (net / "mtu").write_text(f"{d.mtu or 1500}\n")
            (net / "speed").write_text(f"{d.speed_mbps if d.speed_mbps is not None else -1}\n")
            _link(net / "device", path)
            _link(self.out / "class/net" / d.interface, net)
        if d.kind == DeviceKind.NIC and d.rdma_device:
            ib = path / "infiniband" / d.rdma_device
            ib.mkdir(parents=True)
            _link(ib / "device", path)
            _link(self.out / "class/infiniband" / d.rdma_device, ib)

    def root(self, root: PcieRoot, numa: int) -> None:
        domain, bus = root.name.removeprefix("pci").split(":")
        top = self.out / "devices" / root.name
        port = 1
        for d in root.devices:
            rp = top / f"{domain}:{bus}:{port:02x}.0"
            port += 1
            _pci_dir(rp, *ROOT_PORT, numa)
            self.device(rp, d, numa)
        for sw in root.switches:
            rp = top / f"{domain}:{bus}:{port:02x}.0"
            port += 1
            _pci_dir(rp, *ROOT_PORT, numa)
            up = rp / sw.bdf
            _pci_dir(up, *SWITCH_PORT, numa)
            _, up_bus = _bus_of(sw.bdf)
            for i, d in enumerate(sw.devices):
                down = up / f"{domain}:{up_bus + 1:02x}:{i:02x}.0"
                _pci_dir(down, *SWITCH_PORT, numa)
                self.device(down, d, numa)


def write_fake_sysfs(hw: NodeHardware, out: str | Path,
                     pci_classes: dict[str, str] | None = None) -> Path:
    """Write ``hw`` as a sysfs tree under ``out`` (which must not exist or be empty)."""
    root = Path(out)
    if root.exists() and any(root.iterdir()):  # NotADirectoryError for a file
        raise FileExistsError(errno.ENOTEMPTY, "not empty", str(root))
    root.mkdir(parents=True, exist_ok=True)
    w = _Writer(root, pci_classes or {})
    for numa in hw.numa_nodes:
        node_dir = root / "devices/system/node" / f"node{numa.id}"
        node_dir.mkdir(parents=True)
        (node_dir / "cpulist").write_text(numa.cpus + "\n")
        for r in numa.roots:
            w.root(r, numa.id)
    for sub in ("bus/pci/devices", "class/net", "class/infiniband"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    return root


def write_profile_sysfs(profile: HardwareProfile, out: str | Path) -> Path:
    """A fake sysfs tree of one node of ``profile``."""
    classes = {m.model: m.pci_class for m in profile.spec.models.values()}
    return write_fake_sysfs(profile.hardware(), out, classes)
