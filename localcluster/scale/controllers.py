"""Owner objects and pods as LeaderWorkerSet, DisaggregatedSet and the
StatefulSet controller write them, as plain JSON, for clusters where those
controllers do not run (scale runs, tests): minimal CRDs for the two APIs;
DisaggregatedSet -> a LeaderWorkerSet per role -> leader StatefulSet ->
leader pods -> worker StatefulSet -> workers, each owned by the one before.
Owner references carry the owner's uid when it has one (from the API)."""

from __future__ import annotations

import hashlib
from typing import Any

from localcluster.nodes import KWOK_TOLERATION
from topology.labels import PROFILE_LABEL
from topology.workloads import DS, LLMD_ROLE, LWS


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
            template_labels={LLMD_ROLE: role["name"], **system},
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


def crd(group: str, kind: str, plural: str) -> dict[str, Any]:
    """A minimal namespaced CRD (v1, any spec and status): enough for owner
    objects that no controller reconciles here."""
    free = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {"group": group, "scope": "Namespaced",
                     "names": {"kind": kind, "plural": plural, "singular": kind.lower(),
                               "listKind": f"{kind}List"},
                     "versions": [{"name": "v1", "served": True, "storage": True,
                                   "schema": {"openAPIV3Schema": {
                                       "type": "object",
                                       "properties": {"spec": free, "status": free}}}}]}}


CRDS = [crd("leaderworkerset.x-k8s.io", "LeaderWorkerSet", "leaderworkersets"),
        crd(DS, "DisaggregatedSet", "disaggregatedsets")]


def collection(kind: str, namespace: str = "default") -> str:
    """The API path that objects of ``kind`` (those built here) are created in."""
    return {"Pod": f"/api/v1/namespaces/{namespace}/pods",
            "StatefulSet": f"/apis/apps/v1/namespaces/{namespace}/statefulsets",
            "LeaderWorkerSet": f"/apis/{LWS_API}/namespaces/{namespace}/leaderworkersets",
            "DisaggregatedSet": f"/apis/{DS_API}/namespaces/{namespace}/disaggregatedsets",
            "CustomResourceDefinition": "/apis/apiextensions.k8s.io/v1/"
                                        "customresourcedefinitions"}[kind]


def established(crd_obj: dict[str, Any]) -> bool:
    """Whether a CustomResourceDefinition as read back is served yet."""
    return any(c.get("type") == "Established" and c.get("status") == "True"
               for c in (crd_obj.get("status") or {}).get("conditions") or [])
