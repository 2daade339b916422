"""Our CNI plugin (spec 1.0.0): each pod gets a veth pair of its own, both
ends inside the pod's network namespace, and a 127.x/32 address on
``eth0``. Nothing is attached to the host's network, so every packet a pod
sends stays on the machine (the network rule of this workplace).

containerd runs it as an executable (``CNI_COMMAND`` and friends in the
environment, the network config on stdin, the result on stdout)."""

from __future__ import annotations

import ipaddress
import json
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

CNI_VERSION = "1.0.0"
SUPPORTED = ["0.4.0", "1.0.0"]
PLUGIN_TYPE = "toposerve-veth"
PEER_SUFFIX = "p"  # eth0 <-> eth0p


class CniError(Exception):
    def __init__(self, code: int, msg: str) -> None:
        super().__init__(msg)
        self.code, self.msg = code, msg


@dataclass(frozen=True)
class NetConf:
    subnet: ipaddress.IPv4Network
    data_dir: Path


def parse_conf(doc: Mapping[str, Any]) -> NetConf:
    try:
        subnet = ipaddress.IPv4Network(doc["subnet"])
        data_dir = Path(doc["dataDir"])
    except (KeyError, ValueError) as err:
        raise CniError(7, f"bad network config: {err!r} (need subnet and dataDir)") from None
    if not subnet.is_loopback:
        raise CniError(7, f"subnet {subnet} is not loopback; pods must get 127.x addresses")
    return NetConf(subnet=subnet, data_dir=data_dir)


def first_free(subnet: ipaddress.IPv4Network, taken: Iterable[str]) -> ipaddress.IPv4Address:
    """The lowest host address of ``subnet`` not in ``taken`` (.1 is left out,
    like a gateway would be, so pod IPs never look like the node's)."""
    used = set(taken)
    for ip in subnet.hosts():
        if int(ip) & 0xFF != 1 and str(ip) not in used:
            return ip
    raise CniError(11, f"no free address left in {subnet}")


class Ipam:
    """One file per address, named by the address and holding the container
    ID; O_EXCL makes a claim atomic between concurrent ADDs."""

    def __init__(self, conf: NetConf) -> None:
        self.subnet, self.dir = conf.subnet, conf.data_dir

    def _owned(self) -> dict[str, str]:
        if not self.dir.is_dir():
            return {}
        return {p.name: p.read_text().strip() for p in self.dir.iterdir() if p.is_file()}

    def lookup(self, container_id: str) -> str | None:
        return next((ip for ip, cid in self._owned().items() if cid == container_id), None)

    def allocate(self, container_id: str) -> str:
        if (ip := self.lookup(container_id)) is not None:
            return ip
        self.dir.mkdir(parents=True, exist_ok=True)
        while True:
            ip = str(first_free(self.subnet, self._owned()))
            try:
                fd = os.open(self.dir / ip, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                continue  # another ADD took it meanwhile
            with os.fdopen(fd, "w") as f:
                f.write(container_id)
            return ip

    def release(self, container_id: str) -> None:
        for ip, cid in self._owned().items():
            if cid == container_id:
                (self.dir / ip).unlink(missing_ok=True)


def _open(netns: str) -> Any:
    # imported here: VERSION calls and the node's own imports of this module need no netlink
    from pyroute2 import NetNS  # type: ignore[import-untyped]

    return NetNS(netns)


def _add_links(netns: str, ifname: str, ip: str) -> str:
    """Make the pair (if not there yet), address and raise it; returns eth0's MAC."""
    ns = _open(netns)
    try:
        if not ns.link_lookup(ifname=ifname):
            ns.link("add", ifname=ifname, kind="veth", peer={"ifname": ifname + PEER_SUFFIX})
        idx = ns.link_lookup(ifname=ifname)[0]
        have = {a.get("IFA_ADDRESS") for a in ns.get_addr(index=idx)}
        if ip not in have:
            ns.addr("add", index=idx, address=ip, prefixlen=32)
        ns.link("set", index=ns.link_lookup(ifname=ifname + PEER_SUFFIX)[0], state="up")
        ns.link("set", index=idx, state="up")
        return str(ns.link("get", index=idx)[0].get("IFLA_ADDRESS"))
    finally:
        ns.close()


def _del_links(netns: str, ifname: str) -> None:
    if not netns or not Path(netns).exists():
        return  # the namespace went first: its links went with it
    ns = _open(netns)
    try:
        for idx in ns.link_lookup(ifname=ifname):
            ns.link("del", index=idx)  # deleting one end deletes the pair
    finally:
        ns.close()


def _has_address(netns: str, ifname: str, ip: str) -> bool:
    ns = _open(netns)
    try:
        idx = ns.link_lookup(ifname=ifname)
        return bool(idx) and ip in {a.get("IFA_ADDRESS") for a in ns.get_addr(index=idx[0])}
    finally:
        ns.close()


def result(version: str, ifname: str, mac: str, netns: str, ip: str) -> dict[str, Any]:
    """The ADD result: containerd takes the pod IP from ``eth0``'s entry."""
    return {"cniVersion": version,
            "interfaces": [{"name": ifname, "mac": mac, "sandbox": netns}],
            "ips": [{"address": f"{ip}/32", "interface": 0}],
            "routes": [], "dns": {}}


def run(env: Mapping[str, str], conf_doc: Mapping[str, Any]) -> dict[str, Any] | None:
    command = env.get("CNI_COMMAND", "")
    version = str(conf_doc.get("cniVersion", CNI_VERSION))
    if command == "VERSION":
        return {"cniVersion": CNI_VERSION, "supportedVersions": SUPPORTED}
    conf = parse_conf(conf_doc)
    cid, netns, ifname = env.get("CNI_CONTAINERID", ""), env.get("CNI_NETNS", ""), \
        env.get("CNI_IFNAME", "eth0")
    if not cid:
        raise CniError(4, "CNI_CONTAINERID is not set")
    ipam = Ipam(conf)
    if command == "ADD":
        if not netns:
            raise CniError(4, "CNI_NETNS is not set")
        ip = ipam.allocate(cid)
        try:
            mac = _add_links(netns, ifname, ip)
        except Exception:
            ipam.release(cid)
            raise
        return result(version, ifname, mac, netns, ip)
    if command == "DEL":
        _del_links(netns, ifname)
        ipam.release(cid)
        return None
    if command == "CHECK":
        ip_or_none = ipam.lookup(cid)
        if ip_or_none is None or not _has_address(netns, ifname, ip_or_none):
            raise CniError(11, f"{ifname} of {cid} has lost its address")
        return None
    raise CniError(4, f"unknown CNI_COMMAND {command!r}")


def main(stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> int:
    try:
        raw = stdin.read() if os.environ.get("CNI_COMMAND") != "VERSION" else "{}"
        out = run(os.environ, json.loads(raw or "{}"))
    except CniError as err:
        json.dump({"cniVersion": CNI_VERSION, "code": err.code, "msg": err.msg}, stdout)
        return 1
    except Exception as err:  # the runtime shows our message to the kubelet
        json.dump({"cniVersion": CNI_VERSION, "code": 999, "msg": f"{type(err).__name__}: {err}"},
                  stdout)
        return 1
    if out is not None:
        json.dump(out, stdout)
    return 0


def conflist(conf: NetConf, chained: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    """Our pod network first, then the ``chained`` plugins (each gets the
    result so far as ``prevResult``)."""
    return {"cniVersion": CNI_VERSION, "name": "toposerve-realnode",
            "plugins": [{"type": PLUGIN_TYPE, "subnet": str(conf.subnet),
                         "dataDir": str(conf.data_dir)}, *chained]}


def launcher(python: str, module: str = "toposerve.localcluster.realnode.cni") -> str:
    """The executable containerd finds in its CNI bin dir: ``module``'s
    ``main`` run by the given interpreter (the venv's, so pyroute2 is
    importable)."""
    return f"#!{python}\nfrom {module} import main\nraise SystemExit(main())\n"
