"""``make demo``, the real node: a real kubelet joins the demo cluster,
``toposerve driver gpu`` registers with it (its hardware a fake HGX H100
sysfs tree), and a busybox pod with a GPU claim prints the environment and
device nodes the driver's CDI edits gave its container. Skipped, with the
reason, where the machine cannot run the real node."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from demo_support import TOPOSERVE, Background, DemoError, background, create, items, wait_until
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kubeapi import ApiError, JsonApi
from localcluster.clusters import api_client, kubeconfig_path
from localcluster.realnode import node as realnode
from localcluster.realnode.paths import NODE_NAME
from localcluster.realnode.pods import busybox_pod
from localcluster.realnode.tools import find_node_tools
from localcluster.tools import ToolsMissing
from manifests.values import DeviceClasses
from topology.profiles import load_profile
from topology.sysfs import write_profile_sysfs

Say = Callable[[str], None]
PROFILE = "hgx-h100"
POD = "real-gpu"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
PODS = "/api/v1/namespaces/default/pods"
WHOLE_GPU = "device.attributes['gpu.toposerve.io'].type == 'gpu'"
# what the driver's CDI edits put into a container
INJECTED = ("NVIDIA_VISIBLE_DEVICES=", "CUDA_VISIBLE_DEVICES=", "TOPOSERVE_")
GPU_NODES = [f"nvidia{i}" for i in range(8)] + ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]


def _cannot_run() -> str | None:
    """Why the real node cannot run here, or None."""
    if os.geteuid() != 0:
        return "the real node needs root (its kubelet's paths and port are the machine's)"
    try:
        find_node_tools()
    except ToolsMissing as err:
        return str(err)
    owner = realnode.running_owner()
    if owner is not None:
        return f"the real node already runs for cluster {owner.cluster!r} (one per machine)"
    return None


def _dev_root(dev: Path) -> Path:
    """Stand-ins for the GPUs' device nodes (/dev/null's numbers), so the
    container gets real, harmless device nodes."""
    dev.mkdir()
    for name in GPU_NODES:
        os.mknod(dev / name, 0o666 | 0o020000, os.makedev(1, 3))
    return dev


def _registered(driver: Background) -> bool:
    return driver.alive() and "registered with the kubelet" in driver.log.read_text()


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


def _show(rest: JsonApi, core: Any, driver: Background) -> None:
    wait_until("the kubelet to register the driver", lambda: _registered(driver), timeout=30)
    slices = f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName={NODE_NAME}"
    gpus = wait_until("the real node's GPU slices", lambda: [
        d for s in items(rest, slices) for d in s["spec"].get("devices") or []
        if d["attributes"].get("type", {}).get("string") == "gpu"], timeout=30)
    print(f"   `toposerve driver gpu --node-name {NODE_NAME}` registered with the kubelet, "
          f"published {len(gpus)} GPUs of a fake {PROFILE} sysfs tree")
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
    for line in lines:
        if line.startswith(INJECTED):
            print(f"     {line}")
    nodes = [x for x in lines if x.startswith("nvidia")]
    print(f"     /dev: {' '.join(nodes)}")


def real_node_pod(name: str, say: Say) -> None:
    """Step: one pod on the real node with its injected device environment."""
    say("7. The real node: a kubelet, `toposerve driver gpu`, a pod with a GPU claim")
    reason = _cannot_run()
    if reason is not None:
        print(f"   skipped: {reason}")
        return
    api = api_client(name)
    rest = JsonApi(api)
    kubeconfig = kubeconfig_path(name)
    try:
        realnode.start(name, progress=lambda m: print(f"   {m}", flush=True))
    except realnode.RealNodeError:
        owner = realnode.running_owner()
        if owner is None or owner.cluster == name:
            raise
        print(f"   skipped: the real node was just started for cluster {owner.cluster!r}")
        return
    # (cluster down stops the real node, also when this step fails)
    with tempfile.TemporaryDirectory(prefix="toposerve-demo-realnode-") as tmp:
        work = Path(tmp)
        sysfs = write_profile_sysfs(load_profile(PROFILE), work / "sysfs")
        argv = [*TOPOSERVE, "driver", "gpu", "--node-name", NODE_NAME,
                "--kubeconfig", str(kubeconfig), "--sysfs-root", str(sysfs),
                "--dev-root", str(_dev_root(work / "dev")), "--cdi-root", "/var/run/cdi",
                "--http-address", "127.0.0.1:0"]
        with background("toposerve driver gpu", argv, work / "driver.log") as driver:
            try:
                _show(rest, client.CoreV1Api(api), driver)
            finally:
                # while the driver runs, so the kubelet can unprepare the claim
                _delete(rest, f"{PODS}/{POD}", [("gracePeriodSeconds", 1)])
                wait_until(f"pod {POD} gone", lambda: _gone(rest, f"{PODS}/{POD}"), timeout=60)
                _delete(rest, f"{CLAIMS}/{POD}", [])
