"""Owner objects and pods as LeaderWorkerSet, DisaggregatedSet and the
StatefulSet controller write them, as plain JSON, for clusters where those
controllers do not run (scale runs, tests): minimal CRDs for the two APIs;
DisaggregatedSet -> a LeaderWorkerSet per role -> leader StatefulSet ->
leader pods -> worker StatefulSet -> workers, each owned by the one before.
Owner references carry the owner's uid when it has one (from the API).
Labels and annotations are those of kubernetes-sigs/lws at 060ab4d: the LWS
controller's StatefulSet templates, its pod webhook's group and subgroup
labels, the DisaggregatedSet controller's system labels
(pkg/controllers/leaderworkerset_controller.go, pod_controller.go,
pkg/webhooks/pod_webhook.go, pkg/controllers/disaggregatedset/lws_manager.go).
The CRDs are upstream's schemas (crds/lws.yaml)."""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path
from typing import Any

import yaml

from toposerve.localcluster.nodes import KWOK_TOLERATION
from toposerve.topology.labels import PROFILE_LABEL
from toposerve.topology.workloads import (
    DS,
    DS_NAME,
    DS_REVISION,
    DS_ROLE,
    DS_SLICE,
    LLMD_ROLE,
    LWS_EXCLUSIVE,
    LWS_GROUP_INDEX,
    LWS_GROUP_KEY,
    LWS_LEADER_NAME,
    LWS_NAME,
    LWS_REPLICAS,
    LWS_REVISION,
    LWS_SIZE,
    LWS_SUBDOMAIN_POLICY,
    LWS_SUBGROUP_EXCLUSIVE,
    LWS_SUBGROUP_INDEX,
    LWS_SUBGROUP_KEY,
    LWS_SUBGROUP_POLICY,
    LWS_SUBGROUP_SIZE,
    LWS_WORKER_INDEX,
)


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


LWS_API = "leaderworkerset.x-k8s.io/v1"
DS_API = f"{DS}/v1"


def owner_ref(obj: dict[str, Any], *, block: bool = True) -> dict[str, Any]:
    """A controller reference to ``obj`` as controller-runtime and the
    StatefulSet controller write them: its uid, or "" until it has one
    (``with_owner_uids`` fills it in once the owner is created)."""
    md = obj["metadata"]
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": md["name"],
            "uid": md.get("uid", ""), "controller": True,
            **({"blockOwnerDeletion": True} if block else {})}


Uids = dict[tuple[str, str], str]  # (kind, name) -> uid of an object created in the namespace


def with_owner_uids(obj: dict[str, Any], uids: Uids) -> dict[str, Any]:
    """``obj`` with each owner reference that lacks a uid given its owner's
    from ``uids`` (the garbage collector deletes a dependent whose owner uid
    does not exist)."""
    refs = obj["metadata"].get("ownerReferences")
    if not refs or all(r.get("uid") for r in refs):
        return obj
    filled = [r if r.get("uid") else {**r, "uid": uids[(r["kind"], r["name"])]} for r in refs]
    return {**obj, "metadata": {**obj["metadata"], "ownerReferences": filled}}


def _lws_spec(replicas: int, size: int, template_labels: dict[str, str] | None,
              subgroup: tuple[int, str] | None) -> dict[str, Any]:
    template = {"metadata": {"labels": dict(template_labels or {})},
                "spec": {"containers": [{"name": "main", "image": "vllm/vllm-openai"}]}}
    lwt: dict[str, Any] = {"size": size, "workerTemplate": template}
    if subgroup:
        lwt["subGroupPolicy"] = {"subGroupSize": subgroup[0], "subGroupPolicyType": subgroup[1]}
    return {"replicas": replicas, "startupPolicy": "LeaderCreated", "leaderWorkerTemplate": lwt}


def leader_worker_set(name: str, replicas: int, size: int, *, exclusive: str | None = None,
                      template_labels: dict[str, str] | None = None,
                      subgroup: tuple[int, str] | None = None,
                      subgroup_exclusive: str | None = None,
                      labels: dict[str, str] | None = None, owner: dict[str, Any] | None = None,
                      uid: str | None = None, namespace: str = "default") -> dict[str, Any]:
    """A ``leaderworkerset.x-k8s.io/v1`` LeaderWorkerSet; exclusive placement
    (of each group, of each subgroup) is an annotation on it, copied onto its
    StatefulSets and pods; ``subgroup``: its subGroupPolicy (subGroupSize,
    LeaderWorker or LeaderExcluded)."""
    notes = {**({LWS_EXCLUSIVE: exclusive} if exclusive else {}),
             **({LWS_SUBGROUP_EXCLUSIVE: subgroup_exclusive} if subgroup_exclusive else {})}
    return {"apiVersion": LWS_API, "kind": "LeaderWorkerSet",
            "metadata": _meta(name, namespace, uid, owner, labels, notes),
            "spec": _lws_spec(replicas, size, template_labels, subgroup)}


def disaggregated_set(name: str, roles: dict[str, tuple[int, int]], *, uid: str | None = None,
                      namespace: str = "default") -> dict[str, Any]:
    """A ``disaggregatedset.x-k8s.io/v1`` DisaggregatedSet as a user writes
    it: per role, a LeaderWorkerSet spec of ``replicas`` groups of ``size``
    pods whose template carries the role's llm-d label."""
    return {"apiVersion": DS_API, "kind": "DisaggregatedSet",
            "metadata": _meta(name, namespace, uid, None),
            "spec": {"roles": [{"name": role,
                                "spec": _lws_spec(replicas, size, {LLMD_ROLE: role}, None)}
                               for role, (replicas, size) in roles.items()]}}


def disaggregated_lws(ds: dict[str, Any], slice_: int, revision: str) -> list[dict[str, Any]]:
    """The LeaderWorkerSets a DisaggregatedSet's controller makes for one
    slice at one revision: one per role, named ``<set>-<slice>-<revision>-<role>``,
    the role's spec with the system labels merged over the role's own
    labels and over its pod templates' labels, owned by the set."""
    name, ns = ds["metadata"]["name"], ds["metadata"]["namespace"]
    out = []
    for role in ds["spec"]["roles"]:
        system = {"app": f"{name}-{slice_}-{role['name']}", DS_ROLE: role["name"],
                  DS_SLICE: str(slice_), DS_NAME: name, DS_REVISION: revision}
        spec = copy.deepcopy(role["spec"])
        lwt = spec["leaderWorkerTemplate"]
        for t in (lwt.get("leaderTemplate"), lwt["workerTemplate"]):
            if t is not None:
                t.setdefault("metadata", {})["labels"] = {
                    **(t["metadata"].get("labels") or {}), **system}
        md = role.get("metadata") or {}
        out.append({"apiVersion": LWS_API, "kind": "LeaderWorkerSet",
                    "metadata": _meta(f"{name}-{slice_}-{revision}-{role['name']}", ns, None,
                                      owner_ref(ds, block=False),
                                      {**(md.get("labels") or {}), **system},
                                      dict(md.get("annotations") or {})),
                    "spec": spec})
    return out


def _template_labels(lws: dict[str, Any], *, leader: bool = False) -> dict[str, str]:
    """The labels of the leader's pod template (the worker template's
    without a leader template) or the workers'."""
    lwt = lws["spec"]["leaderWorkerTemplate"]
    template = (lwt.get("leaderTemplate") if leader else None) or lwt["workerTemplate"]
    return dict((template.get("metadata") or {}).get("labels") or {})


def _exclusive(lws: dict[str, Any]) -> dict[str, str]:
    notes = lws["metadata"].get("annotations") or {}
    return {LWS_EXCLUSIVE: notes[LWS_EXCLUSIVE]} if notes.get(LWS_EXCLUSIVE) else {}


def _pod_notes(lws: dict[str, Any]) -> dict[str, str]:
    """The annotations both StatefulSet templates give every pod: the group
    size, exclusive placement and the subgroup policy."""
    lwt, notes = lws["spec"]["leaderWorkerTemplate"], lws["metadata"].get("annotations") or {}
    out = {LWS_SIZE: str(lwt.get("size", 1)), **_exclusive(lws)}
    if (sub := lwt.get("subGroupPolicy")) is not None:
        out[LWS_SUBGROUP_POLICY] = sub.get("subGroupPolicyType", "LeaderWorker")
        out[LWS_SUBGROUP_SIZE] = str(sub["subGroupSize"])
        if notes.get(LWS_SUBGROUP_EXCLUSIVE):
            out[LWS_SUBGROUP_EXCLUSIVE] = notes[LWS_SUBGROUP_EXCLUSIVE]
    return out


def subgroup_index(size: int, subgroup_size: int, worker: int) -> int:
    """A worker's subgroup, as LWS's pod webhook numbers them: when only
    ``size - 1`` divides into subgroups the leader is the extra pod of the
    first (or, LeaderExcluded, in none)."""
    if (size - 1) % subgroup_size == 0 and size % subgroup_size != 0:
        return (worker - 1) // subgroup_size
    return worker // subgroup_size


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
    own = {LWS_NAME: name, LWS_REVISION: revision}
    labels = {**_template_labels(lws, leader=True), LWS_WORKER_INDEX: "0", **own}
    return _statefulset(name, lws, owner_ref(lws), lws["spec"]["replicas"],
                        {LWS_NAME: name, LWS_WORKER_INDEX: "0"}, own, labels,
                        {LWS_REPLICAS: str(lws["spec"]["replicas"])}, uid)


def worker_statefulset(lws: dict[str, Any], leader: dict[str, Any], *,
                       topology: str | None = None, uid: str | None = None) -> dict[str, Any]:
    """A group's worker StatefulSet, named as its leader pod and owned by it,
    ordinals from 1; with exclusive placement created once the leader is
    bound, pinned by node selector to the leader's ``topology`` value."""
    ll = leader["metadata"]["labels"]
    selector = {k: ll[k] for k in (LWS_GROUP_INDEX, LWS_NAME, LWS_GROUP_KEY)}
    own = {**selector, LWS_REVISION: ll[LWS_REVISION]}
    labels = {**_template_labels(lws), **own}
    exclusive = _exclusive(lws)
    pin = {**leader["spec"].get("nodeSelector", {}),
           **({next(iter(exclusive.values())): topology} if exclusive and topology else {})}
    return _statefulset(leader["metadata"]["name"], lws, owner_ref(leader),
                        lws["spec"]["leaderWorkerTemplate"]["size"] - 1, selector, own, labels,
                        {}, uid, start=1, node_selector=pin)


def _group_key(first: str, second: str) -> str:
    """LWS's genGroupUniqueKey: the sha1 of "<first>/<second>"."""
    return hashlib.sha1(f"{first}/{second}".encode()).hexdigest()


def _exclusive_affinity(p: dict[str, Any], key: str, topology: str, label: str) -> None:
    """LWS's SetExclusiveAffinities: the pods whose ``label`` is ``key`` share
    a ``topology`` domain, and no other pod with that label enters it."""
    aff = p["spec"].setdefault("affinity", {})
    aff.setdefault("podAffinity", {}).setdefault(
        "requiredDuringSchedulingIgnoredDuringExecution", []).append(
        {"labelSelector": {"matchExpressions": [
            {"key": label, "operator": "In", "values": [key]}]}, "topologyKey": topology})
    aff.setdefault("podAntiAffinity", {}).setdefault(
        "requiredDuringSchedulingIgnoredDuringExecution", []).append(
        {"labelSelector": {"matchExpressions": [
            {"key": label, "operator": "Exists"},
            {"key": label, "operator": "NotIn", "values": [key]}]}, "topologyKey": topology})


def _subgroup(p: dict[str, Any], notes: dict[str, str], leader: str, index: int) -> None:
    """The subgroup labels (and exclusive affinity) LWS's pod webhook adds."""
    key = _group_key(leader, str(index))
    p["metadata"]["labels"].update({LWS_SUBGROUP_INDEX: str(index), LWS_SUBGROUP_KEY: key})
    if topology := notes.get(LWS_SUBGROUP_EXCLUSIVE):
        _exclusive_affinity(p, key, topology, LWS_SUBGROUP_KEY)


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
    placement the affinity that keeps other groups out of its domain; the
    first subgroup's labels unless the leader is excluded from subgroups)."""
    md = lws["metadata"]
    name = f"{md['name']}-{group}"
    key = _group_key(md["namespace"], name)
    notes = _pod_notes(lws)
    network = lws["spec"].get("networkConfig") or {}
    if network.get("subdomainPolicy") == "UniquePerReplica":
        notes[LWS_SUBDOMAIN_POLICY] = "UniquePerReplica"
    p = _sts_pod(sts, group, {LWS_GROUP_INDEX: str(group), LWS_GROUP_KEY: key},
                 notes, claim_template, profile, uid)
    if exclusive := notes.get(LWS_EXCLUSIVE):
        _exclusive_affinity(p, key, exclusive, LWS_GROUP_KEY)
    if LWS_SUBGROUP_SIZE in notes and notes[LWS_SUBGROUP_POLICY] != "LeaderExcluded":
        _subgroup(p, notes, name, 0)
    return p


def lws_worker(lws: dict[str, Any], leader: dict[str, Any], sts: dict[str, Any], worker: int,
               *, claim_template: str, profile: str | None = "gb200-nvl72",
               uid: str | None = None) -> dict[str, Any]:
    """Worker ``worker`` (1..size-1) of a leader's group: the worker
    StatefulSet's pod, with the worker index (and subgroup) LWS's pod
    webhook adds."""
    leader_name = leader["metadata"]["name"]
    notes = {**_pod_notes(lws), LWS_LEADER_NAME: leader_name}
    p = _sts_pod(sts, worker, {LWS_WORKER_INDEX: str(worker)}, notes, claim_template,
                 profile, uid)
    if LWS_SUBGROUP_SIZE in notes:
        _subgroup(p, notes, leader_name, subgroup_index(
            int(notes[LWS_SIZE]), int(notes[LWS_SUBGROUP_SIZE]), worker))
    return p


# LeaderWorkerSet, DisaggregatedSet and DisaggregatedSetRoleScaler with upstream's schemas
CRDS: list[dict[str, Any]] = yaml.safe_load(
    (Path(__file__).parent / "crds" / "lws.yaml").read_text())["items"]


def collection(kind: str, namespace: str = "default") -> str:
    """The API path that objects of ``kind`` (those built here) are created in."""
    return {"Pod": f"/api/v1/namespaces/{namespace}/pods",
            "StatefulSet": f"/apis/apps/v1/namespaces/{namespace}/statefulsets",
            "LeaderWorkerSet": f"/apis/{LWS_API}/namespaces/{namespace}/leaderworkersets",
            "DisaggregatedSet": f"/apis/{DS_API}/namespaces/{namespace}/disaggregatedsets",
            "CustomResourceDefinition": "/apis/apiextensions.k8s.io/v1/"
                                        "customresourcedefinitions"}[kind]
