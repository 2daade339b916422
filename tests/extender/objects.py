"""Kubernetes objects as the real controllers write them, as plain JSON:
kwok nodes, GPU ResourceSlices from the topology model, claim templates,
and pods shaped like LeaderWorkerSet, DisaggregatedSet, in-tree PodGroup
and toposerve-labelled output."""

from __future__ import annotations

import hashlib
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


def _meta(name: str, namespace: str, uid: str | None, owner: dict[str, Any] | None,
          labels: dict[str, str] | None = None,
          annotations: dict[str, str] | None = None) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels or {},
                          "annotations": annotations or {}}
    if uid:
        md["uid"] = uid
    if owner:
        md["ownerReferences"] = [owner]
    return md


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
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": _meta(name, namespace, uid, owner, labels, annotations), "spec": body}


LWS = "leaderworkerset.sigs.k8s.io"  # LeaderWorkerSet's label and annotation prefix
LWS_API = "leaderworkerset.x-k8s.io/v1"
DS = "disaggregatedset.x-k8s.io"  # DisaggregatedSet's API group and label prefix
DS_API = f"{DS}/v1"


def owner_ref(obj: dict[str, Any], *, block: bool = True) -> dict[str, Any]:
    """A controller reference to ``obj`` (its uid included), as controller-runtime
    and the StatefulSet controller write them."""
    md = obj["metadata"]
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": md["name"],
            "uid": md["uid"], "controller": True, **({"blockOwnerDeletion": True} if block else {})}


def leader_worker_set(name: str, replicas: int, size: int, *, exclusive: str | None = None,
                      template_labels: dict[str, str] | None = None,
                      labels: dict[str, str] | None = None, owner: dict[str, Any] | None = None,
                      uid: str | None = None, namespace: str = "default") -> dict[str, Any]:
    """A ``leaderworkerset.x-k8s.io/v1`` LeaderWorkerSet; exclusive placement
    is an annotation on it, copied onto its StatefulSets and pods."""
    notes = {f"{LWS}/exclusive-topology": exclusive} if exclusive else {}
    template = {"metadata": {"labels": dict(template_labels or {})},
                "spec": {"containers": [{"name": "main", "image": "vllm/vllm-openai"}]}}
    return {"apiVersion": LWS_API, "kind": "LeaderWorkerSet",
            "metadata": _meta(name, namespace, uid, owner, labels, notes),
            "spec": {"replicas": replicas, "startupPolicy": "LeaderCreated",
                     "leaderWorkerTemplate": {"size": size, "workerTemplate": template}}}


def disaggregated_set(name: str, roles: dict[str, tuple[int, int]], *, uid: str | None = None,
                      namespace: str = "default") -> dict[str, Any]:
    """A ``disaggregatedset.x-k8s.io/v1`` DisaggregatedSet: per role,
    ``replicas`` leader-worker groups of ``size`` pods."""
    return {"apiVersion": DS_API, "kind": "DisaggregatedSet",
            "metadata": _meta(name, namespace, uid, None),
            "spec": {"roles": [{"name": role, "replicas": replicas,
                                "leaderWorkerTemplate": {"size": size}}
                               for role, (replicas, size) in roles.items()]}}


def disaggregated_lws(ds: dict[str, Any], slice_: int, revision: str) -> list[dict[str, Any]]:
    """The LeaderWorkerSets a DisaggregatedSet's controller makes for one
    slice at one revision: one per role, named ``<set>-<slice>-<revision>-<role>``,
    its system labels on the LWS and its pod template, owned by the set
    (the llm-d role label comes from the user's template)."""
    name = ds["metadata"]["name"]
    out = []
    for role in ds["spec"]["roles"]:
        system = {"app": f"{name}-{slice_}-{role['name']}", f"{DS}/role": role["name"],
                  f"{DS}/slice": str(slice_), f"{DS}/name": name, f"{DS}/revision": revision}
        out.append(leader_worker_set(
            f"{name}-{slice_}-{revision}-{role['name']}", role["replicas"],
            role["leaderWorkerTemplate"]["size"], labels=system,
            template_labels={"llm-d.ai/role": role["name"], **system},
            owner=owner_ref(ds, block=False), namespace=ds["metadata"]["namespace"]))
    return out


def _template_labels(lws: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"][
        "metadata"]["labels"]
    return dict(labels)


def _exclusive(lws: dict[str, Any]) -> dict[str, str]:
    key = f"{LWS}/exclusive-topology"
    notes = lws["metadata"].get("annotations") or {}
    return {key: notes[key]} if key in notes else {}


def _statefulset(name: str, lws: dict[str, Any], owner: dict[str, Any], replicas: int,
                 selector: dict[str, str], own: dict[str, str], labels: dict[str, str],
                 notes: dict[str, str], uid: str | None, *, start: int = 0,
                 node_selector: dict[str, str] | None = None) -> dict[str, Any]:
    """``own``: the StatefulSet's labels besides the LWS's; ``labels``: its pods'."""
    md = lws["metadata"]
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "vllm/vllm-openai"}]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": _meta(name, md["namespace"], uid, owner,
                              {**(md.get("labels") or {}), **own},
                              {**(md.get("annotations") or {}), **notes}),
            "spec": {"replicas": replicas, "serviceName": md["name"],
                     "podManagementPolicy": "Parallel", "ordinals": {"start": start},
                     "selector": {"matchLabels": selector},
                     "template": {"metadata": {"labels": labels}, "spec": spec}}}


def leader_statefulset(lws: dict[str, Any], revision: str,
                       uid: str | None = None) -> dict[str, Any]:
    """The LWS's leader StatefulSet (named as the LWS, owned by it): one
    leader pod per replica."""
    name = lws["metadata"]["name"]
    own = {f"{LWS}/name": name, f"{LWS}/template-revision-hash": revision}
    labels = {**_template_labels(lws), f"{LWS}/worker-index": "0", **own}
    return _statefulset(name, lws, owner_ref(lws), lws["spec"]["replicas"],
                        {f"{LWS}/name": name, f"{LWS}/worker-index": "0"}, own, labels,
                        {f"{LWS}/replicas": str(lws["spec"]["replicas"])}, uid)


def worker_statefulset(lws: dict[str, Any], leader: dict[str, Any], *,
                       topology: str | None = None, uid: str | None = None) -> dict[str, Any]:
    """A group's worker StatefulSet, named as its leader pod and owned by it,
    ordinals from 1; with exclusive placement created once the leader is
    bound, pinned by node selector to the leader's ``topology`` value."""
    ll = leader["metadata"]["labels"]
    keys = (f"{LWS}/group-index", f"{LWS}/name", f"{LWS}/group-key")
    selector = {k: ll[k] for k in keys}
    own = {**selector,
           f"{LWS}/template-revision-hash": ll[f"{LWS}/template-revision-hash"]}
    labels = {**_template_labels(lws), **own}
    exclusive = _exclusive(lws)
    pin = {**leader["spec"].get("nodeSelector", {}),
           **({next(iter(exclusive.values())): topology} if exclusive and topology else {})}
    return _statefulset(leader["metadata"]["name"], lws, owner_ref(leader),
                        lws["spec"]["leaderWorkerTemplate"]["size"] - 1, selector, own, labels,
                        {}, uid, start=1, node_selector=pin)


def _group_key(namespace: str, leader: str) -> str:
    return hashlib.sha1(f"{namespace}/{leader}".encode()).hexdigest()


def _sts_pod(sts: dict[str, Any], ordinal: int, labels: dict[str, str],
             notes: dict[str, str], claim_template: str, profile: str | None,
             uid: str | None) -> dict[str, Any]:
    """A pod as the StatefulSet controller makes it from ``sts`` (its
    identity labels and controller reference added)."""
    name = f"{sts['metadata']['name']}-{ordinal}"
    ident = {"statefulset.kubernetes.io/pod-name": name, "apps.kubernetes.io/pod-index":
             str(ordinal), "controller-revision-hash": f"{sts['metadata']['name']}-rev1"}
    p = pod(name, labels={**sts["spec"]["template"]["metadata"]["labels"], **labels, **ident},
            annotations=notes, claim_template=claim_template, profile=profile, uid=uid,
            owner=owner_ref(sts), namespace=sts["metadata"]["namespace"])
    p["spec"]["nodeSelector"] = {**p["spec"].get("nodeSelector", {}),
                                 **sts["spec"]["template"]["spec"].get("nodeSelector", {})}
    return p


def lws_leader(lws: dict[str, Any], sts: dict[str, Any], group: int, *, claim_template: str,
               profile: str | None = "gb200-nvl72", uid: str | None = None) -> dict[str, Any]:
    """Leader ``group`` of an LWS: the leader StatefulSet's pod, with what
    LWS's pod webhook adds (group index, group key, and for exclusive
    placement the affinity that keeps other groups out of its domain)."""
    md = lws["metadata"]
    name = f"{md['name']}-{group}"
    key = _group_key(md["namespace"], name)
    notes = {f"{LWS}/size": str(lws["spec"]["leaderWorkerTemplate"]["size"]), **_exclusive(lws)}
    p = _sts_pod(sts, group, {f"{LWS}/group-index": str(group), f"{LWS}/group-key": key},
                 notes, claim_template, profile, uid)
    if exclusive := _exclusive(lws):
        topo, label = next(iter(exclusive.values())), f"{LWS}/group-key"
        p["spec"]["affinity"] = {
            "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchExpressions": [
                    {"key": label, "operator": "In", "values": [key]}]}, "topologyKey": topo}]},
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchExpressions": [
                    {"key": label, "operator": "Exists"},
                    {"key": label, "operator": "NotIn", "values": [key]}]},
                 "topologyKey": topo}]}}
    return p


def lws_worker(lws: dict[str, Any], leader: dict[str, Any], sts: dict[str, Any], worker: int,
               *, claim_template: str, profile: str | None = "gb200-nvl72",
               uid: str | None = None) -> dict[str, Any]:
    """Worker ``worker`` (1..size-1) of a leader's group: the worker
    StatefulSet's pod, with the worker index LWS's pod webhook adds."""
    notes = {f"{LWS}/size": str(lws["spec"]["leaderWorkerTemplate"]["size"]),
             f"{LWS}/leader-name": leader["metadata"]["name"], **_exclusive(lws)}
    return _sts_pod(sts, worker, {f"{LWS}/worker-index": str(worker)}, notes, claim_template,
                    profile, uid)


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
