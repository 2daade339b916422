"""The NIC driver (``toposerve driver net``) and the CNI hand-off on the
real node, its NICs veth stand-ins named and placed by the hgx-h100 fake
sysfs tree: a pod with a NIC claim starts with the interface renamed,
addressed and at the configured MTU inside (its own ``ip`` says so, and the
fabric end pings it; an IPv6 address too); after the pod goes the interface is back on the host
as it was. A GPU and a NIC claimed together share a PCIe root. After
containerd restarts under a running pod, its DEL still brings the NIC back.
A run that crashes with a NIC in a pod is torn down to nothing."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv4Interface
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from harness.waiting import wait_for
from tests.conftest import Cluster
from tests.realnode.conftest import PodMaker, ensure_started, on_host_as_it_was, wait_phase
from toposerve.dra_driver.net.handoff.journal import Journal
from toposerve.dra_driver.net.handoff.links import Namespace
from toposerve.dra_driver.net.records import all_records
from toposerve.kubeapi import JsonApi
from toposerve.localcluster.clusters import kubeconfig_path
from toposerve.localcluster.realnode import nics
from toposerve.localcluster.realnode import node as realnode
from toposerve.localcluster.realnode.gpu_driver import DRIVER as GPU_DRIVER
from toposerve.localcluster.realnode.gpu_driver import GpuDriver
from toposerve.localcluster.realnode.net_driver import DRIVER, JOURNAL_DIR, STATE_DIR, NetDriver
from toposerve.localcluster.realnode.paths import NODE_NAME, default_layout
from toposerve.localcluster.realnode.pods import busybox_pod
from toposerve.localcluster.realnode.teardown import leftovers

pytestmark = [pytest.mark.cluster, pytest.mark.realnode]

NIC_CLASS, GPU_CLASS = "realnode-nic", "realnode-net-gpu"
ROOT = "resource.kubernetes.io/pcieRoot"


@dataclass
class Env:
    core: Any
    res: Any
    json: JsonApi
    driver: NetDriver
    stand_ins: list[nics.StandIn]

    def create_claim(self, doc: dict[str, Any]) -> None:
        """As compact JSON with sorted keys, the form Go's encoder writes:
        the apiserver keeps opaque parameters byte for byte, and a claim
        whose parameters came in another form (the Python client's spaced
        JSON, unsorted keys) fails every later status update with 422 (the
        re-encoded parameters differ, so the set-once allocation "changed")."""
        body = json.loads(json.dumps({"apiVersion": "resource.k8s.io/v1",
                                      "kind": "ResourceClaim", **doc}, sort_keys=True))
        self.json.request("POST", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims",
                          body=body)


@pytest.fixture(scope="module")
def env(real_node_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    ensure_started(real_node_cluster)
    core: Any = client.CoreV1Api(real_node_cluster.api)
    res: Any = client.ResourceV1Api(real_node_cluster.api)
    for name, of in ((NIC_CLASS, DRIVER), (GPU_CLASS, GPU_DRIVER)):
        kind = "" if of == DRIVER else f" && device.attributes['{of}'].type == 'gpu'"
        res.create_device_class({"metadata": {"name": name}, "spec": {"selectors": [
            {"cel": {"expression": f"device.driver == '{of}'{kind}"}}]}})
    driver = NetDriver(kubeconfig_path(real_node_cluster.name),
                       tmp_path_factory.mktemp("realnode-net"))
    driver.start()
    try:
        yield Env(core=core, res=res, json=JsonApi(real_node_cluster.api), driver=driver,
                  stand_ins=driver.stand_ins())
    finally:
        rc = driver.stop()
        driver.remove_stand_ins()
        for name in (NIC_CLASS, GPU_CLASS):
            with contextlib.suppress(ApiException):
                res.delete_device_class(name)
        assert rc == 0, driver.log.read_text()[-1500:]


def _config(**fields: Any) -> dict[str, Any]:
    return {"opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": "net.toposerve.io/v1", "kind": "NetConfig", **fields}}}


def _nic_claim(env: Env, name: str, nic: nics.StandIn, mtu: int = 1400,
               also: tuple[str, ...] = ()) -> str:
    """A claim for exactly this stand-in, named net1 in the pod, with its pod
    address and ``also`` these."""
    env.create_claim({
        "metadata": {"name": name},
        "spec": {"devices": {
            "requests": [{"name": "nic", "exactly": {
                "deviceClassName": NIC_CLASS, "selectors": [{"cel": {"expression":
                    f"device.attributes['{DRIVER}'].ifName == '{nic.ifname}'"}}]}}],
            "config": [{"requests": ["nic"], **_config(
                interfaceName="net1", addresses=[str(nic.pod_address()), *also],
                mtu=mtu)}]}}})
    return name


@contextlib.contextmanager
def _claims(env: Env, *names: str) -> Iterator[None]:
    try:
        yield
    finally:
        for name in names:
            with contextlib.suppress(ApiException):
                env.res.delete_namespaced_resource_claim(name, "default")


def _wait_published(env: Env) -> None:
    def count() -> int:
        slices = env.res.list_resource_slice(
            field_selector=f"spec.nodeName={NODE_NAME},spec.driver={DRIVER}").items
        return sum(len(s.spec.devices or []) for s in slices)

    wait_for("the NIC stand-ins published", lambda: count() >= len(env.stand_ins), timeout=30)


def _ping_from_fabric(address: IPv4Interface) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", nics.FABRIC_NETNS.name, "busybox", "ping",
                           "-c1", "-W2", str(address.ip)], capture_output=True, text=True,
                          check=False)


def _log(env: Env, pod: str) -> str:
    return str(env.core.read_namespaced_pod_log(pod, "default"))


SCRIPT = "ip -o addr show dev net1; ip -o link show dev net1; echo READY; sleep 3600"


def _nic_pod(env: Env, make_pod: PodMaker, name: str, claim: str, entry: str = "nic") -> str:
    """A pod with the NIC claim (as its claims' ``entry``), running: what its
    container's ``ip`` shows of net1."""
    make_pod(busybox_pod(name, SCRIPT, claims=[{"name": entry, "resourceClaimName": claim}]))
    wait_phase(env.core, name, {"Running"})
    wait_for("the container's view of net1", lambda: "READY" in _log(env, name))
    return _log(env, name)


def _delete_pod(env: Env, name: str) -> None:
    env.core.delete_namespaced_pod(name, "default", grace_period_seconds=1)
    wait_for(f"pod {name} gone", lambda: not env.core.list_namespaced_pod(
        "default", field_selector=f"metadata.name={name}").items, timeout=60)


def test_a_pod_gets_the_nic_configured_and_it_comes_back(env: Env, make_pod: PodMaker) -> None:
    _wait_published(env)
    nic = env.stand_ins[0]
    claim = _nic_claim(env, "rn-nic", nic)
    with _claims(env, claim):
        log = _nic_pod(env, make_pod, "rn-nic", claim)
        assert f"inet {nic.pod_address()}" in log and "mtu 1400" in log, log
        assert nic.mac in log  # the very NIC, renamed
        ping = _ping_from_fabric(nic.pod_address())
        assert ping.returncode == 0, ping.stdout + ping.stderr
        got = env.res.read_namespaced_resource_claim(claim, "default")
        data = got.status.devices[0].network_data
        assert data.interface_name == "net1" and data.ips == [str(nic.pod_address())]
        with Namespace() as host:
            assert host.find(nic.ifname, nic.mac) is None  # not on the host meanwhile
        _delete_pod(env, "rn-nic")
    assert on_host_as_it_was(nic)
    assert Journal(JOURNAL_DIR).entries() == []
    wait_for("the claim's record removed", lambda: not all_records(STATE_DIR), timeout=30)


def test_a_pod_gets_its_ipv6_address(env: Env, make_pod: PodMaker) -> None:
    """Dual stack on the real runtime, from the documentation range: the
    container's own ``ip`` shows the v6 address (usable at once, no DAD)."""
    _wait_published(env)
    nic = env.stand_ins[1]
    v6 = "2001:db8:18:1::2/64"
    claim = _nic_claim(env, "rn-nic6", nic, also=(v6,))
    with _claims(env, claim):
        log = _nic_pod(env, make_pod, "rn-nic6", claim)
        [line] = [x for x in log.splitlines() if f"inet6 {v6} " in x]
        assert "tentative" not in line and f"inet {nic.pod_address()}" in log, log
        got = env.res.read_namespaced_resource_claim(claim, "default")
        assert got.status.devices[0].network_data.ips == [str(nic.pod_address()), v6]
        _delete_pod(env, "rn-nic6")
    assert on_host_as_it_was(nic)


def _root_of(env: Env, driver: str, device: str) -> str:
    slices = env.res.list_resource_slice(
        field_selector=f"spec.nodeName={NODE_NAME},spec.driver={driver}").items
    for s in slices:
        for d in s.spec.devices or []:
            if d.name == device:
                return str(d.attributes[ROOT].string)
    raise AssertionError(f"{device} of {driver} not published")


def test_gpu_and_nic_aligned_on_one_pcie_root(env: Env, make_pod: PodMaker,
                                              tmp_path_factory: pytest.TempPathFactory
                                              ) -> None:
    gpu = GpuDriver(env.driver.kubeconfig, tmp_path_factory.mktemp("realnode-net-gpu"))
    gpu.start()
    try:
        _wait_published(env)
        env.create_claim({
            "metadata": {"name": "rn-gpu-nic"},
            "spec": {"devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": GPU_CLASS}},
                             {"name": "nic", "exactly": {"deviceClassName": NIC_CLASS}}],
                "constraints": [{"requests": ["gpu", "nic"], "matchAttribute": ROOT}],
                "config": [{"requests": ["nic"], **_config(interfaceName="net1")}]}}})
        with _claims(env, "rn-gpu-nic"):
            log = _nic_pod(env, make_pod, "rn-gpu-nic", "rn-gpu-nic", entry="devs")
            claim = env.res.read_namespaced_resource_claim("rn-gpu-nic", "default")
            by_request = {r.request: r for r in claim.status.allocation.devices.results}
            assert _root_of(env, GPU_DRIVER, by_request["gpu"].device) == \
                _root_of(env, DRIVER, by_request["nic"].device)
            assert "net1" in log
            _delete_pod(env, "rn-gpu-nic")
    finally:
        assert gpu.stop() == 0
    assert all(on_host_as_it_was(n) for n in env.stand_ins)


def test_del_after_containerd_restarts_brings_the_nic_back(env: Env, make_pod: PodMaker
                                                           ) -> None:
    _wait_published(env)
    nic = env.stand_ins[1]
    claim = _nic_claim(env, "rn-nic-ctd", nic, mtu=1500)
    with _claims(env, claim):
        _nic_pod(env, make_pod, "rn-nic-ctd", claim)
        realnode.restart_containerd()
        assert _ping_from_fabric(nic.pod_address()).returncode == 0  # still in the pod
        _delete_pod(env, "rn-nic-ctd")
    assert on_host_as_it_was(nic)
    assert Journal(JOURNAL_DIR).entries() == []


def test_a_crashed_run_is_torn_down_to_nothing(env: Env, make_pod: PodMaker) -> None:
    """The driver killed with a NIC in a pod, then the node stopped: no
    stand-in, fabric namespace, journal or record is left on the machine."""
    _wait_published(env)
    nic = env.stand_ins[2]
    claim = _nic_claim(env, "rn-nic-crash", nic)
    with _claims(env, claim):
        _nic_pod(env, make_pod, "rn-nic-crash", claim)
        proc = env.driver.proc
        assert proc is not None
        proc.kill()
        proc.wait()
        env.driver.proc = None  # the module's teardown has nothing left to stop
        realnode.stop()
    assert leftovers(default_layout()) == []
    with Namespace() as host:
        assert [s.ifname for s in env.stand_ins if host.find(s.ifname, s.mac)] == []
    assert not JOURNAL_DIR.exists() and not STATE_DIR.exists()
