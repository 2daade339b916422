"""Kubernetes objects as the real controllers write them, as plain JSON:
kwok nodes, GPU ResourceSlices from the topology model, claim templates,
and pods shaped like LeaderWorkerSet, DisaggregatedSet, in-tree PodGroup
and toposerve-labelled output."""

from __future__ import annotations

from typing import Any

from dra_driver.gpu.devices import DRIVER, gpu_pool
from localcluster.nodes import KWOK_TOLERATION, node_manifest
from topology.labels import PRESETS, PROFILE_LABEL, DialectName
from topology.layout import PlannedNode, plan_nodes
from topology.model import NodeTopology
from topology.profiles import load_profile

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


def template(name: str, gpus: int, namespace: str = "default") -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": GPU_CLASS, "count": gpus}}]}}}}


def pod(name: str, *, labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None, claim_template: str | None = None,
        profile: str | None = "gb200-nvl72", uid: str | None = None,
        owner: dict[str, Any] | None = None, spec: dict[str, Any] | None = None,
        scheduler: str | None = None, namespace: str = "default") -> dict[str, Any]:
    body: dict[str, Any] = {
        "containers": [{"name": "main", "image": "vllm/vllm-openai"}],
        "tolerations": [KWOK_TOLERATION],
        **({"nodeSelector": {PROFILE_LABEL: profile}} if profile else {}),
        **({"schedulerName": scheduler} if scheduler else {}),
        **(spec or {}),
    }
    if claim_template:
        body["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": claim_template}]
    md: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels or {},
                          "annotations": annotations or {}}
    if uid:
        md["uid"] = uid
    if owner:
        md["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": body}


def lws_pods(name: str, group: int, size: int, *, claim_template: str,
             exclusive: str | None = "topology.toposerve.io/rack", revision: str = "5d8f9c7b6",
             uid_prefix: str | None = None, owners: bool = True) -> list[dict[str, Any]]:
    """A LeaderWorkerSet group as LWS writes it: the leader (a StatefulSet
    pod of the LWS) and its workers (pods of the per-group worker StatefulSet).
    ``owners=False`` leaves the owner references out: on a real cluster the
    garbage collector deletes pods whose StatefulSets do not exist."""
    key = f"{name}-{group}-groupkey"
    base = {"leaderworkerset.sigs.k8s.io/name": name,
            "leaderworkerset.sigs.k8s.io/group-index": str(group),
            "leaderworkerset.sigs.k8s.io/group-key": key,
            "leaderworkerset.sigs.k8s.io/template-revision-hash": revision}
    notes = {"leaderworkerset.sigs.k8s.io/size": str(size)}
    if exclusive:
        notes["leaderworkerset.sigs.k8s.io/exclusive-topology"] = exclusive
    leader = f"{name}-{group}"
    out = []
    for w in range(size):
        pod_name = leader if w == 0 else f"{leader}-{w}"
        owner = {"apiVersion": "apps/v1", "kind": "StatefulSet",
                 "name": name if w == 0 else leader, "uid": f"sts-{name}-{group if w else 'l'}",
                 "controller": True, "blockOwnerDeletion": True}
        labels = {**base, "leaderworkerset.sigs.k8s.io/worker-index": str(w),
                  "statefulset.kubernetes.io/pod-name": pod_name,
                  "apps.kubernetes.io/pod-index": str(group if w == 0 else w)}
        extra = {} if w == 0 else {"leaderworkerset.sigs.k8s.io/leader-name": leader}
        out.append(pod(pod_name, labels=labels, annotations={**notes, **extra},
                       claim_template=claim_template, owner=owner if owners else None,
                       uid=f"{uid_prefix}-{w}" if uid_prefix else None))
    return out


def disaggregated_pods(name: str, slice_: int, roles: dict[str, tuple[int, int]], *,
                       claim_template: str, revision: str = "7f9b8c1d",
                       uid_prefix: str | None = None, owners: bool = True) -> list[dict[str, Any]]:
    """A DisaggregatedSet slice: one child LWS per role (``replicas`` groups
    of ``size`` pods), every pod labelled with the set's name, role, slice
    and revision as its controller does."""
    out = []
    for role, (replicas, size) in roles.items():
        lws = f"{name}-{slice_}-{revision}-{role}"
        for g in range(replicas):
            for p in lws_pods(lws, g, size, claim_template=claim_template, exclusive=None,
                              uid_prefix=f"{uid_prefix}-{role}-{g}" if uid_prefix else None,
                              owners=owners):
                p["metadata"]["labels"].update({
                    "app": f"{name}-{slice_}-{role}",
                    "disaggregatedset.x-k8s.io/name": name,
                    "disaggregatedset.x-k8s.io/role": role,
                    "disaggregatedset.x-k8s.io/slice": str(slice_),
                    "disaggregatedset.x-k8s.io/revision": revision,
                    "llm-d.ai/role": role})
                p["metadata"]["annotations"]["leaderworkerset.sigs.k8s.io/replicas"] = \
                    str(replicas)
                out.append(p)
    return out


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
