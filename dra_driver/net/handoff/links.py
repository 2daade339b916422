"""The netlink edge of the mover (pyroute2): one network namespace's links,
found by name or MAC, moved to another namespace (renamed in the same
message, so the kernel never shows the link half-moved), configured and
reset. Every call is idempotent: setting what is already set is a no-op."""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Interface, IPv6Interface, ip_interface
from types import TracebackType
from typing import Any

from toposerve.dra_driver.net.config import Route

IfAddress = IPv4Interface | IPv6Interface
ZERO_MAC = "00:00:00:00:00:00"


@dataclass(frozen=True)
class Link:
    index: int
    name: str
    mac: str
    mtu: int
    up: bool
    addresses: frozenset[IfAddress]


def _is_link_local(a: IfAddress) -> bool:
    # the kernel adds fe80:: itself when an IPv6 link comes up: not ours to manage
    return a.version == 6 and a.ip.is_link_local


CLONE_NEWNET = 0x40000000


def netlink_socket_in(path: str) -> int:
    """A route netlink socket of the namespace at ``path``: made by a thread
    that enters it (setns moves only the calling thread), so ours stays put.
    pyroute2's NetNS forks a helper for the same, at 5-10 times the cost."""
    out: dict[str, int] = {}

    def work() -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
                out["errno"] = ctypes.get_errno()
                return
            out["fd"] = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM,
                                      0).detach()  # 0: NETLINK_ROUTE
        finally:
            os.close(fd)

    t = threading.Thread(target=work, name="netns-socket")
    t.start()
    t.join()
    if "fd" not in out:
        code = out.get("errno", 0)
        raise OSError(code, f"cannot enter network namespace {path}: {os.strerror(code)}")
    return out["fd"]


class Namespace:
    """Netlink to one namespace: ``path=None`` is the caller's own (the host's,
    for the CNI plugin and the driver)."""

    def __init__(self, path: str | None = None) -> None:
        # imported here: reading records and journals needs no netlink
        from pyroute2 import IPRoute  # type: ignore[import-untyped]

        self.path = path
        self._nl: Any = IPRoute() if path is None else IPRoute(fileno=netlink_socket_in(path))

    def __enter__(self) -> Namespace:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._nl.close()

    def _link(self, msg: Any) -> Link:
        addrs = frozenset(
            ip_interface(f"{a.get('IFA_ADDRESS')}/{a['prefixlen']}")
            for a in self._nl.get_addr(index=msg["index"]))
        return Link(index=int(msg["index"]), name=str(msg.get("IFLA_IFNAME")),
                    mac=str(msg.get("IFLA_ADDRESS") or ZERO_MAC).lower(),
                    mtu=int(msg.get("IFLA_MTU") or 0),
                    up=bool(msg["flags"] & 1), addresses=addrs)

    def get(self, index: int) -> Link:
        return self._link(self._nl.link("get", index=index)[0])

    def _still_there(self, index: int) -> Link | None:
        """The link, or None when it went since it was looked up (a namespace
        being torn down deletes its veth peers' other ends meanwhile)."""
        from pyroute2.netlink.exceptions import NetlinkError  # type: ignore[import-untyped]

        try:
            return self.get(index)
        except NetlinkError as err:
            if err.code != errno.ENODEV:
                raise
            return None

    def find(self, name: str, mac: str | None = None) -> Link | None:
        """The link called ``name`` (with ``mac``, when one is given), else the
        one link with ``mac``: a link the kernel renamed on its way (a move
        whose new name was taken, a namespace that went away)."""
        idx = self._nl.link_lookup(ifname=name)
        named = self._still_there(idx[0]) if idx else None
        if mac is None or mac == ZERO_MAC or (named is not None and named.mac == mac):
            return named
        return self.by_mac(mac)  # the name is another link's, or nobody's

    def by_mac(self, mac: str) -> Link | None:
        """The one link with this MAC (none if two share it, as VFs may)."""
        if mac == ZERO_MAC:
            return None
        same = [m for m in self._nl.get_links()
                if str(m.get("IFLA_ADDRESS") or "").lower() == mac.lower()]
        return self._link(same[0]) if len(same) == 1 else None

    def add_veth(self, name: str, mac: str, mtu: int, peer: str, peer_ns: Namespace) -> Link:
        """A veth pair, ``name`` here and ``peer`` in ``peer_ns`` (NIC
        stand-ins: this kernel has no dummy links)."""
        fd = os.open(peer_ns.path or f"/proc/{os.getpid()}/ns/net", os.O_RDONLY)
        try:
            self._nl.link("add", ifname=name, kind="veth", address=mac, mtu=mtu,
                          peer={"ifname": peer, "net_ns_fd": fd})
        finally:
            os.close(fd)
        found = self.find(name)
        assert found is not None
        return found

    def delete(self, link: Link) -> None:
        self._nl.link("del", index=link.index)

    def move(self, link: Link, target: Namespace, name: str) -> None:
        """Into ``target`` under ``name``, in one message (the kernel takes the
        link down and drops its addresses on the way)."""
        fd = os.open(target.path or f"/proc/{os.getpid()}/ns/net", os.O_RDONLY)
        try:
            self._nl.link("set", index=link.index, net_ns_fd=fd, ifname=name)
        finally:
            os.close(fd)

    def set_link(self, link: Link, *, mtu: int | None = None, up: bool | None = None,
                 name: str | None = None) -> None:
        changes: dict[str, Any] = {}
        if mtu is not None and mtu != link.mtu:
            changes["mtu"] = mtu
        if name is not None and name != link.name:
            if link.up:  # the kernel renames only a link that is down
                self._nl.link("set", index=link.index, state="down")
            changes["ifname"] = name
        if changes:
            self._nl.link("set", index=link.index, **changes)
        if up is not None and (up != link.up or "ifname" in changes):
            self._nl.link("set", index=link.index, state="up" if up else "down")

    def set_addresses(self, link: Link, wanted: Iterable[IfAddress]) -> None:
        """Exactly ``wanted`` (IPv6 link-local aside)."""
        want = set(wanted)
        for a in sorted(link.addresses - want, key=str):
            if not _is_link_local(a):
                self._nl.addr("del", index=link.index, address=str(a.ip),
                              prefixlen=a.network.prefixlen)
        for a in sorted(want - link.addresses, key=str):
            extra = {"flags": 0x02} if a.version == 6 else {}  # IFA_F_NODAD: usable at once
            self._nl.addr("add", index=link.index, address=str(a.ip),
                          prefixlen=a.network.prefixlen, **extra)

    def set_routes(self, link: Link, routes: Sequence[Route]) -> None:
        for r in routes:
            family = socket.AF_INET if r.destination.version == 4 else socket.AF_INET6
            spec: dict[str, Any] = {"family": family, "oif": link.index,
                                    "dst": str(r.destination.network_address),
                                    "dst_len": r.destination.prefixlen}
            if r.gateway is not None:
                spec["gateway"] = str(r.gateway)
            self._nl.route("replace", **spec)

    def routes_of(self, link: Link) -> list[tuple[str, str | None]]:
        """(destination CIDR, gateway) of the link's routes, kernel ones aside."""
        out = []
        for family in (socket.AF_INET, socket.AF_INET6):
            for r in self._nl.get_routes(family=family, oif=link.index):
                if r.get("proto") == 2 or r.get("type") != 1:  # kernel-made / not unicast
                    continue
                dst = r.get("RTA_DST") or ("0.0.0.0" if family == socket.AF_INET else "::")
                out.append((f"{dst}/{r['dst_len']}", r.get("RTA_GATEWAY")))
        return out
