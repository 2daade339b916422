"""``toposerve driver net`` on a kwok node whose NICs are stand-ins, called
as the kubelet calls it (real gRPC over unix sockets), with claims the real
scheduler allocated from the slices the driver published: the hand-off
record, RDMA char devices through CDI, ``networkData`` in the claim's
status, and a bad config failing its claim alone."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from harness.dra_net import (
    DRIVER,
    NODE,
    NetDriverProc,
    NetEnv,
    claim_status,
    create_claim,
    net_config,
    published,
    setup_env,
    teardown_env,
)
from harness.net_standins import StandIns, stand_ins
from harness.waiting import wait_for
from tests.conftest import Cluster
from toposerve.dra_driver.net.records import read_record
from toposerve.topology.model import DeviceKind
from toposerve.topology.profiles import load_profile

pytestmark = pytest.mark.cluster
HW = load_profile("hgx-h100").hardware()


@pytest.fixture(scope="module")
def net_env(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetEnv]:
    env = setup_env(cluster.name, cluster.api, tmp_path_factory.mktemp("net-env"))
    try:
        yield env
    finally:
        teardown_env(cluster.api)


@pytest.fixture(scope="module")
def nics(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandIns]:
    with stand_ins(tmp_path_factory.mktemp("nics"), HW) as s:
        yield s


@pytest.fixture(scope="module")
def driver(net_env: NetEnv, nics: StandIns,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetDriverProc]:
    d = NetDriverProc(net_env, tmp_path_factory.mktemp("net-driver"), nics)
    d.start()
    try:
        wait_for("8 NICs published", lambda: len(published(net_env.api)) == 8, timeout=30)
        yield d
    finally:
        d.kill()


def _answer(resp: dict[str, Any]) -> dict[str, Any]:
    return {uid: {"error": r.error, "devices": [
        (list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids))
        for d in r.devices]} for uid, r in resp.items()}


def test_slices_carry_dranet_attributes(net_env: NetEnv, driver: NetDriverProc) -> None:
    devices = {d["name"]: d for d in published(net_env.api)}
    nics = HW.devices(DeviceKind.NIC)
    assert sorted(devices) == sorted("pci-" + n.pci_bus_id.replace(":", "-").replace(".", "-")
                                     for n in nics)
    for n in nics:
        d = devices["pci-" + n.pci_bus_id.replace(":", "-").replace(".", "-")]
        a = d["attributes"]
        assert a["ifName"] == {"string": n.interface}
        assert a["resource.kubernetes.io/pcieRoot"] == {"string": HW.place(n.name).root}
        assert a["rdmaDevice"] == {"string": n.rdma_device}
        assert a["rack"] == {"string": "net-b0-r0"}
        assert d["capacity"]["linkSpeed"] == {"value": "400G"}


def test_prepare_writes_the_record_cdi_and_network_data(net_env: NetEnv,
                                                        driver: NetDriverProc) -> None:
    cfg = net_config(interfaceName="net1", addresses=["198.18.0.2/24"], mtu=9000,
                     routes=[{"destination": "198.19.0.0/16", "gateway": "198.18.0.1"}])
    claim, pod_uid = create_claim(net_env.api, "one-nic", configs=[cfg])
    kubelet = driver.kubelet
    first = _answer(kubelet.prepare([claim]))
    got = first[claim.uid]
    assert got["error"] == "", got["error"]
    [(requests, pool, device, cdi_ids)] = got["devices"]
    assert requests == ["nic"] and pool == NODE
    assert cdi_ids == [f"k8s.{DRIVER}/nic={claim.uid}-{device}"]
    assert _answer(kubelet.prepare([claim])) == first  # idempotent

    rec = read_record(driver.state_dir, claim.uid)
    assert rec is not None and rec.podUids == [pod_uid]
    assert rec.claim == f"{claim.namespace}/one-nic"
    [nic] = rec.nics
    assert nic.device == device and nic.hostIfName in driver.nics.interfaces
    assert nic.config.interface_name == "net1" and nic.config.mtu == 9000
    assert [str(a) for a in nic.config.addresses] == ["198.18.0.2/24"]
    assert nic.rdmaDevice is not None and nic.rdmaDevice.startswith("mlx5_")

    spec = json.loads(driver.cdi.path(claim.uid).read_text())
    [entry] = spec["devices"]
    paths = sorted(n["path"] for n in entry["containerEdits"]["deviceNodes"])
    index = driver.nics.interfaces.index(nic.hostIfName)
    assert paths == ["/dev/infiniband/rdma_cm", f"/dev/infiniband/uverbs{index}"]

    [status] = [d for d in claim_status(net_env.api, claim)["devices"] if d["driver"] == DRIVER]
    with driver.nics.ns() as ns:
        mac = ns.get_links(ns.link_lookup(ifname=nic.hostIfName)[0])[0].get("IFLA_ADDRESS")
    assert status["networkData"] == {"interfaceName": "net1", "ips": ["198.18.0.2/24"],
                                     "hardwareAddress": mac}

    assert kubelet.unprepare([claim]) == {claim.uid: ""}
    assert read_record(driver.state_dir, claim.uid) is None
    assert not driver.cdi.path(claim.uid).exists()
    assert not [d for d in claim_status(net_env.api, claim).get("devices") or []
                if d["driver"] == DRIVER]
    assert kubelet.unprepare([claim]) == {claim.uid: ""}  # idempotent


@pytest.mark.parametrize("bad, error", [
    ({"adresses": ["198.18.0.3/24"]},
     "adresses: Extra inputs are not permitted (unknown field: did you mean addresses?)"),
    ({"addresses": ["198.18.0.300/24"]},
     "addresses.0: Value error, '198.18.0.300/24' is not a CIDR"),
])
def test_bad_config_fails_its_claim_alone(net_env: NetEnv, driver: NetDriverProc,
                                          bad: dict[str, Any], error: str,
                                          request: pytest.FixtureRequest) -> None:
    tag = "unknown" if "adresses" in bad else "cidr"
    broken, _ = create_claim(net_env.api, f"bad-{tag}", configs=[net_config(**bad)])
    good, _ = create_claim(net_env.api, f"good-{tag}",
                           configs=[net_config(addresses=["198.18.1.2/24"])])
    got = _answer(driver.kubelet.prepare([broken, good]))
    assert got[good.uid]["error"] == "" and len(got[good.uid]["devices"]) == 1
    msg = got[broken.uid]["error"]
    assert msg.startswith(f"claim {broken.namespace}/{broken.name}: opaque config #0 "
                          "(from the claim) is invalid: ") and error in msg, msg
    assert "\n" not in msg and got[broken.uid]["devices"] == []
    assert read_record(driver.state_dir, broken.uid) is None
    assert driver.kubelet.unprepare([good]) == {good.uid: ""}


def test_two_nics_with_one_address_is_a_claim_error(net_env: NetEnv,
                                                    driver: NetDriverProc) -> None:
    claim, _ = create_claim(net_env.api, "two-nics-one-ip", count=2,
                            configs=[net_config(addresses=["198.18.2.2/24"])])
    msg = _answer(driver.kubelet.prepare([claim]))[claim.uid]["error"]
    assert "would both have address 198.18.2.2: give each request its own addresses" in msg
    assert read_record(driver.state_dir, claim.uid) is None


def test_metrics_and_health(driver: NetDriverProc) -> None:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{driver.port}/healthz", timeout=10) as r:
        assert r.status == 200
    with urllib.request.urlopen(f"http://127.0.0.1:{driver.port}/metrics", timeout=10) as r:
        assert f'toposerve_dra_prepare_seconds_count{{driver="{DRIVER}",result="ok"}}' \
            in r.read().decode()


def test_sigterm_stops_cleanly(driver: NetDriverProc) -> None:
    assert driver.stop() == 0
    driver.start()  # for any later test in the module
