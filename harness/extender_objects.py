"""Kubernetes objects as the real controllers write them, as plain JSON:
kwok nodes, GPU ResourceSlices from the topology model, claim templates,
and pods shaped like LeaderWorkerSet, DisaggregatedSet, in-tree PodGroup
and toposerve-labelled output."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from toposerve.dra_driver.gpu.devices import DRIVER, gpu_pool
from toposerve.localcluster.nodes import node_manifest
from toposerve.localcluster.scale.controllers import (  # shared with the scale runs
    disaggregated_lws,
    disaggregated_set,
    leader_statefulset,
    leader_worker_set,
    lws_leader,
    lws_worker,
    worker_statefulset,
)
from toposerve.localcluster.scale.controllers import (
    pod as pod,  # bench/extender_bench.py builds its pods with k.pod
)
from toposerve.scheduler_ext.config import ExtenderConfig
from toposerve.scheduler_ext.state.cache import ClusterState
from toposerve.topology.labels import PRESETS, DialectName
from toposerve.topology.layout import PlannedNode, plan_nodes
from toposerve.topology.model import NodeTopology
from toposerve.topology.profiles import load_profile

GPU_CLASS = "gpu.toposerve.io"


def planned(*groups: tuple[str, int]) -> list[PlannedNode]:
    return plan_nodes([(load_profile(p), n) for p, n in groups])


def node(n: PlannedNode) -> dict[str, Any]:
    return node_manifest(n, load_profile(n.profile), PRESETS[DialectName.TOPOSERVE])


def gpu_slice(n: PlannedNode, generation: int = 1) -> dict[str, Any]:
    """The node's GPU pool in one slice (whole GPUs and partitions alike)."""
    topo = NodeTopology(name=n.name, path=n.path, profile=n.profile,
                        hardware=load_profile(n.profile).hardware())
    pool = gpu_pool(topo)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{n.name}-{DRIVER}"},
            "spec": {"driver": DRIVER, "nodeName": n.name,
                     "pool": {"name": pool.name, "generation": generation,
                              "resourceSliceCount": 1},
                     "devices": [dict(d) for d in pool.devices]}}


def counter_slice(n: PlannedNode) -> dict[str, Any] | None:
    topo = NodeTopology(name=n.name, path=n.path, profile=n.profile,
                        hardware=load_profile(n.profile).hardware())
    pool = gpu_pool(topo)
    if not pool.shared_counters:
        return None
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{n.name}-{DRIVER}-counters"},
            "spec": {"driver": DRIVER, "nodeName": n.name,
                     "pool": {"name": pool.name, "generation": 1, "resourceSliceCount": 1},
                     "sharedCounters": [dict(c) for c in pool.shared_counters]}}


def cluster_state(nodes: Sequence[PlannedNode], *, templates: Sequence[dict[str, Any]] = (),
                  classes: Sequence[dict[str, Any]] | None = None,
                  cfg: ExtenderConfig | None = None, **kw: Any) -> ClusterState:
    """The extender's watched state as its watches list it: ``nodes``, their
    GPU slices (and counter slices where GPUs partition), ``templates`` and,
    when given, DeviceClasses; ``kw`` goes to ClusterState (clock, TTL)."""
    st = ClusterState(cfg or ExtenderConfig(), **kw)
    st.relist("nodes", [node(n) for n in nodes])
    st.relist("slices", [gpu_slice(n) for n in nodes]
              + [s for n in nodes if (s := counter_slice(n)) is not None])
    st.relist("templates", list(templates))
    if classes is not None:
        st.relist("classes", list(classes))
    return st


def selectors(*exprs: str) -> list[dict[str, Any]]:
    return [{"cel": {"expression": e}} for e in exprs]


def device_class(name: str, *exprs: str) -> dict[str, Any]:
    """A DeviceClass as a site writes one: its name, its CEL selectors."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": name}, "spec": {"selectors": selectors(*exprs)}}


def template(name: str, gpus: int, namespace: str = "default", *,
             device_class: str = GPU_CLASS, exprs: tuple[str, ...] = ()) -> dict[str, Any]:
    """Claims of ``gpus`` devices of ``device_class``, narrowed by ``exprs``."""
    exactly: dict[str, Any] = {"deviceClassName": device_class, "count": gpus}
    if exprs:
        exactly["selectors"] = selectors(*exprs)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}}


def lws_pods(name: str, group: int, size: int, *, claim_template: str,
             exclusive: str | None = "topology.toposerve.io/rack",
             revision: str = "5d8f9c7b6", uid_prefix: str = "lws",
             lws: dict[str, Any] | None = None,
             profile: str | None = "gb200-nvl72") -> list[dict[str, Any]]:
    """Group ``group`` of a LeaderWorkerSet (``lws``, or a new one of
    ``size``) as LWS and the StatefulSet controller write it, without an API
    server: owners get made-up uids. The leader first, then its workers."""
    lws = lws or leader_worker_set(name, group + 1, size, exclusive=exclusive,
                                   uid=f"{uid_prefix}-lws")
    lws["metadata"].setdefault("uid", f"{uid_prefix}-lws")
    sts = leader_statefulset(lws, revision, uid=f"{uid_prefix}-sts")
    leader = lws_leader(lws, sts, group, claim_template=claim_template, profile=profile,
                        uid=f"{uid_prefix}-0")
    wsts = worker_statefulset(lws, leader, uid=f"{uid_prefix}-wsts")
    size = lws["spec"]["leaderWorkerTemplate"]["size"]
    return [leader, *(lws_worker(lws, leader, wsts, w, claim_template=claim_template,
                                 profile=profile, uid=f"{uid_prefix}-{w}")
                      for w in range(1, size))]


def disaggregated_pods(name: str, slice_: int, roles: dict[str, tuple[int, int]], *,
                       claim_template: str, revision: str = "7f9b8c1d",
                       uid_prefix: str = "ds") -> tuple[list[dict[str, Any]],
                                                        list[dict[str, Any]]]:
    """A DisaggregatedSet slice without an API server: (its LeaderWorkerSets,
    every pod of every group of every role)."""
    ds = disaggregated_set(name, roles, uid=f"{uid_prefix}-set")
    sets = disaggregated_lws(ds, slice_, revision)
    pods = []
    for i, lws in enumerate(sets):
        lws["metadata"]["uid"] = f"{uid_prefix}-{i}"
        for g in range(lws["spec"]["replicas"]):
            pods += lws_pods(lws["metadata"]["name"], g, 0, claim_template=claim_template,
                             revision=revision, uid_prefix=f"{uid_prefix}-{i}-{g}", lws=lws)
    return sets, pods


def pod_group(name: str, min_count: int, key: str | None = "topology.toposerve.io/rack",
              namespace: str = "default") -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": min_count}}}
    if key:
        spec["schedulingConstraints"] = {"topology": [{"key": key}]}
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def pod_group_pods(group: str, count: int, *, claim_template: str,
                   uid_prefix: str | None = None) -> list[dict[str, Any]]:
    return [pod(f"{group}-{i}", claim_template=claim_template,
                spec={"schedulingGroup": {"podGroupName": group}},
                uid=f"{uid_prefix}-{i}" if uid_prefix else None) for i in range(count)]


def toposerve_pods(group: str, count: int, *, claim_template: str, level: str | None = None,
                   preferred: str | None = None, role: str | None = None,
                   uid_prefix: str | None = None, profile: str = "gb200-nvl72",
                   start: int = 0) -> list[dict[str, Any]]:
    labels = {"toposerve.io/group": group, "toposerve.io/group-size": str(count)}
    if level:
        labels["toposerve.io/topology-level"] = level
    if preferred:
        labels["toposerve.io/preferred-topology-level"] = preferred
    if role:
        labels["toposerve.io/role"] = role
    return [pod(f"{group}-{i}", labels=dict(labels), claim_template=claim_template,
                profile=profile, uid=f"{uid_prefix}-{i}" if uid_prefix else None)
            for i in range(start, count)]
