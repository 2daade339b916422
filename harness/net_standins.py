"""NIC stand-ins for tests and benchmarks without NICs: a network namespace
of our own holding one veth end per NIC of a hardware model (named as the
model names its interface; the peer end, without a PCI identity, is a
virtual interface), and a fake sysfs tree that gives those names their PCI
functions, RDMA devices and uverbs character devices. Addresses come from
198.18.0.0/15 only; nothing here touches the host's own namespace."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toposerve.topology.model import (
    Device,
    DeviceKind,
    NodeHardware,
    NumaNode,
    PcieRoot,
    PcieSwitch,
)
from toposerve.topology.sysfs import write_fake_sysfs

PEER_SUFFIX = "p"  # enp22s0 <-> enp22s0p


@dataclass(frozen=True)
class StandIns:
    netns: str
    sysfs: Path
    dev: Path
    interfaces: tuple[str, ...]  # the NICs' interface names, in PCI order

    def ns(self) -> Any:
        from pyroute2 import NetNS  # type: ignore[import-untyped]

        return NetNS(self.netns)


def many_nics(count: int, per_switch: int = 8) -> NodeHardware:
    """A node of ``count`` ConnectX-7-like NICs (RDMA mlx5_<i>), ``per_switch``
    under each PCIe switch, one switch per root."""
    switches = []
    for s in range(0, count, per_switch):
        bus = 0x10 + (s // per_switch) * 0x10
        devs = tuple(Device(name=f"nic-{i}", kind=DeviceKind.NIC, model="ConnectX-7",
                            vendor_id="0x15b3", device_id="0x1021",
                            pci_bus_id=f"0000:{bus + 3 + i - s:02x}:00.0",
                            interface=f"ens{i}np0", speed_mbps=400000, mtu=1500,
                            mac=f"02:00:00:00:{i // 256:02x}:{i % 256:02x}",
                            rdma_device=f"mlx5_{i}")
                     for i in range(s, min(s + per_switch, count)))
        switches.append(PcieRoot(name=f"pci0000:{bus:02x}", switches=(
            PcieSwitch(bdf=f"0000:{bus + 1:02x}:00.0", devices=devs),)))
    return NodeHardware(numa_nodes=(NumaNode(id=0, cpus="0-7", roots=tuple(switches)),))


def _uverbs(sysfs: Path, dev: Path, hw: NodeHardware) -> None:
    """``class/infiniband_verbs/uverbs<i>/ibdev`` and ``/dev/infiniband``
    stand-ins (plain files: nothing opens them)."""
    (dev / "infiniband").mkdir(parents=True, exist_ok=True)
    (dev / "infiniband" / "rdma_cm").touch()
    rdma = [d.rdma_device for d in hw.devices(DeviceKind.NIC) if d.rdma_device]
    for i, name in enumerate(rdma):
        verbs = sysfs / "class/infiniband_verbs" / f"uverbs{i}"
        verbs.mkdir(parents=True)
        (verbs / "ibdev").write_text(name + "\n")
        (dev / "infiniband" / f"uverbs{i}").touch()


def make_sriov(sysfs: Path, pf_bdf: str, vf_bdf: str, vf_ifname: str, total: int = 8) -> None:
    """Make ``pf_bdf`` an SR-IOV physical function with one VF (a new PCI
    function beside it with a ``physfn`` link and interface ``vf_ifname``)."""
    pf = Path(os.path.realpath(sysfs / "bus/pci/devices" / pf_bdf))
    (pf / "sriov_totalvfs").write_text(f"{total}\n")
    (pf / "sriov_numvfs").write_text("1\n")
    vf = pf.parent / vf_bdf
    vf.mkdir()
    for name in ("vendor", "device", "class", "numa_node"):
        (vf / name).write_text((pf / name).read_text())
    (vf / "physfn").symlink_to(os.path.relpath(pf, vf))
    (pf / "virtfn0").symlink_to(os.path.relpath(vf, pf))
    (sysfs / "bus/pci/devices" / vf_bdf).symlink_to(
        os.path.relpath(vf, sysfs / "bus/pci/devices"))
    net = vf / "net" / vf_ifname
    net.mkdir(parents=True)
    for name, value in (("address", "02:00:00:00:ff:01"), ("mtu", "1500"), ("speed", "-1")):
        (net / name).write_text(value + "\n")
    (net / "device").symlink_to(os.path.relpath(vf, net))
    (sysfs / "class/net" / vf_ifname).symlink_to(os.path.relpath(net, sysfs / "class/net"))


PREFIX = "ts-nic-"  # then the creating process's pid: a dead creator's namespace is stale


def remove_stale() -> list[str]:
    """Remove the stand-in namespaces of processes that are gone (a run
    killed before its cleanup); another live run's are left alone."""
    from pyroute2 import netns

    gone = []
    for name in netns.listnetns():
        pid = name.removeprefix(PREFIX).split("-")[0]
        if name.startswith(PREFIX) and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            netns.remove(name)
            gone.append(name)
    return gone


@contextlib.contextmanager
def stand_ins(tmp: Path, hw: NodeHardware, *, up: bool = True) -> Iterator[StandIns]:
    """The namespace and trees for ``hw``; the namespace is removed on exit."""
    from pyroute2 import NetNS, netns

    sysfs = write_fake_sysfs(hw, tmp / "sysfs")
    dev = tmp / "dev"
    _uverbs(sysfs, dev, hw)
    names = tuple(d.interface for d in hw.devices(DeviceKind.NIC) if d.interface)
    remove_stale()
    name = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:6]}"
    netns.create(name)
    try:
        ns = NetNS(name)
        try:
            for ifname in names:
                ns.link("add", ifname=ifname, kind="veth", peer={"ifname": ifname + PEER_SUFFIX})
                if up:
                    for end in (ifname, ifname + PEER_SUFFIX):
                        ns.link("set", index=ns.link_lookup(ifname=end)[0], state="up")
        finally:
            ns.close()
        yield StandIns(netns=name, sysfs=sysfs, dev=dev, interfaces=names)
    finally:
        netns.remove(name)  # its veth pairs go with it
