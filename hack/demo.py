"""``make demo``: the main job end to end.

1. a real local cluster with three hardware profiles (kwok nodes) and a
   real kubelet node, its topology printed;
2. three model-server pods (kwok), simulated vLLM on their IPs; then the
   stack installed from its manifests on the real node: the images of
   ``make image`` imported, the GPU driver's DaemonSet, the extender, the
   second kube-scheduler, the router replicas and their Redis, the DeviceClasses
   (localcluster/install.py);
3. ``toposerve driver simulate`` publishing every kwok node's GPU and NIC
   slices, and a GPU+NIC claim on one PCIe root allocated by kube-scheduler
   (hack/demo_dra.py);
4. a pod on the real node with a GPU claim the installed driver prepared
   (hack/demo_realnode.py);
5. a wide-EP group and a P/D set placed by the installed second scheduler
   and extender, next to kube-scheduler alone (hack/demo_placement.py);
6. conversations through the installed router beside round-robin over
   the same servers (hack/demo_serving.py);
7. prefill and decode pods in two GB200 NVL72 domains, the router
   splitting each request, the decode half in the prefill half's domain;
8. a one-screen summary, its JSON and two PNGs (hack/demo_report.py);
9. everything uninstalled and torn down, also when a step fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from demo_dra import dra_slices
from demo_placement import placement
from demo_realnode import real_node_pod
from demo_report import report
from demo_serving import APP, PORT, model_pods, pd_split, routed_traffic
from demo_support import wait_until

from harness.procs import Procs
from toposerve.localcluster.cluster import ClusterSpec, down, running_clusters, up
from toposerve.localcluster.clusters import api_client
from toposerve.localcluster.install import (
    Installed,
    InstallError,
    built_images,
    install,
    install_status,
)
from toposerve.localcluster.install import uninstall as uninstall_stack
from toposerve.localcluster.realnode import node as realnode
from toposerve.localcluster.realnode.paths import NODE_NAME
from toposerve.localcluster.realnode.tools import find_node_tools
from toposerve.localcluster.tools import ToolsMissing
from toposerve.manifests.render import router_namespace, system_namespace

NAME = "demo"
OUT = Path(tempfile.gettempdir()) / "toposerve-demo"
ROUTER_WHERE = "the installed router, its replicas on the real node"


def say(msg: str) -> None:
    print(f"\n== {msg}", flush=True)


def progress(msg: str) -> None:
    print(f"   {msg.strip()}", flush=True)


def _cannot_run() -> str | None:
    """Why the demo cannot run on this machine, or None."""
    if os.geteuid() != 0:
        return "the real node needs root (its kubelet's paths and port are the machine's)"
    try:
        find_node_tools()
        built_images()
    except (ToolsMissing, InstallError) as err:
        return str(err)
    owner = realnode.running_owner()
    if owner is not None and owner.cluster != NAME:
        return f"the real node already runs for cluster {owner.cluster!r} (one per machine)"
    return None


def _show_install(installed: Installed) -> str:
    """The installed components and their pods; a router replica's URL."""
    v = installed.values
    namespaces = sorted({system_namespace(v), router_namespace(v)})
    st = wait_until("a router replica", lambda: (
        s if "routerURL" in (s := install_status(api_client(NAME), namespaces)) else None),
        timeout=60)
    for c in st["components"]:
        pods = ", ".join(f"{p['name']} on {p['node']}" for p in c["pods"])
        print(f"   {c['kind'].lower()}/{c['name']}: {c['ready']} available ({pods})")
    return str(st["routerURL"])


def main() -> int:
    reason = _cannot_run()
    if reason is not None:
        print(f"make demo: {reason}", file=sys.stderr)
        return 1
    started = time.monotonic()
    if NAME in running_clusters():
        down(NAME)
    say("1. cluster up: 8 HGX H100 nodes, 36 GB200 trays (2 NVL72 racks), 4 MI300X nodes "
        "(kwok), and a real kubelet node")
    up(ClusterSpec(name=NAME, groups=[("hgx-h100", 8), ("gb200-nvl72", 36), ("mi300x", 4)]))
    procs = Procs(Path(tempfile.mkdtemp(prefix="toposerve-demo-")))
    installed: Installed | None = None
    try:
        realnode.start(NAME, progress=progress)
        subprocess.run([sys.executable, "-m", "toposerve.main", "topology", "show",
                        "--name", NAME], check=True)
        urls = model_pods(NAME, say, procs)
        say(f"2b. Install: the stack from its manifests on the real node {NODE_NAME} "
            "(`toposerve cluster up --real-node --install`)")
        # the router finds the model pods by label, as the simulators
        # serve them: no API keys in the demo
        installed = install(NAME, progress=progress, sets=[
            f"router.config.discovery.kubernetes.labelSelector=app={APP}",
            f"router.config.discovery.kubernetes.port={PORT}", "router.apiKeys.enabled=false"])
        router = _show_install(installed)
        with dra_slices(NAME, say) as kwok_claim:  # the slices stay for the placement step
            real_claim = real_node_pod(NAME, say)
            runs, paths = placement(NAME, say,
                                    f"http://127.0.0.1:{installed.values.extender.port}")
        traffic = routed_traffic(say, urls, router)
        pd_split(NAME, say, procs)
        say(f"8. Summary ({ROUTER_WHERE}; {time.monotonic() - started:.0f}s so far)")
        report(OUT, runs, paths, {"gpu-and-nic (a kwok HGX H100 node, kube-scheduler)":
                                  kwok_claim, f"real-gpu ({NODE_NAME}, the installed driver)":
                                  [real_claim]}, traffic, ROUTER_WHERE)
    finally:
        say("9. Tear down: uninstall, the real node, the cluster")
        procs.close()
        try:
            if installed is not None:
                uninstall_stack(NAME, installed.values, progress=progress)
        finally:
            down(NAME)  # stops the real node first
    print(f"\n   make demo: done in {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
