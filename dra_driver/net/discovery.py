"""The node's NICs, as the NIC driver publishes them: PCI network functions
from sysfs (placement, SR-IOV, RDMA devices and their uverbs character
devices), joined with the live links netlink shows (name, MAC, MTU, state,
addresses), then filtered.

PCI first, as DRANET does: a PCI NIC stays a device while its interface is
away in a pod's network namespace (the host no longer sees the link, the
PCI function is still there), so an allocated device never drops out of the
node's slice. Interfaces without a PCI function are virtual (veth, bridge,
...) and only published when the filters keep virtual interfaces.

Two edges: ``scan_pci`` reads sysfs (root configurable, a generated tree in
tests), ``read_links`` reads netlink (a namespace name for tests); ``join``
in between is a pure function.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from ipaddress import ip_interface
from pathlib import Path
from typing import Any

from toposerve.topology.discovery import _placement
from toposerve.topology.model import BDF_RE

# PCI base class 0x02 is "network controller" (Ethernet 0x0200, InfiniBand
# 0x0207, ...): every function of it is a NIC candidate.
NETWORK_CLASS = re.compile(r"^0x02")
IFF_UP, IFF_LOOPBACK = 0x1, 0x8
# ARPHRD_* link types by the names iproute2 prints for them.
ENCAPSULATION = {1: "ether", 32: "infiniband", 772: "loopback", 776: "sit", 65534: "none"}


@dataclass(frozen=True)
class PciNic:
    """A PCI network function, as sysfs describes it."""

    bdf: str
    vendor: str
    device: str
    numa: int
    root: str
    switch: str | None
    netdevs: tuple[str, ...] = ()       # its interfaces' names, as sysfs lists them
    speed_mbps: int | None = None       # of its first interface; None when unknown (-1)
    sriov_total_vfs: int = 0            # > 0: a physical function that can make VFs
    sriov_num_vfs: int = 0
    physfn: str | None = None           # a VF: its PF's BDF
    rdma_device: str | None = None      # e.g. mlx5_0
    uverbs: tuple[str, ...] = ()        # its uverbs char devices, e.g. ("uverbs0",)


@dataclass(frozen=True)
class LinkInfo:
    """A link as netlink shows it in one namespace."""

    name: str
    index: int
    mac: str
    mtu: int
    state: str                          # operstate, lower case: up, down, unknown, ...
    encapsulation: str                  # ether, infiniband, loopback, ...
    kind: str | None                    # IFLA_INFO_KIND: veth, bridge, ...; None for hardware
    loopback: bool
    ipv4: tuple[str, ...] = ()          # global unicast addresses as CIDRs
    ipv6: tuple[str, ...] = ()
    admin_up: bool = False              # IFF_UP: brought up (operstate says if it has carrier)


@dataclass(frozen=True)
class NetFilters:
    """Which interfaces become devices. By default no loopback, not the
    interface holding the default route (the node's own uplink) and no
    virtual interface; ``include``/``exclude`` are regular expressions on
    the interface name (a NIC away in a pod is matched by the name it had)."""

    loopback: bool = False
    default_route: bool = False
    virtual: bool = False
    include: str | None = None
    exclude: str | None = None

    def keep_name(self, name: str | None) -> bool:
        if name is None:
            return self.include is None
        if self.include is not None and not re.fullmatch(self.include, name):
            return False
        return self.exclude is None or not re.fullmatch(self.exclude, name)


@dataclass(frozen=True)
class Nic:
    """One device to publish: a PCI function (``pci``) and/or a live link."""

    name: str                           # the DRA device name
    pci: PciNic | None
    link: LinkInfo | None
    if_name: str | None                 # the link's name, or the one sysfs or a record says
    char_devices: tuple[str, ...] = field(default=())  # paths under /dev for RDMA

    @property
    def virtual(self) -> bool:
        return self.pci is None


def _read(path: Path) -> str:
    return path.read_text().strip()


def _int(path: Path, default: int = 0) -> int:
    try:
        return int(_read(path))
    except (OSError, ValueError):
        return default


def device_name_for_pci(bdf: str) -> str:
    """``0000:17:00.1`` -> ``pci-0000-17-00-1``: a DNS label that stays the
    same whatever the interface is called or wherever it is."""
    return "pci-" + re.sub(r"[:.]", "-", bdf)


def device_name_for_link(name: str) -> str:
    """A virtual interface's device name: its name as a DNS label."""
    label = re.sub(r"[^a-z0-9-]", "-", name.lower()).strip("-")
    return f"net-{label}"[:63].rstrip("-")


def _rdma(sysfs: Path) -> tuple[dict[str, str], dict[str, list[str]]]:
    """BDF -> RDMA device, and RDMA device -> its uverbs char devices."""
    by_bdf: dict[str, str] = {}
    ib = sysfs / "class/infiniband"
    for entry in sorted(ib.iterdir()) if ib.is_dir() else []:
        bdf = _pci_of(entry / "device")
        if bdf is not None:
            by_bdf.setdefault(bdf, entry.name)
    verbs: dict[str, list[str]] = {}
    uv = sysfs / "class/infiniband_verbs"
    for entry in sorted(uv.iterdir()) if uv.is_dir() else []:
        if (entry / "ibdev").exists():
            verbs.setdefault(_read(entry / "ibdev"), []).append(entry.name)
    return by_bdf, verbs


def _pci_of(path: Path) -> str | None:
    """The BDF of the PCI function a sysfs device is, or sits under (a
    virtio NIC's interface hangs off ``virtio0``, a child of the function)."""
    for part in reversed(Path(os.path.realpath(path)).parts):
        if BDF_RE.fullmatch(part):
            return part
    return None


def _netdevs(sysfs: Path) -> dict[str, list[str]]:
    """BDF -> the names of its interfaces in ``class/net``."""
    out: dict[str, list[str]] = {}
    net = sysfs / "class/net"
    for entry in sorted(net.iterdir()) if net.is_dir() else []:
        bdf = _pci_of(entry / "device") if (entry / "device").exists() else None
        if bdf is not None:
            out.setdefault(bdf, []).append(entry.name)
    return out


def scan_pci(sysfs: Path) -> list[PciNic]:
    """Every PCI network function under ``sysfs``, in PCI order."""
    pci = sysfs / "bus/pci/devices"
    rdma, verbs = _rdma(sysfs)
    by_bdf = _netdevs(sysfs)
    out = []
    for entry in sorted(pci.iterdir()) if pci.is_dir() else []:
        if not (entry / "class").exists() or not NETWORK_CLASS.match(_read(entry / "class")):
            continue
        root, switch = _placement(sysfs, entry.name)
        netdevs = tuple(by_bdf.get(entry.name, ()))
        speed = _int(sysfs / "class/net" / netdevs[0] / "speed", -1) if netdevs else -1
        physfn = entry / "physfn"
        rdev = rdma.get(entry.name)
        out.append(PciNic(
            bdf=entry.name, vendor=_read(entry / "vendor"), device=_read(entry / "device"),
            numa=max(_int(entry / "numa_node", -1), 0), root=root, switch=switch,
            netdevs=netdevs, speed_mbps=speed if speed >= 0 else None,
            sriov_total_vfs=_int(entry / "sriov_totalvfs"),
            sriov_num_vfs=_int(entry / "sriov_numvfs"),
            physfn=Path(os.path.realpath(physfn)).name if physfn.exists() else None,
            rdma_device=rdev, uverbs=tuple(verbs.get(rdev, ())) if rdev else ()))
    return out


def _link_info(msg: Any, addrs: Iterable[Any]) -> LinkInfo:
    v4: list[str] = []
    v6: list[str] = []
    for a in addrs:
        cidr = ip_interface(f"{a.get('IFA_ADDRESS')}/{a['prefixlen']}")
        ip = cidr.ip
        if ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_unspecified:
            continue  # only unicast addresses that mean something off the link
        (v4 if cidr.version == 4 else v6).append(str(cidr))
    return LinkInfo(
        name=str(msg.get("IFLA_IFNAME")), index=int(msg["index"]),
        mac=str(msg.get("IFLA_ADDRESS") or "00:00:00:00:00:00").lower(),
        mtu=int(msg.get("IFLA_MTU") or 0),
        state=str(msg.get("IFLA_OPERSTATE") or "unknown").lower(),
        encapsulation=ENCAPSULATION.get(int(msg["ifi_type"]), str(msg["ifi_type"])),
        kind=msg.get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND"),
        loopback=bool(msg["flags"] & IFF_LOOPBACK), admin_up=bool(msg["flags"] & IFF_UP),
        ipv4=tuple(sorted(v4)), ipv6=tuple(sorted(v6)))


def read_links(netns: str | None = None) -> tuple[list[LinkInfo], set[str]]:
    """The namespace's links (the caller's own when ``netns`` is None) and
    the names of those holding a default route (IPv4 or IPv6)."""
    from pyroute2 import IPRoute, NetNS  # type: ignore[import-untyped]

    nl: Any = IPRoute() if netns is None else NetNS(netns)
    try:
        addrs: dict[int, list[Any]] = {}
        for a in nl.get_addr():
            addrs.setdefault(int(a["index"]), []).append(a)
        links = [_link_info(m, addrs.get(int(m["index"]), [])) for m in nl.get_links()]
        by_index = {link.index: link.name for link in links}
        gateways: set[str] = set()
        for family in (socket.AF_INET, socket.AF_INET6):
            for r in nl.get_routes(family=family, table=254):
                if r["dst_len"] != 0:
                    continue
                oifs = [r.get("RTA_OIF"), *(h["oif"] for h in r.get("RTA_MULTIPATH") or [])]
                gateways.update(by_index[i] for i in oifs if i in by_index)
        return links, gateways
    finally:
        nl.close()


def join(pcis: Iterable[PciNic], links: Iterable[LinkInfo], gateways: set[str],
         filters: NetFilters, dev_root: Path = Path("/dev"),
         away: dict[str, str] | None = None) -> list[Nic]:
    """The devices to publish. ``away`` maps a device name to the host name
    of its interface while it is in a pod (from the hand-off records), so
    the filters judge it by that name and ``ifName`` stays as it was."""
    away = away or {}
    live = {link.name: link for link in links}
    claimed: set[str] = set()
    out: list[Nic] = []
    for p in pcis:
        name = device_name_for_pci(p.bdf)
        link = next((live[n] for n in p.netdevs if n in live), None)
        if_name = link.name if link else away.get(name) or (p.netdevs[0] if p.netdevs else None)
        claimed.update(p.netdevs)
        if if_name in gateways and not filters.default_route:
            continue
        if not filters.keep_name(if_name):
            continue
        chars = tuple(str(dev_root / "infiniband" / u) for u in p.uverbs)
        out.append(Nic(name=name, pci=p, link=link, if_name=if_name, char_devices=chars))
    for link in sorted(live.values(), key=lambda x: x.name):
        if link.name in claimed:
            continue
        if link.loopback and not filters.loopback:
            continue
        if not link.loopback and not filters.virtual:
            continue
        if link.name in gateways and not filters.default_route:
            continue
        if not filters.keep_name(link.name):
            continue
        out.append(Nic(name=device_name_for_link(link.name), pci=None, link=link,
                       if_name=link.name))
    return out


def discover(sysfs: Path, filters: NetFilters, *, netns: str | None = None,
             dev_root: Path = Path("/dev"), away: dict[str, str] | None = None) -> list[Nic]:
    """sysfs and netlink, joined and filtered."""
    links, gateways = read_links(netns)
    return join(scan_pci(sysfs), links, gateways, filters, dev_root, away)
