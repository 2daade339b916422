"""NIC stand-ins for the real node: one veth pair per NIC of a hardware
profile, the NIC's end in the host's namespace under the name, MAC and MTU
the profile's fake sysfs tree gives it (so ``toposerve driver net
--sysfs-root`` finds a PCI function for it), the far end in a "fabric"
namespace with 198.18.<i>.1/24, so an address handed to a pod (198.18.<i>.x)
can be pinged from the fabric. No packet leaves the machine.

Removing the fabric namespace removes every pair with it, wherever its NIC
end is (on the host or in a pod): that is the whole teardown."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from ipaddress import IPv4Interface
from pathlib import Path
from typing import Any

from toposerve.topology.model import DeviceKind, NodeHardware

FABRIC_NETNS = Path("/var/run/netns/toposerve-fabric")
FABRIC_SUFFIX = "f"  # enp24s0 <-> enp24s0f in the fabric


@dataclass(frozen=True)
class StandIn:
    ifname: str
    mac: str
    mtu: int
    pci: str
    fabric_address: IPv4Interface  # the fabric end's; the pod gets another in its /24

    def pod_address(self, host: int = 2) -> IPv4Interface:
        net = self.fabric_address.network
        return IPv4Interface(f"{net.network_address + host}/{net.prefixlen}")


def stand_ins_for(hw: NodeHardware) -> list[StandIn]:
    """One per NIC with an interface, in PCI order; 198.18.<i>.0/24 each."""
    nics = [d for d in hw.devices(DeviceKind.NIC) if d.interface]
    return [StandIn(ifname=str(d.interface), mac=str(d.mac), mtu=d.mtu or 1500,
                    pci=d.pci_bus_id, fabric_address=IPv4Interface(f"198.18.{i}.1/24"))
            for i, d in enumerate(nics)]


def _netns() -> Any:
    from pyroute2 import netns  # type: ignore[import-untyped]

    return netns


def create(stand_ins: list[StandIn], fabric: Path = FABRIC_NETNS) -> None:
    """The fabric namespace and the pairs (an earlier run's removed first)."""
    from toposerve.dra_driver.net.handoff.links import Namespace

    remove(fabric)
    _netns().create(fabric.name)
    try:
        with Namespace() as host, Namespace(str(fabric)) as far:
            for s in stand_ins:
                host.add_veth(s.ifname, s.mac, s.mtu, s.ifname + FABRIC_SUFFIX, far)
                end = far.find(s.ifname + FABRIC_SUFFIX)
                assert end is not None
                far.set_addresses(end, [s.fabric_address])
                far.set_link(far.get(end.index), up=True)
    except BaseException:
        remove(fabric)
        raise


def remove(fabric: Path = FABRIC_NETNS) -> None:
    """Gone with the namespace: every pair, wherever its NIC end is."""
    if fabric.exists():
        with contextlib.suppress(FileNotFoundError):
            _netns().remove(fabric.name)
