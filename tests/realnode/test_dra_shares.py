"""GPU memory as consumable capacity on the real node: the GPU driver with
``--memory-shares`` publishes whole GPUs with ``allowMultipleAllocations``
and a memory request policy, which the apiserver keeps; the real
kube-scheduler gives two claims of 30Gi shares of one 80Gi GPU (each pinned
to ``gpu-0`` by a selector on its index), the real kubelet runs both pods
with their share in the environment, a third claim of 30Gi stays pending
with the scheduler's reason, and once one share's pod goes (unprepared on
its own, the other share untouched) the third runs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest
from kubernetes import client

from harness.waiting import wait_for
from tests.conftest import Cluster
from tests.realnode.conftest import PodMaker, ensure_started, wait_phase
from toposerve.dra_driver.gpu.driver import CDI_CLASS, CDI_VENDOR
from toposerve.dra_driver.kubeletplugin.cdi import CdiSpecs
from toposerve.dra_driver.kubeletplugin.checkpoint import Checkpoint, ClaimState, read_boot_id
from toposerve.kubeapi import ApiError, JsonApi
from toposerve.localcluster.clusters import kubeconfig_path
from toposerve.localcluster.realnode.gpu_driver import CDI_ROOT, DRIVER, PLUGIN_DIR, GpuDriver
from toposerve.localcluster.realnode.paths import NODE_NAME
from toposerve.localcluster.realnode.pods import busybox_pod

pytestmark = [pytest.mark.cluster, pytest.mark.realnode]

CLASS = "realnode-gpu-share"
TEMPLATE = "realnode-gpu0-30gi"
GI = 2**30
RES = "/apis/resource.k8s.io/v1"


@dataclass
class Env:
    core: Any
    rest: JsonApi
    driver: GpuDriver
    cdi: CdiSpecs


def _gpu0(rest: JsonApi) -> dict[str, Any] | None:
    slices = rest.request("GET", f"{RES}/resourceslices", [
        ("fieldSelector", f"spec.nodeName={NODE_NAME},spec.driver={DRIVER}")])["items"]
    return next((d for s in slices for d in s["spec"].get("devices") or []
                 if d["name"] == "gpu-0"), None)


@pytest.fixture(scope="module")
def env(real_node_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    ensure_started(real_node_cluster)
    rest = JsonApi(real_node_cluster.api)
    # the chart's share class: shareable devices only, so a memory request is
    # a share, never a whole GPU that merely has that much memory
    rest.request("POST", f"{RES}/deviceclasses", body={
        "metadata": {"name": CLASS}, "spec": {"selectors": [{"cel": {
            "expression": f"device.driver == '{DRIVER}' && device.allowMultipleAllocations"}}]}})
    rest.request("POST", f"{RES}/namespaces/default/resourceclaimtemplates", body={
        "metadata": {"name": TEMPLATE}, "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {
                "deviceClassName": CLASS,
                # one GPU, so that the test is about what one GPU holds
                "selectors": [{"cel": {
                    "expression": f"device.attributes['{DRIVER}'].index == 0"}}],
                "capacity": {"requests": {"memory": "30Gi"}}}}]}}}})
    driver = GpuDriver(kubeconfig_path(real_node_cluster.name),
                       tmp_path_factory.mktemp("realnode-dra-shares"), memory_shares=True)
    driver.start()
    try:
        yield Env(core=client.CoreV1Api(real_node_cluster.api), rest=rest, driver=driver,
                  cdi=CdiSpecs(CDI_ROOT, CDI_VENDOR, CDI_CLASS))
    finally:
        rc = driver.stop()
        for path in (f"{RES}/namespaces/default/resourceclaimtemplates/{TEMPLATE}",
                     f"{RES}/deviceclasses/{CLASS}"):
            with contextlib.suppress(ApiError):
                rest.request("DELETE", path)
        assert rc == 0, driver.log.read_text()[-1500:]


@dataclass
class Share:
    pod: str
    claim_uid: str
    share_id: str
    consumed: str


def _share(env: Env, pod_name: str) -> Share:
    pod = env.core.read_namespaced_pod(pod_name, "default")
    claim_name = pod.status.resource_claim_statuses[0].resource_claim_name
    claim = env.rest.request("GET", f"{RES}/namespaces/default/resourceclaims/{claim_name}")
    results = claim["status"]["allocation"]["devices"]["results"]
    assert [(r["device"], r["pool"]) for r in results] == [("gpu-0", NODE_NAME)]
    # the kubelet plugin's status: one entry per share, with its ID
    status = [(d["device"], d.get("shareID"), d.get("data", {}).get("memoryBytes"))
              for d in claim["status"].get("devices") or []]
    assert status == [("gpu-0", results[0]["shareID"], 30 * GI)], status
    return Share(pod_name, claim["metadata"]["uid"], results[0]["shareID"],
                 results[0]["consumedCapacity"]["memory"])


def _checkpoint() -> dict[str, tuple[ClaimState, list[str | None]]]:
    data, _ = Checkpoint(PLUGIN_DIR / "checkpoint.json", read_boot_id()).load()
    return {uid: (e.state, [d.share_id for d in e.devices]) for uid, e in data.claims.items()}


def _share_pod(env: Env, make_pod: PodMaker, name: str) -> None:
    make_pod(busybox_pod(name, "env; sleep 3600",
                         claims=[{"name": "gpu", "resourceClaimTemplateName": TEMPLATE}]))


def _logged(env: Env, pod: str, line: str) -> bool:
    return line in env.core.read_namespaced_pod_log(pod, "default").splitlines()


def _unschedulable(env: Env, name: str) -> str | None:
    pod = env.core.read_namespaced_pod(name, "default")
    for c in pod.status.conditions or []:
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            return str(c.message)
    return None


def test_the_slice_keeps_the_shareable_gpu(env: Env) -> None:
    """The apiserver keeps both fields (it drops them with the gate off)."""
    def shareable() -> Any:
        d = _gpu0(env.rest)
        return d if d is not None and d.get("allowMultipleAllocations") else None

    gpu0 = wait_for("gpu-0 published shareable", shareable, timeout=30)
    assert gpu0["capacity"]["memory"] == {"value": "80Gi", "requestPolicy": {
        "default": "80Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}}
    assert "consumesCounters" not in gpu0


def test_two_shares_of_one_gpu_run_a_third_waits_for_room(env: Env,
                                                         make_pod: PodMaker) -> None:
    for name in ("rn-share-a", "rn-share-b"):
        _share_pod(env, make_pod, name)
    for name in ("rn-share-a", "rn-share-b"):
        wait_phase(env.core, name, {"Running"})
    a, b = _share(env, "rn-share-a"), _share(env, "rn-share-b")
    assert a.share_id != b.share_id and a.consumed == b.consumed == "30Gi"
    line = f"TOPOSERVE_GPU_MEMORY_BYTES={30 * GI}"
    for s in (a, b):
        wait_for(f"{s.pod}'s share in its environment", partial(_logged, env, s.pod, line))
        assert _checkpoint()[s.claim_uid] == (ClaimState.PREPARE_COMPLETED, [s.share_id])
        assert env.cdi.path(s.claim_uid).exists()

    # 20Gi are left of gpu-0's 80Gi: the scheduler's allocator refuses a third 30Gi
    _share_pod(env, make_pod, "rn-share-c")
    message = str(wait_for("the third share unschedulable",
                           lambda: _unschedulable(env, "rn-share-c"), timeout=60))
    assert "cannot allocate all claims" in message, message
    assert env.core.read_namespaced_pod("rn-share-c", "default").status.phase == "Pending"

    # one share's pod goes: its share alone is unprepared, the other stays
    env.core.delete_namespaced_pod(a.pod, "default", grace_period_seconds=1)
    wait_for(f"{a.pod} unprepared", lambda: a.claim_uid not in _checkpoint()
             and not env.cdi.path(a.claim_uid).exists(), timeout=60)
    assert _checkpoint()[b.claim_uid] == (ClaimState.PREPARE_COMPLETED, [b.share_id])
    assert env.cdi.path(b.claim_uid).exists()
    assert env.core.read_namespaced_pod(b.pod, "default").status.phase == "Running"

    # and the third gets the room it frees
    wait_phase(env.core, "rn-share-c", {"Running"}, timeout=90)
    c = _share(env, "rn-share-c")
    assert c.share_id not in (a.share_id, b.share_id)
    wait_for("the third share's environment", lambda: _logged(env, c.pod, line))
