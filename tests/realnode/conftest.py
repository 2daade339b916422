"""The real node (a real kubelet + containerd + runc, docs/design.md §9) on the
session's control plane: added for this package's tests, then removed, so
the kwok tests elsewhere never see it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from harness.dra_net import canonical
from harness.waiting import wait_for
from tests.conftest import Cluster
from toposerve.dra_driver.net.handoff.links import Namespace
from toposerve.kubeapi import JsonApi
from toposerve.localcluster.realnode import nics
from toposerve.localcluster.realnode import node as realnode
from toposerve.localcluster.realnode.paths import NODE_NAME, Layout, default_layout
from toposerve.localcluster.realnode.pods import busybox_pod


@dataclass
class RealNode:
    cluster: Cluster
    core: Any  # CoreV1Api; takes manifests as plain dicts
    name: str
    layout: Layout


@pytest.fixture(scope="package")
def real_node_cluster(cluster: Cluster) -> Iterator[Cluster]:
    try:
        yield cluster
    finally:
        realnode.stop(cluster.name)


# One real node per machine: another test run on this machine may hold it for
# a few minutes; wait for it rather than fail.
MACHINE_WAIT_S = 420  # within pytest-timeout's 600 s a test


def ensure_started(cluster: Cluster) -> None:
    owner = realnode.running_owner()
    if owner is None or owner.cluster != cluster.name:
        realnode.start(cluster.name, wait_s=MACHINE_WAIT_S)


@pytest.fixture
def real_node(real_node_cluster: Cluster) -> RealNode:
    """The node, started if it is not running (a teardown test stops it)."""
    ensure_started(real_node_cluster)
    return RealNode(cluster=real_node_cluster, core=client.CoreV1Api(real_node_cluster.api),
                    name=NODE_NAME, layout=default_layout())


PodMaker = Callable[[dict[str, Any]], str]


@pytest.fixture
def make_pod(real_node: RealNode) -> Iterator[PodMaker]:
    """Creates pods in ``default``; deletes them (and waits) after the test."""
    made: list[str] = []

    def make(manifest: dict[str, Any]) -> str:
        real_node.core.create_namespaced_pod("default", manifest)
        made.append(manifest["metadata"]["name"])
        return str(manifest["metadata"]["name"])

    yield make
    for name in made:
        with contextlib.suppress(ApiException):
            real_node.core.delete_namespaced_pod(name, "default", grace_period_seconds=1)

    def gone() -> bool:
        left = {p.metadata.name for p in real_node.core.list_namespaced_pod("default").items
                if p.metadata}
        return not left & set(made)

    if realnode.running_owner() is not None:
        wait_for("test pods deleted", gone, timeout=30)


def wait_phase(core: Any, name: str, phases: set[str], timeout: float = 60) -> Any:
    def check() -> Any:
        pod = core.read_namespaced_pod(name, "default")
        if pod.status and pod.status.phase in {"Failed"} - phases:
            raise AssertionError(f"pod {name} failed: {pod.status}")
        return pod if pod.status and pod.status.phase in phases else None

    try:
        return wait_for(f"pod {name} {'/'.join(sorted(phases))}", check, timeout=timeout,
                        interval=0.2)
    except AssertionError as err:
        pod = core.read_namespaced_pod(name, "default")
        events = core.list_namespaced_event("default",
                                            field_selector=f"involvedObject.name={name}").items
        raise AssertionError(f"{err}: node {pod.spec and pod.spec.node_name}, status "
                             f"{pod.status}, events {[(e.reason, e.message) for e in events]}"
                             ) from None


def on_host_as_it_was(nic: nics.StandIn) -> bool:
    """The stand-in NIC is back in the host's namespace, named, sized and
    down as it was made, without addresses (after its pod went)."""
    with Namespace() as host:
        link = host.find(nic.ifname, nic.mac)
    return link is not None and (link.name, link.mtu, link.up, link.addresses) == (
        nic.ifname, nic.mtu, False, frozenset())


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example_on_real_node(core: Any, res: Any, make_pod: PodMaker, file: str, prefix: str,
                         classes: Mapping[str, str]) -> Any:
    """A cookbook example's claim templates and pod as they are, but for
    names (``prefix``-ed), the device classes (``classes``: the example's
    name -> the install's) and the real node's own pod settings
    (busybox_pod's: the local busybox image, never pulled; the node's
    selector and toleration; no token). The pod, Running."""
    base = busybox_pod("base", "")["spec"]
    pod: dict[str, Any] = {}
    for obj in yaml.safe_load_all((EXAMPLES / file).read_text()):
        obj["metadata"]["name"] = f"{prefix}-{obj['metadata']['name']}"
        if obj["kind"] == "ResourceClaimTemplate":
            for r in obj["spec"]["spec"]["devices"]["requests"]:
                r["exactly"]["deviceClassName"] = classes[r["exactly"]["deviceClassName"]]
            # compact with sorted keys, as kubectl sends it: opaque parameters
            # in any other spelling make every later claim status write fail
            # (harness.dra_net.create_claim says why)
            JsonApi(res.api_client).request(
                "POST", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaimtemplates",
                body=canonical(obj))
        else:
            pod = obj
    spec = pod["spec"]
    for c in spec["resourceClaims"]:
        c["resourceClaimTemplateName"] = f"{prefix}-{c['resourceClaimTemplateName']}"
    spec.update({k: base[k] for k in ("nodeSelector", "tolerations",
                                      "automountServiceAccountToken", "enableServiceLinks",
                                      "terminationGracePeriodSeconds")})
    for c in spec["containers"]:
        c.update(image=base["containers"][0]["image"], imagePullPolicy="Never")
    make_pod(pod)
    return wait_phase(core, pod["metadata"]["name"], {"Running"})
