"""Fake node objects for kwok: labelled with their place in the domain
tree and their profile, with allocatable resources, and with addresses
on loopback only (pods get 127.x IPs from the node's podCIDR)."""

from __future__ import annotations

import ipaddress
from typing import Any

from toposerve.topology.labels import HOSTNAME_LABEL, PROFILE_LABEL, Dialect, to_labels
from toposerve.topology.layout import PlannedNode
from toposerve.topology.profiles import HardwareProfile

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
KWOK_TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}

# Node addresses from 127.8.0.1 up, pod ranges 127.16.0.0/24, 127.16.1.0/24, ...
# The whole of 127/8 routes to loopback on Linux, so a simulated model server
# can bind exactly its pod's IP, and nothing ever leaves the machine.
NODE_IP_BASE = ipaddress.IPv4Address("127.8.0.1")
POD_NET_FIRST_OCTET = 16
MAX_NODES = (255 - POD_NET_FIRST_OCTET) * 256


def node_ip(index: int) -> str:
    return str(NODE_IP_BASE + index)


def pod_cidr(index: int) -> str:
    if index >= MAX_NODES:
        raise ValueError(f"at most {MAX_NODES} nodes fit the loopback pod ranges")
    return f"127.{POD_NET_FIRST_OCTET + index // 256}.{index % 256}.0/24"


def node_manifest(node: PlannedNode, profile: HardwareProfile, dialect: Dialect) -> dict[str, Any]:
    labels = {
        **to_labels(node.path, dialect),
        HOSTNAME_LABEL: node.name,
        PROFILE_LABEL: profile.name,
        "node.kubernetes.io/instance-type": profile.name,
        "type": "kwok",
    }
    resources = dict(profile.spec.allocatable)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": labels,
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"taints": [KWOK_TAINT], "podCIDR": pod_cidr(node.index),
                 "podCIDRs": [pod_cidr(node.index)]},
        "status": {
            "allocatable": resources,
            "capacity": resources,
            "addresses": [{"type": "InternalIP", "address": node_ip(node.index)},
                          {"type": "Hostname", "address": node.name}],
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux",
                         "kubeletVersion": "fake", "kubeProxyVersion": "fake",
                         "containerRuntimeVersion": "kwok", "kernelVersion": "",
                         "osImage": "", "machineID": "", "systemUUID": "", "bootID": ""},
        },
    }


def node_labels(core: Any, label_selector: str | None = None) -> dict[str, dict[str, str]]:
    """Each node's labels by node name, as the API server has them."""
    out: dict[str, dict[str, str]] = {}
    for n in core.list_node(label_selector=label_selector).items:
        assert n.metadata is not None and n.metadata.name is not None
        out[n.metadata.name] = n.metadata.labels or {}
    return out
