"""``make demo``: the main job end to end, as far as it exists today.

1. a real local cluster with three hardware profiles, its topology printed;
2. three model-server pods (simulated vLLM) scheduled by the real scheduler,
   each simulator listening on its pod's 127.x IP;
3. the router discovering them through the Kubernetes API and routing a
   multi-turn conversation by prefix cache;
4. prefill and decode pods in two GB200 NVL72 domains, the router splitting
   each request between them, the decode half in the prefill half's NVLink
   domain (read from the nodes' topology labels), its KV pulled at NVLink
   speed;
5. ``toposerve driver simulate`` publishing every node's GPU and NIC slices,
   the shipped DeviceClasses, and a GPU+NIC claim on one PCIe root allocated
   by kube-scheduler (hack/demo_dra.py);
6. a wide-EP group and a P/D set placed by a second kube-scheduler that calls
   the extender, next to kube-scheduler alone (hack/demo_placement.py);
7. a pod on a real kubelet node with the devices ``toposerve driver gpu``
   injected, where the machine can run one (hack/demo_realnode.py);
8. everything torn down.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
from demo_dra import dra_slices
from demo_net import real_node_nic
from demo_placement import placement
from demo_realnode import real_node_pod
from kubernetes import client

from harness.procs import MODEL, Procs
from localcluster.cluster import ClusterSpec, down, running_clusters, up
from localcluster.clusters import api_client, kubeconfig_path
from localcluster.nodes import node_labels
from localcluster.pods import model_pod, wait_running
from topology.labels import PRESETS, DialectName, from_labels

NAME = "demo"


def say(msg: str) -> None:
    print(f"\n== {msg}", flush=True)


def run_pods(core: client.CoreV1Api, app: str, pods: dict[str, tuple[str, str | None]]
             ) -> dict[str, tuple[str, str]]:
    """Create ``pods`` (name -> (role, node or None for kube-scheduler));
    returns name -> (pod IP, node) once each runs."""
    for pod, (role, node) in pods.items():
        # the client takes a manifest dict as well as a V1Pod
        core.create_namespaced_pod("default", model_pod(pod, app, role, node))  # type: ignore[arg-type]
    return wait_running(core, list(pods))


def main() -> int:
    if NAME in running_clusters():
        down(NAME)
    say("1. cluster up: 8 HGX H100 nodes, 36 GB200 trays (2 NVL72 racks), 4 MI300X nodes")
    up(ClusterSpec(name=NAME, groups=[("hgx-h100", 8), ("gb200-nvl72", 36), ("mi300x", 4)]))
    procs = Procs(Path(tempfile.mkdtemp(prefix="toposerve-demo-")))
    try:
        subprocess.run([sys.executable, "-m", "toposerve_cli.main", "topology", "show",
                        "--name", NAME], check=True)
        say("2. three model-server pods, placed by kube-scheduler, run by kwok")
        core = client.CoreV1Api(api_client(NAME))
        ips = run_pods(core, "vllm", {f"vllm-{i}": ("prefill-decode", None) for i in range(3)})
        for pod, (ip, node) in sorted(ips.items()):
            procs.sim(host=ip, port=8000, time_scale=0.2)
            print(f"   {pod} on {node}: simulated vLLM listening on {ip}:8000")
        say("3. the router finds them through the Kubernetes API")
        router = procs.router({"discovery": {"kubernetes": {
            "namespace": "default", "labelSelector": "app=vllm", "port": 8000,
            "kubeconfig": str(kubeconfig_path(NAME))}}})
        print(f"   router on {router.url}; /ready: {httpx.get(router.url + '/ready').text}")
        for conv in ("alice", "bob"):
            msgs = [{"role": "system", "content": f"You help {conv}. " + "Be brief. " * 300}]
            for turn in range(3):
                msgs.append({"role": "user", "content": f"{conv}, question {turn}"})
                r = httpx.post(router.url + "/v1/chat/completions", timeout=30, json={
                    "model": MODEL, "messages": msgs, "max_tokens": 8})
                body = r.json()
                cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
                print(f"   {conv} turn {turn}: served by {r.headers['x-toposerve-endpoint']}, "
                      f"{cached}/{body['usage']['prompt_tokens']} prompt tokens from cache")
                msgs.append(body["choices"][0]["message"])
        decisions = [x for x in httpx.get(router.url + "/metrics").text.splitlines()
                     if x.startswith("toposerve_router_decisions_total")]
        print("   routing decisions by reason:\n     " + "\n     ".join(decisions))

        say("4. prefill/decode split across two GB200 NVL72 domains")
        gb200 = node_labels(core, "topology.toposerve.io/profile=gb200-nvl72")
        trays = sorted(gb200)
        # one prefill and one decode pod per NVL72 domain, each on its own tray
        pd = run_pods(core, "vllm-pd", {
            "prefill-0": ("prefill", trays[0]), "decode-0": ("decode", trays[1]),
            "prefill-1": ("prefill", trays[18]), "decode-1": ("decode", trays[19])})
        place = {node: from_labels(node, labels, PRESETS[DialectName.TOPOSERVE])
                 for node, labels in gb200.items()}
        domain = {node: str(p.nvlink) for node, p in place.items()}
        decode_sims = []
        for pod, (ip, node) in sorted(pd.items()):
            # each simulator knows its node's place, so a decode pays for its
            # KV pull what the topology model charges for the tier crossed
            p = place[node]
            sim = procs.sim(host=ip, port=8000, time_scale=0.2, node=node,
                            nvlink_domain=p.nvlink, rack=p.rack, block=p.block, zone=p.zone)
            if pod.startswith("decode"):
                decode_sims.append(sim)
            print(f"   {pod} on {node} ({domain[node]}): simulated vLLM on {ip}:8000")
        where = {f"{ip}:8000": f"{node}, {domain[node]}" for ip, node in pd.values()}
        split = procs.router({"discovery": {"kubernetes": {
            "namespace": "default", "labelSelector": "app=vllm-pd", "port": 8000,
            "kubeconfig": str(kubeconfig_path(NAME))}}, "disaggregation": {"enabled": True}})
        for doc in ("contract", "manual", "report"):
            r = httpx.post(split.url + "/v1/completions", timeout=30, json={
                "model": MODEL, "prompt": f"Summarise this {doc}. " + "Clause. " * 400,
                "max_tokens": 8})
            pre, dec = r.headers["x-toposerve-prefill-endpoint"], r.headers["x-toposerve-endpoint"]
            print(f"   {doc}: prefill on {pre} ({where[pre]})\n"
                  f"   {' ' * len(doc)}  decode  on {dec} ({where[dec]})")
        pulled = [s.counters() for s in decode_sims]
        gb = sum(c.get("vllm:nixl_bytes_transferred_sum", 0.0) for c in pulled) / 1e9
        ms = 1000 * sum(c.get("vllm:nixl_xfer_time_seconds_sum", 0.0) for c in pulled)
        pairs = [x for x in httpx.get(split.url + "/metrics").text.splitlines()
                 if x.startswith("toposerve_router_pd_pairs_total")]
        model_s = ms / 1000 / 0.2  # the simulators run 5x faster than model time
        print(f"   KV pulled by the decode pods: {gb:.1f} GB in {ms:.1f} ms of wall time, "
              f"{gb / model_s:.0f} GB/s in model time\n   pairs by tier:\n     "
              + "\n     ".join(pairs))

        with dra_slices(NAME, say):  # the slices stay published for the placement step
            placement(NAME, say)
        real_node_pod(NAME, say)
        real_node_nic(NAME, say)
    finally:
        say("9. tear down")
        procs.close()
        down(NAME)
    return 0


if __name__ == "__main__":
    sys.exit(main())
