"""NIC discovery over real netlink, in a network namespace the test made
(veth ends standing in for NICs, their PCI identities from a fake sysfs
tree), and the pool it becomes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.net_standins import PEER_SUFFIX, StandIns, make_sriov, stand_ins
from toposerve.dra_driver.net.devices import discovered_pool
from toposerve.dra_driver.net.discovery import NetFilters, Nic, device_name_for_pci, discover
from toposerve.topology.model import DeviceKind, DomainPath
from toposerve.topology.profiles import load_profile
from toposerve.topology.slice_attributes import MAX_ATTRIBUTES

HW = load_profile("hgx-h100").hardware()
NICS = HW.devices(DeviceKind.NIC)
PATH = DomainPath(rack="r1", host="n1")


@pytest.fixture
def node(tmp_path: Path) -> Iterator[StandIns]:
    with stand_ins(tmp_path, HW) as s:
        yield s


def _found(s: StandIns, filters: NetFilters | None = None, **kw: Any) -> list[Nic]:
    return discover(s.sysfs, filters or NetFilters(), netns=s.netns, dev_root=s.dev, **kw)


def _attrs(s: StandIns, nics: list[Nic]) -> dict[str, dict[str, Any]]:
    pool = discovered_pool("n1", PATH, nics)
    return {d["name"]: {k: next(iter(v.values())) for k, v in d["attributes"].items()}
            | {"capacity": d.get("capacity", {})} for d in pool.devices}


def test_pci_nics_with_their_placement_and_no_virtual_ends(node: StandIns) -> None:
    found = _found(node)
    assert [n.name for n in found] == [device_name_for_pci(d.pci_bus_id) for d in NICS]
    attrs = _attrs(node, found)
    for d in NICS:
        a = attrs[device_name_for_pci(d.pci_bus_id)]
        place = HW.place(d.name)
        assert a["ifName"] == d.interface and a["pciAddress"] == d.pci_bus_id
        assert a["resource.kubernetes.io/pcieRoot"] == place.root
        assert a["resource.kubernetes.io/pciBusID"] == d.pci_bus_id
        assert a["resource.kubernetes.io/numaNode"] == a["numaNode"] == place.numa
        assert a["pcieSwitch"] == place.switch and a["rack"] == "r1"
        assert a["rdma"] is True and a["rdmaDevice"] == d.rdma_device
        assert a["virtual"] is False and a["sriov"] is False and a["isSriovVf"] is False
        assert a["state"] == "up" and a["type"] == "veth" and a["encapsulation"] == "ether"
        assert a["pciVendor"] == "Mellanox Technologies" and a["pciDevice"] == "ConnectX-7"
        assert a["capacity"] == {"linkSpeed": {"value": "400G"}}
    # the netlink MAC, not the one sysfs was written with (the link is the truth)
    with node.ns() as ns:
        mac = ns.get_links(ns.link_lookup(ifname=NICS[0].interface)[0])[0].get("IFLA_ADDRESS")
    assert attrs[found[0].name]["mac"] == mac
    pool = discovered_pool("n1", PATH, found)
    assert all(len(d["attributes"]) + len(d.get("capacity", {})) <= MAX_ATTRIBUTES
               for d in pool.devices)


def test_virtual_and_loopback_only_when_asked(node: StandIns) -> None:
    found = _found(node, NetFilters(virtual=True, loopback=True))
    virtual = sorted(n.name for n in found if n.virtual)
    assert virtual == sorted(["net-lo", *(f"net-{i}{PEER_SUFFIX}" for i in node.interfaces)])
    attrs = _attrs(node, found)
    assert attrs["net-lo"]["type"] == "loopback" and attrs["net-lo"]["virtual"] is True
    assert attrs[f"net-{node.interfaces[0]}{PEER_SUFFIX}"]["type"] == "veth"
    assert len(_found(node, NetFilters(loopback=True))) == len(NICS) + 1


def test_default_route_interface_left_out(node: StandIns) -> None:
    uplink = node.interfaces[0]
    with node.ns() as ns:
        idx = ns.link_lookup(ifname=uplink)[0]
        ns.addr("add", index=idx, address="198.18.0.2", prefixlen=24)
        ns.route("add", dst="0.0.0.0/0", gateway="198.18.0.1")
    names = [n.if_name for n in _found(node)]
    assert uplink not in names and len(names) == len(NICS) - 1
    kept = _found(node, NetFilters(default_route=True))
    assert kept[0].if_name == uplink
    assert _attrs(node, kept)[kept[0].name]["ipv4"] == "198.18.0.2/24"


def test_name_filters(node: StandIns) -> None:
    first, second = node.interfaces[:2]
    assert [n.if_name for n in _found(node, NetFilters(include=f"{first}|{second}"))] == \
        [first, second]
    assert first not in [n.if_name for n in _found(node, NetFilters(exclude=first))]


def test_nic_away_in_a_pod_stays_published(node: StandIns) -> None:
    moved = node.interfaces[2]
    with node.ns() as ns:  # gone from this namespace, as a hand-off leaves it
        ns.link("del", index=ns.link_lookup(ifname=moved)[0])
    name = device_name_for_pci(NICS[2].pci_bus_id)
    found = {n.name: n for n in _found(node, away={name: moved})}
    assert found[name].link is None and found[name].if_name == moved
    a = _attrs(node, list(found.values()))[name]
    assert a["state"] == "away" and a["ifName"] == moved and "mac" not in a
    # the filters judge it by the name it had
    assert name not in {n.name for n in _found(node, NetFilters(exclude=moved),
                                               away={name: moved})}


def test_sriov_physical_and_virtual_functions(node: StandIns) -> None:
    pf = NICS[0]
    vf_bdf = pf.pci_bus_id[:-1] + "1"
    make_sriov(node.sysfs, pf.pci_bus_id, vf_bdf, "vf0")
    with node.ns() as ns:
        ns.link("add", ifname="vf0", kind="veth", peer={"ifname": "vf0" + PEER_SUFFIX})
    attrs = _attrs(node, _found(node))
    p, v = attrs[device_name_for_pci(pf.pci_bus_id)], attrs[device_name_for_pci(vf_bdf)]
    assert p["sriov"] is True and p["sriovVfs"] == 1 and p["isSriovVf"] is False
    assert v["isSriovVf"] is True and v["sriov"] is False and v["ifName"] == "vf0"
    assert v["resource.kubernetes.io/pcieRoot"] == p["resource.kubernetes.io/pcieRoot"]


def test_rdma_character_devices(node: StandIns) -> None:
    found = _found(node)
    assert found[0].char_devices == (str(node.dev / "infiniband/uverbs0"),)
    assert found[3].pci is not None and found[3].pci.rdma_device == "mlx5_3"


def test_stand_ins_of_a_dead_run_are_removed_and_a_live_runs_kept() -> None:
    """A run killed before its cleanup leaves its namespace; the next run
    removes it, but not one whose creator still runs."""
    import subprocess

    from pyroute2 import netns  # type: ignore[import-untyped]

    from harness.net_standins import PREFIX, remove_stale

    child = subprocess.Popen(["sleep", "60"])
    child_ns, dead_ns = f"{PREFIX}{child.pid}-live", f"{PREFIX}{_exited_pid()}-dead"
    for name in (child_ns, dead_ns):
        netns.create(name)
    try:
        gone = remove_stale()
        assert dead_ns in gone and child_ns not in gone
        assert child_ns in netns.listnetns() and dead_ns not in netns.listnetns()
    finally:
        child.kill()
        child.wait()
        for name in (child_ns, dead_ns):
            if name in netns.listnetns():
                netns.remove(name)


def _exited_pid() -> int:
    import subprocess

    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid
