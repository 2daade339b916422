"""The real node joins the local cluster on loopback only, runs a busybox
pod from our own image without pulling anything, and kwok leaves it alone."""

from __future__ import annotations

import ipaddress

import pytest

from tests.realnode.conftest import PodMaker, RealNode, wait_phase
from toposerve.localcluster.cluster import status
from toposerve.localcluster.clusters import cluster_dir
from toposerve.localcluster.realnode.paths import POD_SUBNET, REAL_NODE_LABEL, REAL_NODE_TAINT
from toposerve.localcluster.realnode.pods import busybox_pod
from toposerve.localcluster.tools import versions
from toposerve.main import main

pytestmark = [pytest.mark.cluster, pytest.mark.realnode]


def test_node_ready_with_only_loopback_addresses(real_node: RealNode) -> None:
    node = real_node.core.read_node(real_node.name)
    assert node.status and node.metadata and node.spec
    addresses = {a.type: a.address for a in node.status.addresses or []}
    assert addresses.get("InternalIP") == "127.0.0.1", addresses
    assert all(ipaddress.ip_address(a).is_loopback for t, a in addresses.items()
               if t != "Hostname"), addresses
    assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
    info = node.status.node_info
    assert info and info.kubelet_version == versions()["K8S_VERSION"]
    assert info.container_runtime_version == \
        f"containerd://{versions()['CONTAINERD_VERSION'].lstrip('v')}"
    assert (node.metadata.labels or {}).get(REAL_NODE_LABEL) == "real"
    assert any(t.key == REAL_NODE_TAINT["key"] for t in node.spec.taints or [])
    assert node.status.daemon_endpoints and node.status.daemon_endpoints.kubelet_endpoint
    assert node.status.daemon_endpoints.kubelet_endpoint.port == 10250


def test_kwok_manages_only_its_fake_nodes(real_node: RealNode) -> None:
    node = real_node.core.read_node(real_node.name)
    assert node.metadata
    assert "kwok.x-k8s.io/node" not in (node.metadata.annotations or {})
    log = (cluster_dir(real_node.cluster.name) / "logs" / "kwok-controller.log").read_text()
    assert "kwok.x-k8s.io/node=fake" in log  # started with the annotation selector
    # the kwok nodes are still kwok's: Ready, with their fake kubelet version
    kwok = real_node.core.list_node(label_selector="type=kwok").items
    assert kwok and all(n.status and n.status.node_info and
                        n.status.node_info.kubelet_version == "fake" for n in kwok)


def test_busybox_pod_runs_and_shows_its_env(real_node: RealNode, make_pod: PodMaker) -> None:
    name = make_pod(busybox_pod("rn-env", "env; echo done", env={"TOPOSERVE_PROBE": "42"}))
    pod = wait_phase(real_node.core, name, {"Succeeded"})
    assert pod.spec and pod.spec.node_name == real_node.name
    assert pod.status and pod.status.pod_ip
    assert ipaddress.ip_address(pod.status.pod_ip) in ipaddress.ip_network(POD_SUBNET)
    log = real_node.core.read_namespaced_pod_log(name, "default")
    assert "TOPOSERVE_PROBE=42" in log.splitlines()
    assert "done" in log.splitlines()


def test_pod_network_is_its_own_veth_on_loopback(real_node: RealNode,
                                                  make_pod: PodMaker) -> None:
    name = make_pod(busybox_pod("rn-net", "ip -o addr show; ip -o link show"))
    pod = wait_phase(real_node.core, name, {"Succeeded"})
    assert pod.status
    log = real_node.core.read_namespaced_pod_log(name, "default")
    assert f"inet {pod.status.pod_ip}/32" in log
    links = {line.split(":")[1].strip().split("@")[0] for line in log.splitlines()
             if ": <" in line}
    assert links == {"lo", "eth0", "eth0p"}, log


def test_nothing_is_ever_pulled(real_node: RealNode, make_pod: PodMaker) -> None:
    name = make_pod(busybox_pod("rn-nopull", "true"))
    wait_phase(real_node.core, name, {"Succeeded"})
    containerd_log = (real_node.layout.logs / "containerd.log").read_text()
    assert "PullImage" not in containerd_log
    events = real_node.core.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={name}").items
    assert not [e for e in events if e.reason in ("Pulling", "Failed")], events
    assert any(e.reason == "Pulled" for e in events)  # "already present on machine"


def test_cluster_status_names_the_real_node(real_node: RealNode,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    mine = [c for c in status() if c.name == real_node.cluster.name]
    assert mine and mine[0].real_nodes == [real_node.name]
    assert main(["cluster", "status"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines()
                if x.startswith(f"{real_node.cluster.name}:"))
    assert f"real node {real_node.name} (kubelet)" in line
