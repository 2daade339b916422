"""The local cluster is real: nodes carry the topology, the real scheduler
places pods, kwok runs them on loopback IPs, and DRA allocates claims."""

from __future__ import annotations

import ipaddress
import uuid
from typing import Any

import pytest
from kubernetes import client

from harness.waiting import wait_for
from tests.conftest import Cluster
from toposerve.localcluster.nodes import KWOK_TOLERATION
from toposerve.topology.labels import PRESETS, PROFILE_LABEL, DialectName, from_labels
from toposerve.topology.layout import plan_nodes
from toposerve.topology.profiles import load_profile
from toposerve.topology.slice_attributes import device_entry

pytestmark = pytest.mark.cluster
LOOPBACK = ipaddress.IPv4Network("127.0.0.0/8")


def test_nodes_ready_with_topology(cluster: Cluster) -> None:
    core: Any = client.CoreV1Api(cluster.api)
    nodes = {n.metadata.name: n for n in core.list_node().items}
    planned = plan_nodes([(load_profile(p), c) for p, c in cluster.groups])
    assert set(nodes) == {p.name for p in planned}
    dialect = PRESETS[DialectName.TOPOSERVE]
    for p in planned:
        n = nodes[p.name]
        labels = n.metadata.labels
        assert from_labels(p.name, labels, dialect) == p.path
        assert labels[PROFILE_LABEL] == p.profile
        assert any(c.type == "Ready" and c.status == "True" for c in n.status.conditions)
        assert n.status.allocatable["cpu"] == load_profile(p.profile).spec.allocatable["cpu"]
        assert n.metadata.annotations["kwok.x-k8s.io/node"] == "fake"
        assert any(t.key == "kwok.x-k8s.io/node" for t in n.spec.taints)
        assert ipaddress.IPv4Network(n.spec.pod_cidr).subnet_of(LOOPBACK)
        assert all(ipaddress.ip_address(a.address) in LOOPBACK
                   for a in n.status.addresses if a.type == "InternalIP")
    # one NVLink domain holds all 18 GB200 trays
    nvl = {nodes[p.name].metadata.labels["topology.toposerve.io/nvlink-domain"]
           for p in planned if p.profile == "gb200-nvl72"}
    assert len(nvl) == 1


def _pod(name: str, node_selector: dict[str, str], claims: list[dict[str, str]] | None = None
         ) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "registry.invalid/sim:0"}
    spec: dict[str, Any] = {"containers": [container], "tolerations": [KWOK_TOLERATION],
                            "nodeSelector": node_selector}
    if claims:
        spec["resourceClaims"] = claims
        container["resources"] = {"claims": [{"name": c["name"]} for c in claims]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def test_pod_scheduled_and_running_on_loopback_ip(cluster: Cluster) -> None:
    core: Any = client.CoreV1Api(cluster.api)
    name = f"plain-{uuid.uuid4().hex[:6]}"
    core.create_namespaced_pod("default", _pod(name, {PROFILE_LABEL: "mi300x"}))
    try:
        pod: Any = wait_for("pod Running", lambda: (
            p if (p := core.read_namespaced_pod(name, "default")).status.phase == "Running"
            else None), timeout=60, interval=0.3)
        assert pod.spec.node_name.startswith("mi300x-")
        ip = ipaddress.ip_address(pod.status.pod_ip)
        assert ip in LOOPBACK
        node = core.read_node(pod.spec.node_name)
        assert ip in ipaddress.ip_network(node.spec.pod_cidr)
        events = core.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={name},reason=Scheduled").items
        assert events and events[0].reporting_component in ("default-scheduler", "")
    finally:
        core.delete_namespaced_pod(name, "default", grace_period_seconds=0)


def test_dra_claim_allocated_by_real_scheduler(cluster: Cluster) -> None:
    """DeviceClasses, hand-made ResourceSlices for one HGX node, and a claim
    template asking for a GPU and a NIC on the same PCIe root."""
    res: Any = client.ResourceV1Api(cluster.api)
    core: Any = client.CoreV1Api(cluster.api)
    tag = uuid.uuid4().hex[:6]
    gpu_drv, nic_drv = f"gpu-{tag}.toposerve.io", f"net-{tag}.toposerve.io"
    node = "hgx-h100-0002"
    hw = load_profile("hgx-h100").hardware()
    places = {k: [p for p in hw.places() if p.device.kind == k] for k in ("gpu", "nic")}
    # NICs first so the allocator must use the constraint, not luck, to pair them
    places["nic"].reverse()
    created: list[tuple[str, str]] = []
    try:
        for kind, drv in (("gpu", gpu_drv), ("nic", nic_drv)):
            res.create_device_class({
                "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": {"name": f"{kind}-{tag}"},
                "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{drv}'"}}]}})
            created.append(("deviceclass", f"{kind}-{tag}"))
            res.create_resource_slice({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": f"{node}-{kind}-{tag}"},
                "spec": {"driver": drv, "nodeName": node,
                         "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                         "devices": [device_entry(p) for p in places[kind]]}})
            created.append(("slice", f"{node}-{kind}-{tag}"))
        res.create_namespaced_resource_claim_template("default", {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": f"gpu-nic-{tag}"},
            "spec": {"spec": {"devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": f"gpu-{tag}"}},
                    {"name": "nic", "exactly": {"deviceClassName": f"nic-{tag}"}}],
                "constraints": [{"requests": ["gpu", "nic"],
                                 "matchAttribute": "resource.kubernetes.io/pcieRoot"}]}}}})
        pod_name = f"dra-{tag}"
        core.create_namespaced_pod("default", _pod(
            pod_name, {PROFILE_LABEL: "hgx-h100"},
            claims=[{"name": "acc", "resourceClaimTemplateName": f"gpu-nic-{tag}"}]))
        created.append(("pod", pod_name))

        def claim() -> Any:
            for c in res.list_namespaced_resource_claim("default").items:
                owners = c.metadata.owner_references or []
                if any(o.name == pod_name for o in owners) and c.status and c.status.allocation:
                    return c
            return None

        c = wait_for("claim allocated", claim, timeout=60, interval=0.3)
        results = {r.request: r for r in c.status.allocation.devices.results}
        assert set(results) == {"gpu", "nic"}
        assert results["gpu"].driver == gpu_drv and results["nic"].driver == nic_drv
        assert results["gpu"].pool == node
        gpu_root = hw.place(results["gpu"].device).root
        assert hw.place(results["nic"].device).root == gpu_root
        assert any(r.name == pod_name for r in c.status.reserved_for or [])
        pod: Any = wait_for("DRA pod scheduled", lambda: (
            p if (p := core.read_namespaced_pod(pod_name, "default")).spec.node_name else None),
            timeout=60, interval=0.3)
        assert pod.spec.node_name == node
    finally:
        for kind, name in reversed(created):
            if kind == "pod":
                core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
            elif kind == "slice":
                res.delete_resource_slice(name)
            else:
                res.delete_device_class(name)
        res.delete_namespaced_resource_claim_template(f"gpu-nic-{tag}", "default")
