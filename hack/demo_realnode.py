"""``make demo``, the real node: a busybox pod with a GPU claim, prepared
by the installed GPU driver's DaemonSet pod (its hardware a fake HGX H100
sysfs tree), prints the environment and device nodes the driver's CDI
edits gave its container."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from demo_support import DemoError, create, items, wait_until
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from toposerve.kubeapi import ApiError, JsonApi
from toposerve.localcluster.clusters import api_client
from toposerve.localcluster.install import PROFILE
from toposerve.localcluster.realnode.paths import NODE_NAME
from toposerve.localcluster.realnode.pods import busybox_pod
from toposerve.manifests.values import DeviceClasses

Say = Callable[[str], None]

POD = "real-gpu"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
PODS = "/api/v1/namespaces/default/pods"
WHOLE_GPU = "device.attributes['gpu.toposerve.io'].type == 'gpu'"
# what the driver's CDI edits put into a container
INJECTED = ("NVIDIA_VISIBLE_DEVICES=", "CUDA_VISIBLE_DEVICES=", "TOPOSERVE_")


def _pod_log(rest: JsonApi, core: Any) -> list[str] | None:
    """The container's output once it has printed its environment."""
    pod = rest.request("GET", f"{PODS}/{POD}")
    if (pod.get("status") or {}).get("phase") == "Failed":
        raise DemoError(f"pod {POD} failed on the real node")
    try:
        lines = str(core.read_namespaced_pod_log(POD, "default")).splitlines()
    except ApiException:
        return None  # not started yet
    return lines if any(x.startswith("NVIDIA_VISIBLE_DEVICES=") for x in lines) else None


def _gone(rest: JsonApi, path: str) -> bool:
    try:
        rest.request("GET", path)
    except ApiError as err:
        if err.status == 404:
            return True
        raise
    return False


def _delete(rest: JsonApi, path: str, query: list[tuple[str, Any]]) -> None:
    try:
        rest.request("DELETE", path, query)
    except ApiError as err:
        if err.status != 404:
            raise


def _show(rest: JsonApi, core: Any) -> str:
    slices = f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName={NODE_NAME}"
    gpus = wait_until("the real node's GPU slices", lambda: [
        d for s in items(rest, slices) for d in s["spec"].get("devices") or []
        if d["attributes"].get("type", {}).get("string") == "gpu"], timeout=30)
    print(f"   the installed GPU driver (a DaemonSet pod on {NODE_NAME}) published "
          f"{len(gpus)} GPUs of a fake {PROFILE} sysfs tree")
    create(rest, CLAIMS, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": POD},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": DeviceClasses().gpu,
            "selectors": [{"cel": {"expression": WHOLE_GPU}}]}}]}}})
    started = time.monotonic()
    create(rest, PODS, busybox_pod(POD, "env | sort; ls /dev; sleep 3600",
                                   claims=[{"name": "gpu", "resourceClaimName": POD}]))
    lines = wait_until(f"pod {POD} to print its environment", lambda: _pod_log(rest, core),
                       timeout=60)
    claim = rest.request("GET", f"{CLAIMS}/{POD}")
    dev = claim["status"]["allocation"]["devices"]["results"][0]["device"]
    print(f"   pod {POD} (busybox, a real container) got {dev} and ran in "
          f"{time.monotonic() - started:.1f}s; what the driver injected:")
    injected = [line for line in lines if line.startswith(INJECTED)]
    for line in injected:
        print(f"     {line}")
    nodes = [x for x in lines if x.startswith("nvidia")]
    print(f"     /dev: {' '.join(nodes)}")
    return f"gpu: {NODE_NAME}/{dev}, {len(injected)} variables and {len(nodes)} device nodes"


def real_node_pod(name: str, say: Say) -> str:
    """Step: one pod on the real node with its injected device environment;
    what its claim got."""
    say("4. The real node: a pod with a GPU claim, prepared by the installed driver")
    api = api_client(name)
    rest = JsonApi(api)
    try:
        return _show(rest, client.CoreV1Api(api))
    finally:
        # while the driver runs, so the kubelet can unprepare the claim
        _delete(rest, f"{PODS}/{POD}", [("gracePeriodSeconds", 1)])
        wait_until(f"pod {POD} gone", lambda: _gone(rest, f"{PODS}/{POD}"), timeout=60)
        _delete(rest, f"{CLAIMS}/{POD}", [])
