"""Model-server pods on the local cluster: kwok runs them (no container
starts), so a simulator listens on each pod's 127.x IP instead."""

from __future__ import annotations

import ipaddress
import time
from typing import Any

from toposerve.localcluster.nodes import KWOK_TOLERATION
from toposerve.topology.labels import PROFILE_LABEL
from toposerve.topology.workloads import LLMD_ROLE

ROLE_LABEL = LLMD_ROLE


def model_pod(name: str, app: str, role: str, node: str | None = None,
              profile: str = "hgx-h100", ports: dict[str, int] | None = None) -> dict[str, Any]:
    """A vLLM pod of ``role``, on ``node`` or, without one, wherever
    kube-scheduler puts it among the nodes of ``profile``; ``ports``: its
    named container ports."""
    placement = {"nodeName": node} if node else {"nodeSelector": {PROFILE_LABEL: profile}}
    container: dict[str, Any] = {"name": "vllm", "image": "vllm/vllm-openai"}
    if ports:
        container["ports"] = [{"name": n, "containerPort": p} for n, p in ports.items()]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": app, ROLE_LABEL: role}},
            "spec": {"containers": [container], "tolerations": [KWOK_TOLERATION], **placement}}


def wait_running(core: Any, names: list[str], namespace: str = "default",
                 timeout_s: float = 60) -> dict[str, tuple[str, str]]:
    """name -> (pod IP, node) once every pod of ``names`` runs. The IPs are
    loopback (the cluster's pod CIDRs), so traffic to them stays local."""
    out: dict[str, tuple[str, str]] = {}
    deadline = time.monotonic() + timeout_s
    while len(out) < len(names):
        if time.monotonic() > deadline:
            raise TimeoutError(f"pods never ran: {sorted(set(names) - set(out))}")
        for name in names:
            pod = core.read_namespaced_pod(name, namespace)
            ip = pod.status.pod_ip
            if pod.status.phase == "Running" and ip:
                if not ipaddress.ip_address(ip).is_loopback:
                    raise RuntimeError(f"pod {name} got {ip}, not a loopback address")
                out[name] = (str(ip), pod.spec.node_name)
        time.sleep(0.2)
    return out
