"""Two DRA features of Kubernetes 1.37 with the GPU driver on the real node
(the real apiserver, scheduler, controller-manager and kubelet; the driver
as a host process over a fake sysfs tree, as in test_dra.py):

- extended resources a DeviceClass serves (DRAExtendedResource, GA in 1.37):
  a pod asking ``resources.limits`` for the class's ``extendedResourceName``
  (or its implicit ``deviceclass.resource.kubernetes.io/<class>``), with no
  claim of its own, gets a claim the scheduler makes; the kubelet prepares it
  through our plugin (the container's env shows our CDI edits) and
  unprepares it when the pod goes, and the claim goes with the pod;
- admin access (DRAAdminAccess, GA since 1.36): a monitoring claim with
  ``adminAccess`` in a namespace labelled for it is allocated the GPU a
  workload pod holds (a plain claim for it waits); both pods see the GPU,
  and either one's unprepare leaves the other prepared. The apiserver
  refuses such a claim in an unlabelled namespace. The node publishes whole
  GPUs only here: in 1.37.2 an admin claim cannot get an in-use device that
  consumes counters, as whole GPUs beside their partitions do
  (kubernetes#140729; docs/dra-driver.md)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client

from harness.waiting import wait_for
from tests.conftest import Cluster
from tests.realnode.conftest import PodMaker, ensure_started, wait_phase
from toposerve.dra_driver.gpu.devices import PARTITIONS_LABEL
from toposerve.dra_driver.gpu.driver import CDI_CLASS, CDI_VENDOR
from toposerve.dra_driver.kubeletplugin.cdi import CdiSpecs
from toposerve.dra_driver.kubeletplugin.checkpoint import Checkpoint, ClaimState, read_boot_id
from toposerve.kubeapi import ApiError, JsonApi
from toposerve.localcluster.clusters import kubeconfig_path
from toposerve.localcluster.realnode.gpu_driver import CDI_ROOT, DRIVER, PLUGIN_DIR, GpuDriver
from toposerve.localcluster.realnode.paths import NODE_NAME
from toposerve.localcluster.realnode.pods import busybox_pod

pytestmark = [pytest.mark.cluster, pytest.mark.realnode]

CLASS = "rn-features-gpu"
EXTENDED = "rn.toposerve.io/gpu"  # no device plugin on the node advertises it
IMPLICIT = f"deviceclass.resource.kubernetes.io/{CLASS}"
ADMIN_NS = "rn-gpu-monitoring"
ADMIN_LABEL = "resource.kubernetes.io/admin-access"
RES = "/apis/resource.k8s.io/v1"


@dataclass
class Env:
    rest: JsonApi
    core: Any  # CoreV1Api, for wait_phase
    driver: GpuDriver
    cdi: CdiSpecs


def _read(rest: JsonApi, path: str) -> dict[str, Any] | None:
    """The object at ``path``; None once it is gone."""
    try:
        got: dict[str, Any] = rest.request("GET", path)
    except ApiError as err:
        if err.status != 404:
            raise
        return None
    return got


def _gone(rest: JsonApi, path: str) -> bool:
    return _read(rest, path) is None


@pytest.fixture(scope="module")
def env(real_node_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    ensure_started(real_node_cluster)
    rest = JsonApi(real_node_cluster.api)
    labels = rest.request("GET", f"/api/v1/nodes/{NODE_NAME}")["metadata"].get("labels", {})
    driver = GpuDriver(kubeconfig_path(real_node_cluster.name),
                       tmp_path_factory.mktemp("realnode-dra-features"))
    try:
        # whole GPUs, also by an extended resource name
        rest.request("POST", f"{RES}/deviceclasses", body={
            "metadata": {"name": CLASS},
            "spec": {"extendedResourceName": EXTENDED, "selectors": [{"cel": {
                "expression": f"device.driver == '{DRIVER}' && "
                              f"device.attributes['{DRIVER}'].type == 'gpu'"}}]}})
        rest.request("POST", "/api/v1/namespaces", body={
            "metadata": {"name": ADMIN_NS, "labels": {ADMIN_LABEL: "true"}}})
        _label_node(rest, "off")  # before the driver starts: it publishes whole GPUs only
        driver.start()
        wait_for("whole GPUs only, without counters", lambda: {
            (d["name"], bool(d.get("consumesCounters"))) for d in _devices(rest)} == {
            (f"gpu-{i}", False) for i in range(8)}, timeout=30, interval=0.5)
        yield Env(rest=rest, core=client.CoreV1Api(real_node_cluster.api), driver=driver,
                  cdi=CdiSpecs(CDI_ROOT, CDI_VENDOR, CDI_CLASS))
    finally:
        rc = driver.stop()
        _label_node(rest, labels.get(PARTITIONS_LABEL))
        for path in (f"/api/v1/namespaces/{ADMIN_NS}", f"{RES}/deviceclasses/{CLASS}"):
            with contextlib.suppress(ApiError):
                rest.request("DELETE", path)
        wait_for(f"namespace {ADMIN_NS} gone",
                 lambda: _gone(rest, f"/api/v1/namespaces/{ADMIN_NS}"), timeout=120,
                 interval=0.5)
    assert rc == 0, driver.log.read_text()[-1500:]


def _label_node(rest: JsonApi, partitions: str | None) -> None:
    rest.request("PATCH", f"/api/v1/nodes/{NODE_NAME}",
                 body={"metadata": {"labels": {PARTITIONS_LABEL: partitions}}},
                 content_type="application/merge-patch+json")


def _checkpoint() -> dict[str, ClaimState]:
    data, _ = Checkpoint(PLUGIN_DIR / "checkpoint.json", read_boot_id()).load()
    return {uid: e.state for uid, e in data.claims.items()}


def _devices(rest: JsonApi) -> list[dict[str, Any]]:
    """The devices our driver publishes for the real node."""
    slices = rest.request("GET", f"{RES}/resourceslices", [
        ("fieldSelector", f"spec.nodeName={NODE_NAME},spec.driver={DRIVER}")])["items"]
    return [d for s in slices for d in s["spec"].get("devices") or []]


def _uuid(rest: JsonApi, device: str) -> str:
    (attrs,) = [d["attributes"] for d in _devices(rest) if d["name"] == device]
    # a slice may name our own attributes short or with the driver's domain
    return str((attrs.get("uuid") or attrs[f"{DRIVER}/uuid"])["string"])


def _pod(rest: JsonApi, namespace: str, name: str) -> dict[str, Any]:
    got = _read(rest, f"/api/v1/namespaces/{namespace}/pods/{name}")
    assert got is not None, f"pod {namespace}/{name} is gone"
    return got


def _claim(rest: JsonApi, namespace: str, name: str) -> dict[str, Any]:
    got = _read(rest, f"{RES}/namespaces/{namespace}/resourceclaims/{name}")
    assert got is not None, f"claim {namespace}/{name} is gone"
    return got


def _log(env: Env, namespace: str, pod: str) -> set[str]:
    return set(env.core.read_namespaced_pod_log(pod, namespace).splitlines())


def _delete_pod(rest: JsonApi, namespace: str, name: str) -> None:
    with contextlib.suppress(ApiError):
        rest.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}",
                     body={"gracePeriodSeconds": 1})
    wait_for(f"pod {namespace}/{name} gone",
             lambda: _gone(rest, f"/api/v1/namespaces/{namespace}/pods/{name}"), timeout=60,
             interval=0.5)


def _prepared(env: Env, claim_uid: str) -> bool:
    """The claim's CDI spec is there and the checkpoint has it complete."""
    return (env.cdi.path(claim_uid).exists()
            and _checkpoint().get(claim_uid) == ClaimState.PREPARE_COMPLETED)


def _unprepared(env: Env, claim_uid: str) -> bool:
    return not env.cdi.path(claim_uid).exists() and claim_uid not in _checkpoint()


@pytest.mark.parametrize("resource", [EXTENDED, IMPLICIT], ids=["explicit", "implicit"])
def test_a_pod_asking_an_extended_resource_gets_a_gpu_through_the_schedulers_claim(
        env: Env, make_pod: PodMaker, resource: str) -> None:
    node = env.rest.request("GET", f"/api/v1/nodes/{NODE_NAME}")
    assert resource not in node["status"].get("allocatable", {})  # no device plugin has it
    name = "rn-ext-gpu" if resource == EXTENDED else "rn-implicit-gpu"
    manifest = busybox_pod(name, "env; ls /dev; sleep 3600")
    manifest["spec"]["containers"][0]["resources"] = {"limits": {resource: "1"}}
    make_pod(manifest)
    wait_phase(env.core, name, {"Running"})
    pod = _pod(env.rest, "default", name)
    # the scheduler made one claim for the container's request and said so
    status = pod["status"]["extendedResourceClaimStatus"]
    claim_name = status["resourceClaimName"]
    assert claim_name.startswith(f"{name}-extended-resources-")
    assert status["requestMappings"] == [{"containerName": "main", "resourceName": resource,
                                          "requestName": "container-0-request-0"}]
    claim = _claim(env.rest, "default", claim_name)
    assert claim["metadata"]["annotations"] == {
        "resource.kubernetes.io/extended-resource-claim": "true"}
    assert [(o["kind"], o["uid"], o["controller"]) for o in claim["metadata"][
        "ownerReferences"]] == [("Pod", pod["metadata"]["uid"], True)]
    assert claim["spec"]["devices"]["requests"] == [{
        "name": "container-0-request-0", "exactly": {
            "deviceClassName": CLASS, "allocationMode": "ExactCount", "count": 1}}]
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == (DRIVER, NODE_NAME)
    # prepared by our plugin like any claim: its status, CDI spec and checkpoint
    assert [(d["device"], d["conditions"][0]["reason"]) for d in claim["status"]["devices"]] \
        == [(result["device"], "Prepared")]
    uid = claim["metadata"]["uid"]
    assert _prepared(env, uid)
    uuid = _uuid(env.rest, result["device"])
    index = result["device"].removeprefix("gpu-")
    wait_for("the container's env and devices in its log", lambda: {
        f"NVIDIA_VISIBLE_DEVICES={uuid}", f"CUDA_VISIBLE_DEVICES={uuid}", f"nvidia{index}",
        "nvidiactl"} <= _log(env, "default", name), timeout=30)
    # the pod goes: unprepared, and its claim goes with it
    _delete_pod(env.rest, "default", name)
    assert _unprepared(env, uid)
    wait_for(f"claim {claim_name} deleted", lambda: _gone(
        env.rest, f"{RES}/namespaces/default/resourceclaims/{claim_name}"), timeout=60,
        interval=0.5)


def _gpu_request(uuid: str | None = None, admin: bool = False) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": CLASS}
    if uuid is not None:
        exactly["selectors"] = [{"cel": {
            "expression": f"device.attributes['{DRIVER}'].uuid == '{uuid}'"}}]
    if admin:
        exactly["adminAccess"] = True
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


@contextlib.contextmanager
def _claim_made(rest: JsonApi, namespace: str, name: str,
                spec: dict[str, Any]) -> Iterator[None]:
    rest.request("POST", f"{RES}/namespaces/{namespace}/resourceclaims",
                 body={"metadata": {"name": name}, "spec": spec})
    try:
        yield
    finally:
        with contextlib.suppress(ApiError):
            rest.request("DELETE", f"{RES}/namespaces/{namespace}/resourceclaims/{name}")


def _monitor(env: Env, name: str, claim: str) -> str:
    """A pod of the monitoring namespace on ``claim``, Running; its name."""
    # its ServiceAccount comes from the controller-manager, after the namespace
    wait_for("the monitoring namespace's default ServiceAccount", lambda: not _gone(
        env.rest, f"/api/v1/namespaces/{ADMIN_NS}/serviceaccounts/default"), timeout=60,
        interval=0.5)
    env.rest.request("POST", f"/api/v1/namespaces/{ADMIN_NS}/pods", body=busybox_pod(
        name, "env; ls /dev; sleep 3600", claims=[{"name": "gpu", "resourceClaimName": claim}]))
    wait_for(f"pod {ADMIN_NS}/{name} Running", lambda: _pod(
        env.rest, ADMIN_NS, name)["status"].get("phase") == "Running", timeout=60,
        interval=0.5)
    return name


def test_an_admin_access_claim_shares_a_gpu_a_workload_holds(env: Env,
                                                             make_pod: PodMaker) -> None:
    rest = env.rest
    with contextlib.ExitStack() as stack:
        stack.enter_context(_claim_made(rest, "default", "rn-work", _gpu_request()))
        make_pod(busybox_pod("rn-work", "env; ls /dev; sleep 3600",
                             claims=[{"name": "gpu", "resourceClaimName": "rn-work"}]))
        wait_phase(env.core, "rn-work", {"Running"})
        work = _claim(rest, "default", "rn-work")
        (held,) = work["status"]["allocation"]["devices"]["results"]
        uuid, work_uid = _uuid(rest, held["device"]), work["metadata"]["uid"]
        assert "adminAccess" not in held

        # admin access outside a labelled namespace: refused by the apiserver
        with pytest.raises(ApiError) as refused:
            rest.request("POST", f"{RES}/namespaces/default/resourceclaims", body={
                "metadata": {"name": "rn-monitor"}, "spec": _gpu_request(uuid, admin=True)})
        assert refused.value.status == 422
        assert ("admin access to devices requires the `resource.kubernetes.io/admin-access: "
                "true` label on the containing namespace") in str(refused.value)

        # the GPU is taken: a plain claim for it waits
        stack.enter_context(_claim_made(rest, "default", "rn-plain", _gpu_request(uuid)))
        make_pod(busybox_pod("rn-plain", "sleep 3600",
                             claims=[{"name": "gpu", "resourceClaimName": "rn-plain"}]))

        def unschedulable() -> bool:
            conds = _pod(rest, "default", "rn-plain")["status"].get("conditions") or []
            return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                       for c in conds)

        wait_for("the plain claim's pod unschedulable", unschedulable, timeout=60,
                 interval=0.5)
        _delete_pod(rest, "default", "rn-plain")

        # ... an admin-access claim in the labelled namespace gets it all the same
        stack.enter_context(_claim_made(rest, ADMIN_NS, "rn-monitor",
                                        _gpu_request(uuid, admin=True)))
        stack.callback(_delete_pod, rest, ADMIN_NS, "rn-monitor-1")
        _monitor(env, "rn-monitor-1", "rn-monitor")
        monitor = _claim(rest, ADMIN_NS, "rn-monitor")
        (got,) = monitor["status"]["allocation"]["devices"]["results"]
        assert (got["device"], got["adminAccess"]) == (held["device"], True)
        monitor_uid = monitor["metadata"]["uid"]
        seen = {f"NVIDIA_VISIBLE_DEVICES={uuid}", f"nvidia{held['device'].removeprefix('gpu-')}"}
        wait_for("the GPU in the monitoring container", lambda: seen <= _log(
            env, ADMIN_NS, "rn-monitor-1"), timeout=30)
        assert seen <= _log(env, "default", "rn-work")
        assert _prepared(env, work_uid) and _prepared(env, monitor_uid)
        assert env.cdi.path(work_uid) != env.cdi.path(monitor_uid)
        before = _pod(rest, "default", "rn-work")["status"]["containerStatuses"][0]

        # the monitor goes: its claim unprepared, the workload's untouched
        _delete_pod(rest, ADMIN_NS, "rn-monitor-1")
        assert _unprepared(env, monitor_uid) and _prepared(env, work_uid)
        after = _pod(rest, "default", "rn-work")["status"]
        assert after["phase"] == "Running"
        assert (after["containerStatuses"][0]["containerID"],
                after["containerStatuses"][0]["restartCount"]) == (before["containerID"], 0)

        # a monitor again; then the workload goes: the monitor's claim stays prepared
        stack.callback(_delete_pod, rest, ADMIN_NS, "rn-monitor-2")
        _monitor(env, "rn-monitor-2", "rn-monitor")
        assert _prepared(env, monitor_uid)
        _delete_pod(rest, "default", "rn-work")
        assert _unprepared(env, work_uid) and _prepared(env, monitor_uid)
        assert _pod(rest, ADMIN_NS, "rn-monitor-2")["status"]["phase"] == "Running"
        _delete_pod(rest, ADMIN_NS, "rn-monitor-2")
        assert _unprepared(env, monitor_uid)
