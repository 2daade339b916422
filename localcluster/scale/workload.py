"""The objects a scenario submits, per setup: DeviceClasses and claim
templates of the cookbook's shapes, pods (plain, with claims, wide-EP groups
as LeaderWorkerSet makes them, P/D slices as DisaggregatedSet makes them,
gangs), and in-tree PodGroups where the setup has the workload gates. The
owners of P/D slices and wide-EP groups (DisaggregatedSet, LeaderWorkerSets,
StatefulSets: ``controllers``) are created before the pods they own; a
wide-EP group's worker StatefulSet and workers follow its leader pod
(``Workers``)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

from toposerve.dra_driver.gpu.devices import DRIVER as GPU_DRIVER
from toposerve.dra_driver.net.devices import DRIVER as NET_DRIVER
from toposerve.localcluster.nodes import KWOK_TOLERATION
from toposerve.localcluster.scale import controllers as ctl
from toposerve.localcluster.scale.scenario import (
    Claims,
    ClaimShape,
    PdSlices,
    Plain,
    PodGroups,
    ScaleScenario,
    Setup,
    WideEp,
)
from toposerve.topology.labels import PROFILE_LABEL
from toposerve.topology.workloads import DS_ROLE, GROUP, GROUP_SIZE, LEVEL

NAMESPACE = "default"
RES = "resource.k8s.io/v1"
SCALE_LABEL = "scale.toposerve.io/kind"
GROUP_LABEL = "scale.toposerve.io/group"
GPU_CLASS = "scale-gpu"  # whole GPUs
PART_CLASS = "scale-gpu-partition"
NIC_CLASS = "scale-nic"
DEVICE_CLASSES = (GPU_CLASS, PART_CLASS)  # what the extender counts as accelerators
# the extender's scheduler profile for groups' pods (the chart's default
# scheduler.schedulerName); the rest go through its default profile
GROUPS_SCHEDULER = "toposerve-scheduler"
LEVEL_KEYS = {"nvlink": "topology.toposerve.io/nvlink-domain",
              "rack": "topology.toposerve.io/rack", "block": "topology.toposerve.io/block"}


@dataclass(frozen=True)
class PodPlan:
    """One pod to create and what it means for the figures."""

    name: str
    kind: str
    body: dict[str, Any]
    gpus: int = 0  # GPUs its claim takes (a partition counts as its GPU)
    claims: bool = False
    group: str | None = None
    role: str | None = None
    leader: str | None = None  # a wide-EP worker: made after this leader pod (``Workers``)


@dataclass(frozen=True)
class GroupPlan:
    name: str
    kind: str
    pods: int
    gpus_per_pod: int
    profile: str
    level: str
    roles: tuple[str, ...] = ()
    names: tuple[str, ...] = ()  # its pods' names, in roles' order; (): <name>-<i>

    def pod_name(self, i: int) -> str:
        return self.names[i] if self.names else f"{self.name}-{i}"


@dataclass
class Plan:
    setup: Setup
    objects: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (API path, body)
    pods: list[PodPlan] = field(default_factory=list)  # in arrival order
    groups: list[GroupPlan] = field(default_factory=list)
    workers: dict[str, Workers] = field(default_factory=dict)  # by leader pod name


def device_classes() -> list[dict[str, Any]]:
    def cls(name: str, expr: str) -> dict[str, Any]:
        return {"apiVersion": RES, "kind": "DeviceClass", "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": expr}}]}}
    gpu = f"device.driver == '{GPU_DRIVER}'"
    kind = f"device.attributes['{GPU_DRIVER}'].type"
    return [cls(GPU_CLASS, f"{gpu} && {kind} == 'gpu'"),
            cls(PART_CLASS, f"{gpu} && {kind} != 'gpu'"),
            cls(NIC_CLASS, f"device.driver == '{NET_DRIVER}'")]


def template_name(shape: ClaimShape, gpus: int) -> str:
    return f"{shape.value}-{gpus}"


def claim_template(shape: ClaimShape, gpus: int) -> dict[str, Any]:
    def req(name: str, cls: str, count: int = 1) -> dict[str, Any]:
        return {"name": name, "exactly": {"deviceClassName": cls, "count": count}}
    devices: dict[str, Any]
    if shape is ClaimShape.PARTITION:
        devices = {"requests": [req("gpu", PART_CLASS)]}
    elif shape is ClaimShape.GPU_NIC:
        devices = {"requests": [req("gpu", GPU_CLASS), req("nic", NIC_CLASS)],
                   "constraints": [{"requests": ["gpu", "nic"],
                                    "matchAttribute": "resource.kubernetes.io/pcieRoot"}]}
    elif shape is ClaimShape.GPUS_ON_SWITCH:
        devices = {"requests": [req("gpu", GPU_CLASS, gpus)],
                   "constraints": [{"requests": ["gpu"],
                                    "matchAttribute": f"{GPU_DRIVER}/pcieSwitch"}]}
    else:
        devices = {"requests": [req("gpu", GPU_CLASS, gpus)]}
    return {"apiVersion": RES, "kind": "ResourceClaimTemplate",
            "metadata": {"name": template_name(shape, gpus), "namespace": NAMESPACE},
            "spec": {"spec": {"devices": devices}}}


def _pod(name: str, kind: str, *, template: str | None, profile: str | None,
         labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
         spec: dict[str, Any] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "registry.invalid/scale:0"}
    body: dict[str, Any] = {"containers": [container], "tolerations": [KWOK_TOLERATION],
                            "terminationGracePeriodSeconds": 0, **(spec or {})}
    if profile:
        body["nodeSelector"] = {PROFILE_LABEL: profile}
    if template:
        body["resourceClaims"] = [{"name": "dev", "resourceClaimTemplateName": template}]
        container["resources"] = {"claims": [{"name": "dev"}]}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE,
                         "labels": {SCALE_LABEL: kind, **(labels or {})},
                         "annotations": annotations or {}},
            "spec": body}


REVISION = "scale1"  # the template revision every group's pods are at


def _member(body: dict[str, Any], g: GroupPlan, setup: Setup, *, role: str | None = None,
            leader: str | None = None) -> PodPlan:
    """A pod of ``g`` as its controllers built it, marked for the figures;
    with the workload gates it names the group's PodGroup."""
    md, spec = body["metadata"], body["spec"]
    md["labels"].update({SCALE_LABEL: g.kind, GROUP_LABEL: g.name})
    spec["terminationGracePeriodSeconds"] = 0
    if setup is Setup.IN_TREE:
        spec["schedulingGroup"] = {"podGroupName": g.name}
    elif setup is Setup.TOPOSERVE:
        spec["schedulerName"] = GROUPS_SCHEDULER
    spec["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return PodPlan(md["name"], g.kind, body, gpus=g.gpus_per_pod, claims=True, group=g.name,
                   role=role, leader=leader)


def _template(g: GroupPlan) -> str:
    return template_name(ClaimShape.ONE_GPU, g.gpus_per_pod)


def _slice(g: GroupPlan, setup: Setup) -> tuple[list[tuple[str, dict[str, Any]]],
                                                list[PodPlan]]:
    """A P/D slice as the DisaggregatedSet and LeaderWorkerSet controllers
    make it: the set, one LeaderWorkerSet per role (``replicas`` groups of
    one pod), each one's leader StatefulSet, and the leader pods, each
    owned by the one before (uids filled in when created)."""
    ds = ctl.disaggregated_set(g.name, {r: (g.roles.count(r), 1)
                                        for r in dict.fromkeys(g.roles)}, namespace=NAMESPACE)
    objects = [(ctl.collection("DisaggregatedSet", NAMESPACE), ds)]
    pods: list[PodPlan] = []
    for lws in ctl.disaggregated_lws(ds, 0, REVISION):
        sts = ctl.leader_statefulset(lws, REVISION)
        objects += [(ctl.collection("LeaderWorkerSet", NAMESPACE), lws),
                    (ctl.collection("StatefulSet", NAMESPACE), sts)]
        for i in range(lws["spec"]["replicas"]):
            body = ctl.lws_leader(lws, sts, i, claim_template=_template(g), profile=g.profile)
            pods.append(_member(body, g, setup, role=body["metadata"]["labels"][DS_ROLE]))
    return objects, pods


@dataclass(frozen=True)
class Workers:
    """A wide-EP group's worker StatefulSet and workers, which LWS makes
    once the leader pod exists, or with exclusive placement (``pin``, the
    level's node label) once the leader is bound, pinned to its domain."""

    group: GroupPlan
    setup: Setup
    lws: dict[str, Any]
    leader: dict[str, Any]  # the leader pod as planned (its uid comes from the API)
    pin: str | None

    def make(self, topology: str | None = None) -> tuple[dict[str, Any], list[PodPlan]]:
        """The worker StatefulSet (pinned to ``topology``, the leader's node's
        ``pin`` label) and its pods, owned by the leader and the set."""
        sts = ctl.worker_statefulset(self.lws, self.leader, topology=topology)
        g, name = self.group, self.leader["metadata"]["name"]
        return sts, [_member(ctl.lws_worker(self.lws, self.leader, sts, w,
                                            claim_template=_template(g), profile=g.profile),
                             g, self.setup, leader=name) for w in range(1, g.pods)]


def _wide_ep(g: GroupPlan, setup: Setup) -> tuple[list[tuple[str, dict[str, Any]]],
                                                  PodPlan, Workers]:
    """A wide-EP group as LeaderWorkerSet makes it: a LWS of one group of
    ``g.pods``, its leader StatefulSet and leader pod (created up front) and
    the ``Workers`` that follow the leader. Exclusive placement on the
    level's node label, except with the workload gates: there the group's
    PodGroup carries the level, and its gang could never start if the
    workers waited for the leader to be bound."""
    pin = None if setup is Setup.IN_TREE else LEVEL_KEYS[g.level]
    lws = ctl.leader_worker_set(g.name, 1, g.pods, exclusive=pin, namespace=NAMESPACE)
    sts = ctl.leader_statefulset(lws, REVISION)
    leader = _member(ctl.lws_leader(lws, sts, 0, claim_template=_template(g),
                                    profile=g.profile), g, setup)
    return ([(ctl.collection("LeaderWorkerSet", NAMESPACE), lws),
             (ctl.collection("StatefulSet", NAMESPACE), sts)], leader,
            Workers(g, setup, lws, leader.body, pin))


def _gang_pod(g: GroupPlan, i: int, setup: Setup) -> PodPlan:
    """A gang pod: in the in-tree setup it names its PodGroup, in ours it
    carries toposerve's group labels, in the default nothing."""
    name = g.pod_name(i)
    labels: dict[str, str] = {GROUP_LABEL: g.name}
    spec: dict[str, Any] = {}
    if setup is Setup.IN_TREE:
        spec = {"schedulingGroup": {"podGroupName": g.name}}
    elif setup is Setup.TOPOSERVE:
        labels.update({GROUP: g.name, GROUP_SIZE: str(g.pods),
                       LEVEL: g.level})
        spec = {"schedulerName": GROUPS_SCHEDULER}
    body = _pod(name, g.kind, template=_template(g), profile=g.profile, labels=labels,
                spec=spec)
    return PodPlan(name, g.kind, body, gpus=g.gpus_per_pod, claims=True, group=g.name)


def pod_group(g: GroupPlan) -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
            "metadata": {"name": g.name, "namespace": NAMESPACE},
            "spec": {"schedulingPolicy": {"gang": {"minCount": g.pods}},
                     "schedulingConstraints": {"topology": [{"key": LEVEL_KEYS[g.level]}]}}}


def groups_of(sc: ScaleScenario) -> list[GroupPlan]:
    out: list[GroupPlan] = []
    for wi, w in enumerate(sc.workload):
        if isinstance(w, WideEp | PodGroups):
            out += [GroupPlan(f"{w.kind}-{wi}-{j}", w.kind, w.size, w.gpus_per_pod,
                              w.profile, w.level) for j in range(w.groups)]
        elif isinstance(w, PdSlices):
            roles = ("prefill",) * w.prefill + ("decode",) * w.decode
            out += [GroupPlan(f"pd-{wi}-{j}", "pd", len(roles), w.gpus_per_pod, w.profile,
                              w.level, roles) for j in range(w.slices)]
    return out


def plan(sc: ScaleScenario, setup: Setup) -> Plan:
    """Everything ``setup`` submits, pods in a shuffled (seeded) arrival order."""
    p = Plan(setup)
    p.objects += [(f"/apis/{RES}/deviceclasses", c) for c in device_classes()]
    shapes: set[tuple[ClaimShape, int]] = set()
    pods: list[PodPlan] = []
    for wi, w in enumerate(sc.workload):
        if isinstance(w, Plain):
            pods += [PodPlan(f"plain-{wi}-{i}", "plain",
                             _pod(f"plain-{wi}-{i}", "plain", template=None, profile=None))
                     for i in range(w.count)]
        elif isinstance(w, Claims):
            shapes.add((w.shape, w.gpus))
            t = template_name(w.shape, w.gpus)
            kind = f"claim-{w.shape.value}"
            pods += [PodPlan(f"{w.shape.value}-{wi}-{i}", kind,
                             _pod(f"{w.shape.value}-{wi}-{i}", kind, template=t,
                                  profile=w.profile), gpus=w.gpus, claims=True)
                     for i in range(w.count)]
    for g in groups_of(sc):
        shapes.add((ClaimShape.ONE_GPU, g.gpus_per_pod))
        if g.kind == "pd":
            owners, members = _slice(g, setup)
        elif g.kind == "wide-ep":
            owners, leader, workers = _wide_ep(g, setup)
            members = [leader, *workers.make()[1]]
            p.workers[leader.name] = workers
        else:
            owners, members = [], [_gang_pod(g, i, setup) for i in range(g.pods)]
        if owners:
            g = replace(g, names=tuple(m.name for m in members))
        p.objects += owners
        pods += members
        p.groups.append(g)
        if setup is Setup.IN_TREE:
            p.objects.append((f"/apis/scheduling.k8s.io/v1beta1/namespaces/{NAMESPACE}/"
                              "podgroups", pod_group(g)))
    p.objects += [(f"/apis/{RES}/namespaces/{NAMESPACE}/resourceclaimtemplates",
                   claim_template(s, n)) for s, n in sorted(shapes, key=str)]
    random.Random(sc.arrival.seed).shuffle(pods)
    p.pods = pods
    return p


def again(pod: PodPlan, n: int) -> PodPlan:
    """The same pod under a new name, for churn's re-creation."""
    name = f"{pod.name}-r{n}"
    body = {**pod.body, "metadata": {**pod.body["metadata"], "name": name}}
    return replace(pod, name=name, body=body)
