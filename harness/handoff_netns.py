"""Network namespaces for the hand-off tests and benchmark, made and removed
by them:
a stand-in "host" (the mover runs against it as if it were its own), a pod
sandbox, and a "fabric" holding the far end of each NIC stand-in (a veth
pair), so a moved NIC can be pinged from the fabric. Addresses from
198.18.0.0/15; nothing leaves the machine."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from ipaddress import ip_interface
from pathlib import Path
from typing import Any

from toposerve.dra_driver.net.handoff.journal import Journal
from toposerve.dra_driver.net.handoff.links import Link, Namespace
from toposerve.dra_driver.net.handoff.mover import Mover

NETNS_DIR = Path("/var/run/netns")


def _netns() -> Any:
    from pyroute2 import netns  # type: ignore[import-untyped]

    return netns


@dataclass
class Nic:
    host_name: str
    mac: str
    mtu: int


@dataclass
class NetEnv:
    prefix: str
    host: str    # namespace paths
    pod: str
    fabric: str
    journal: Journal
    nics: list[Nic]
    _open: dict[str, Namespace] = field(default_factory=dict)

    def mover(self) -> Mover:
        return Mover(self.journal, self.host)

    def new_pod(self, suffix: str) -> str:
        name = f"{self.prefix}-{suffix}"
        _netns().create(name)
        return str(NETNS_DIR / name)

    def remove_pod(self, path: str) -> None:
        _netns().remove(Path(path).name)

    def where(self, nic: Nic) -> list[tuple[str, Link]]:
        """Every namespace of the test holding a link with the NIC's MAC,
        and that link."""
        found = []
        for path in (self.host, self.pod, self.fabric):
            if path not in self._open:
                self._open[path] = Namespace(path)
            link = self._open[path].by_mac(nic.mac)
            if link is not None:
                found.append((path, link))
        return found

    def close(self) -> None:
        for ns in self._open.values():
            ns.close()


@contextlib.contextmanager
def net_env(tmp: Path, nics: int = 2, mtu: int = 1500) -> Iterator[NetEnv]:
    """Needs root; the caller says so (a test skips, a benchmark fails)."""
    netns = _netns()
    prefix = f"tsh-{uuid.uuid4().hex[:6]}"
    names = [f"{prefix}-{x}" for x in ("host", "pod", "fabric")]
    for n in names:
        netns.create(n)
    try:
        host, pod, fabric = (str(NETNS_DIR / n) for n in names)
        made = []
        with Namespace(host) as h, Namespace(fabric) as f:
            for i in range(nics):
                mac = f"02:00:5e:00:{os.getpid() % 256:02x}:{i:02x}"
                h.add_veth(f"nic{i}", mac, mtu, f"fab{i}", f)
                far = f.find(f"fab{i}")
                assert far is not None
                f.set_addresses(far, [ip_interface(f"198.18.{i}.1/24")])
                f.set_link(f.get(far.index), up=True)
                made.append(Nic(host_name=f"nic{i}", mac=mac, mtu=mtu))
        env = NetEnv(prefix=prefix, host=host, pod=pod, fabric=fabric,
                     journal=Journal(tmp / "journal"), nics=made)
        try:
            yield env
        finally:
            env.close()
    finally:
        for entry in NETNS_DIR.glob(f"{prefix}-*"):
            with contextlib.suppress(OSError):
                netns.remove(entry.name)
