"""``make demo``, the NIC hand-off on the real node: ``toposerve driver
net`` beside ``toposerve driver gpu`` (both on the fake HGX H100 sysfs
tree, its NICs veth stand-ins), and a pod with one claim for a GPU and the
NIC on the same PCIe root; the pod lists its interfaces, the NIC among
them renamed net1 with its address, and the fabric end pings it. Skipped,
with the reason, when the real node is not running for the demo cluster."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from demo_realnode import CLAIMS, PODS, WHOLE_GPU, Say, _delete, _gone
from demo_support import DemoError, create, wait_until
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kubeapi import JsonApi
from localcluster.clusters import api_client, kubeconfig_path
from localcluster.realnode import nics
from localcluster.realnode import node as realnode
from localcluster.realnode.gpu_driver import GpuDriver
from localcluster.realnode.net_driver import NetDriver
from localcluster.realnode.paths import NODE_NAME
from localcluster.realnode.pods import busybox_pod
from manifests.values import DeviceClasses

POD = "real-gpu-nic"
ROOT = "resource.kubernetes.io/pcieRoot"


def _claim(nic: nics.StandIn) -> dict[str, Any]:
    """A GPU and this NIC (its fabric is 198.18.<i>.0/24), on one PCIe root:
    the scheduler has to find the GPU that shares the NIC's root."""
    classes = DeviceClasses()
    doc = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"name": POD},
           "spec": {"devices": {
               "requests": [
                   {"name": "gpu", "exactly": {"deviceClassName": classes.gpu,
                                               "selectors": [{"cel": {"expression": WHOLE_GPU}}]}},
                   {"name": "nic", "exactly": {"deviceClassName": classes.nic, "selectors": [
                       {"cel": {"expression": "device.attributes['net.toposerve.io'].ifName"
                                              f" == '{nic.ifname}'"}}]}}],
               "constraints": [{"requests": ["gpu", "nic"], "matchAttribute": ROOT}],
               "config": [{"requests": ["nic"], "opaque": {"driver": "net.toposerve.io",
                                                           "parameters": {
                   "apiVersion": "net.toposerve.io/v1", "kind": "NetConfig",
                   "interfaceName": "net1", "addresses": [str(nic.pod_address())],
                   "mtu": 1500}}}]}}}
    # sorted keys: the apiserver keeps opaque parameters byte for byte, and
    # only Go's own form survives the claim's later status updates
    return dict(json.loads(json.dumps(doc, sort_keys=True)))


def _root(rest: JsonApi, driver: str, device: str) -> str:
    got = rest.request("GET", "/apis/resource.k8s.io/v1/resourceslices",
                       [("fieldSelector", f"spec.driver={driver}")])
    for s in got["items"]:
        for d in s["spec"].get("devices") or []:
            if d["name"] == device and s["spec"].get("nodeName") == NODE_NAME:
                return str(d["attributes"][ROOT]["string"])
    raise DemoError(f"{device} of {driver} is not published for the real node")


def _log(core: Any) -> list[str] | None:
    try:
        lines = str(core.read_namespaced_pod_log(POD, "default")).splitlines()
    except ApiException:
        return None
    return lines if "READY" in lines else None


def _show(rest: JsonApi, core: Any, net: NetDriver) -> None:
    nic = net.stand_ins()[0]
    started = time.monotonic()
    create(rest, CLAIMS, _claim(nic))
    create(rest, PODS, busybox_pod(POD, "ip -o -4 addr show; echo net1 mtu "
                                        "$(cat /sys/class/net/net1/mtu) mac "
                                        "$(cat /sys/class/net/net1/address); "
                                        "echo READY; sleep 3600",
                                   claims=[{"name": "devs", "resourceClaimName": POD}]))
    lines = wait_until(f"pod {POD} to list its interfaces", lambda: _log(core), timeout=90)
    claim = rest.request("GET", f"{CLAIMS}/{POD}")
    got = {r["request"]: r for r in claim["status"]["allocation"]["devices"]["results"]}
    gpu, dev = got["gpu"]["device"], got["nic"]["device"]
    print(f"   pod {POD} ran in {time.monotonic() - started:.1f}s with {gpu} and {dev} "
          f"({nic.ifname} on the host), PCIe roots {_root(rest, 'gpu.toposerve.io', gpu)} "
          f"and {_root(rest, 'net.toposerve.io', dev)}")
    print("   inside the pod:")
    for line in lines[:-1]:
        print(f"     {' '.join(line.split()[:6])}")
    data = next((d.get("networkData") for d in claim["status"].get("devices") or []
                 if d.get("networkData")), None)
    print(f"   the claim's status.devices[].networkData: {json.dumps(data)}")
    ping = subprocess.run(["ip", "netns", "exec", nics.FABRIC_NETNS.name, "busybox", "ping",
                           "-c1", "-W2", str(nic.pod_address().ip)], capture_output=True,
                          text=True, check=False)
    print(f"   ping {nic.pod_address().ip} from the far end of {nic.ifname}: "
          f"{'answered' if ping.returncode == 0 else 'no answer'}")


def real_node_nic(name: str, say: Say) -> None:
    """Step: a GPU and the NIC on its PCIe root, the NIC moved into the pod."""
    say("8. The real node: `toposerve driver net`, a pod with a GPU and the NIC on its PCIe root")
    owner = realnode.running_owner()
    if owner is None or owner.cluster != name:
        print("   skipped: the real node is not running for this cluster (see step 7)")
        return
    api = api_client(name)
    rest, core = JsonApi(api), client.CoreV1Api(api)
    with tempfile.TemporaryDirectory(prefix="toposerve-demo-net-") as tmp:
        gpu = GpuDriver(kubeconfig_path(name), Path(tmp) / "gpu")
        net = NetDriver(kubeconfig_path(name), Path(tmp) / "net")
        gpu.start()
        try:
            net.start()
            print(f"   `toposerve driver net` registered with the kubelet: "
                  f"{len(net.stand_ins())} NIC stand-ins (veth, PCI identities from the "
                  "fake sysfs tree)")
            try:
                _show(rest, core, net)
            finally:
                _cleanup(rest)
                net.stop()
                net.remove_stand_ins()
        finally:
            gpu.stop()


def _cleanup(rest: JsonApi) -> None:
    """Pod first, while both drivers run, so the kubelet unprepares the claim
    and the CNI DEL brings the NIC back."""
    _delete(rest, f"{PODS}/{POD}", [("gracePeriodSeconds", 1)])
    wait_until(f"pod {POD} gone", lambda: _gone(rest, f"{PODS}/{POD}"), timeout=60)
    _delete(rest, f"{CLAIMS}/{POD}", [])
