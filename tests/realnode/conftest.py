"""The real node (a real kubelet + containerd + runc, docs/design.md §9) on the
session's control plane: added for this package's tests, then removed, so
the kwok tests elsewhere never see it."""

from __future__ import annotations

import contextlib
import re
import shutil
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
from toposerve.kubeapi import ApiError, JsonApi
from toposerve.localcluster import install as inst
from toposerve.localcluster.realnode import nics
from toposerve.localcluster.realnode import node as realnode
from toposerve.localcluster.realnode.gpu_driver import DRIVER as GPU_DRIVER
from toposerve.localcluster.realnode.gpu_driver import GpuDriver
from toposerve.localcluster.realnode.paths import (
    NODE_NAME,
    REAL_NODE_LABEL,
    REAL_NODE_TOLERATION,
    Layout,
    default_layout,
)
from toposerve.localcluster.realnode.pods import busybox_pod
from toposerve.manifests.chart import RELEASE, chart_dir
from toposerve.manifests.values import InstallValues
from toposerve.router.ha.pod_label import ROLE_LABEL


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


@contextlib.contextmanager
def gpu_driver_running(res: Any, driver: GpuDriver, device_class: str,
                       template: str) -> Iterator[None]:
    """``driver`` started (registered), a DeviceClass of its whole GPUs and
    a claim template of one (request ``gpu``) in ``default``; after, the
    driver stopped (exit 0 asserted) and both deleted."""
    res.create_device_class({"metadata": {"name": device_class}, "spec": {"selectors": [{
        "cel": {"expression": f"device.driver == '{GPU_DRIVER}' && "
                              f"device.attributes['{GPU_DRIVER}'].type == 'gpu'"}}]}})
    res.create_namespaced_resource_claim_template("default", {
        "metadata": {"name": template},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": device_class}}]}}}})
    try:
        driver.start()
        yield
    finally:
        rc = driver.stop()
        with contextlib.suppress(ApiException):
            res.delete_namespaced_resource_claim_template(template, "default")
        with contextlib.suppress(ApiException):
            res.delete_device_class(device_class)
    assert rc == 0, driver.log.read_text()[-1500:]


def on_host_as_it_was(nic: nics.StandIn) -> bool:
    """The stand-in NIC is back in the host's namespace, named, sized and
    down as it was made, without addresses (after its pod went)."""
    with Namespace() as host:
        link = host.find(nic.ifname, nic.mac)
    return link is not None and (link.name, link.mtu, link.up, link.addresses) == (
        nic.ifname, nic.mtu, False, frozenset())


def sim_pod(image: str, name: str, port: int, app: str, model: str,
            annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    """`toposerve sim` of the installed image (a model server) on the node's
    loopback, labelled ``app``; Ready once it answers, which the router's
    discovery waits for. On the host network every pod has the node's IP,
    so each one listens on a port of its own."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": app},
                         "annotations": dict(annotations or {})},
            "spec": {"nodeSelector": {REAL_NODE_LABEL: "real"},
                     "tolerations": [REAL_NODE_TOLERATION], "hostNetwork": True,
                     "dnsPolicy": "Default", "automountServiceAccountToken": False,
                     "enableServiceLinks": False, "terminationGracePeriodSeconds": 1,
                     "containers": [{
                         "name": "sim", "image": image, "imagePullPolicy": "Never",
                         "command": ["toposerve", "sim", "--host=127.0.0.1",
                                     f"--port={port}", f"--model={model}"],
                         "ports": [{"name": "http", "containerPort": port}],
                         "readinessProbe": {"periodSeconds": 1, "httpGet": {
                             "host": "127.0.0.1", "port": port, "path": "/health"}}}]}}


def delete_kept(core: Any, values: InstallValues, namespace: str) -> None:
    """After an uninstall, what it keeps on purpose (the generated Secrets,
    the router's Namespace) and the release's ``namespace`` (`helm install
    --create-namespace` made it, outside the release): later tests start
    clean."""
    for obj in inst.kept_objects(values):
        with contextlib.suppress(ApiException):
            if obj["kind"] == "Namespace":
                core.delete_namespace(obj["metadata"]["name"])
            else:
                core.delete_namespaced_secret(obj["metadata"]["name"],
                                              obj["metadata"]["namespace"])
    with contextlib.suppress(ApiException):
        core.delete_namespace(namespace)
    gone = {namespace, values.router.namespace or namespace}
    wait_for("the namespaces gone", lambda: not gone & {
        n.metadata.name for n in core.list_namespace().items}, timeout=120)


def router_roles(core: Any, namespace: str) -> dict[str, Any]:
    """The router pods by role, once there are a leader and a standby."""
    pods = [p for p in core.list_namespaced_pod(
        namespace, label_selector="app.kubernetes.io/component=router").items
        if p.metadata.deletion_timestamp is None and p.status.phase == "Running"]
    by = {str((p.metadata.labels or {}).get(ROLE_LABEL)): p for p in pods}
    return by if len(pods) == 2 and set(by) == {"leader", "standby"} else {}


def router_pair(core: Any, namespace: str, timeout: float = 60) -> dict[str, Any]:
    """The router pods by role once there are a leader and a standby; else
    an AssertionError with each pod's phase, role and last log lines."""
    try:
        got: dict[str, Any] = wait_for("a leading and a standing-by router pod",
                                       lambda: router_roles(core, namespace), timeout=timeout)
        return got
    except AssertionError as err:
        pods = core.list_namespaced_pod(
            namespace, label_selector="app.kubernetes.io/component=router").items
        said = [f"{p.metadata.name} {p.status.phase} role="
                f"{(p.metadata.labels or {}).get(ROLE_LABEL)}: " + " | ".join(
                    core.read_namespaced_pod_log(p.metadata.name, namespace,
                                                 tail_lines=8).splitlines())
                for p in pods if p.status.phase == "Running"]
        raise AssertionError(f"{err}: {'; '.join(said) or 'no router pod running'}") from None


REPLICA_LABEL = "toposerve.io/router-replica"  # on each replica's pod (one Deployment each)


def router_replicas(core: Any, namespace: str, count: int = 2, timeout: float = 60
                    ) -> dict[str, Any]:
    """The running router pods by replica, once there are ``count`` (an
    active-active install: every one serves); else an AssertionError with
    what is there."""
    def running() -> dict[str, Any]:
        pods = [p for p in core.list_namespaced_pod(
            namespace, label_selector="app.kubernetes.io/component=router").items
            if p.metadata.deletion_timestamp is None and p.status.phase == "Running"]
        by = {str((p.metadata.labels or {}).get(REPLICA_LABEL)): p for p in pods}
        return by if len(pods) == len(by) == count else {}

    try:
        got: dict[str, Any] = wait_for(f"{count} running router pods", running,
                                       timeout=timeout)
        return got
    except AssertionError as err:
        pods = core.list_namespaced_pod(
            namespace, label_selector="app.kubernetes.io/component=router").items
        raise AssertionError(f"{err}: " + "; ".join(
            f"{p.metadata.name} {p.status.phase}" for p in pods) or "none") from None


def host_url(pod: Any, port: int = 0) -> str:
    """The address of a host-network pod's ``port``-th container port."""
    assert pod.spec.host_network
    return f"http://127.0.0.1:{pod.spec.containers[0].ports[port].container_port}"


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


def previous_chart(dest: Path) -> tuple[Path, str]:
    """The chart as its previous version would be, in ``dest``: this tree's
    chart with ``version`` in Chart.yaml lowered (0.1.0 -> 0.0.0, 1.2.3 ->
    1.2.2), nothing else changed. No version of the chart was released
    before this one, and the chart at the commit before the release install
    (44a127d) has the same templates and the same version, so upgrading
    from it would change no pod. Every pod template carries the chart's
    version (label helm.sh/chart), so the upgrade to this tree's chart rolls
    every workload, the drivers' DaemonSets included: what an admin's
    ``helm upgrade`` to a new chart version does. Its version too."""
    target = dest / "toposerve"
    shutil.copytree(chart_dir(), target)
    chart_yaml = target / "Chart.yaml"
    text = chart_yaml.read_text()
    found = re.search(r"^version: (\d+)\.(\d+)\.(\d+)$", text, re.M)
    assert found, "Chart.yaml has no plain MAJOR.MINOR.PATCH version"
    parts = [int(x) for x in found.groups()]
    at = max(i for i, v in enumerate(parts) if v > 0 or i == 0)
    parts[at] -= 1
    lower = ".".join(str(v) for v in parts)
    chart_yaml.write_text(text[:found.start()] + f"version: {lower}" + text[found.end():])
    return target, lower


def labelled_objects(api: Any, selector: str) -> list[str]:
    """Every object the API server lists with labels ``selector``, of every
    listable kind it serves (built-in and custom resources alike), as
    ``kind namespace/name``: what an uninstall must not leave behind."""
    rest = JsonApi(api)
    groups = [("/api/v1", "v1")] + [
        (f"/apis/{g['preferredVersion']['groupVersion']}", g["preferredVersion"]["groupVersion"])
        for g in rest.request("GET", "/apis").get("groups") or []]
    found: list[str] = []
    for base, _version in groups:
        try:
            resources = rest.request("GET", base).get("resources") or []
        except ApiError:
            continue  # a group whose server went (an aggregated API): nothing of ours
        for r in resources:
            # events are the API server's record of what happened, not objects of ours
            if "/" in r["name"] or "list" not in r.get("verbs", []) or r["kind"] == "Event":
                continue
            items = rest.request("GET", f"{base}/{r['name']}",
                                 [("labelSelector", selector)]).get("items") or []
            found += [f"{r['kind']} {i['metadata'].get('namespace', '')}/"
                      f"{i['metadata']['name']}" for i in items]
    return sorted(set(found))


def drop_failed_release(cluster: str, namespace: str) -> None:
    """After an install that failed part way: its release uninstalled, so
    that its driver pods do not outlive the module next to the next
    install's (the next driver's start deletes its node's slices)."""
    with contextlib.suppress(inst.InstallError):
        inst.helm(cluster, ["uninstall", RELEASE, "--namespace", namespace, "--wait",
                            "--ignore-not-found"])
