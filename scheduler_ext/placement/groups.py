"""Which group a pod belongs to, read from the labels and fields the real
controllers write (docs/design.md §5): our own ``toposerve.io/*`` labels, in-tree
PodGroups (``spec.schedulingGroup.podGroupName``), DisaggregatedSet slices,
LeaderWorkerSet groups. Pods of none of these are not grouped.

Every size is read by ``count``: a size anyone can write (a pod's labels and
annotations, a LeaderWorkerSet's or a PodGroup's fields) that is not a whole
number from 1 to ``MAX_GROUP_SIZE`` makes its group's pods fail with a
reason, never a guess."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toposerve.scheduler_ext.placement.levels import UnknownLevel, parse_level
from toposerve.scheduler_ext.placement.model import MAX_GROUP_SIZE, Source
from toposerve.topology.labels import Dialect
from toposerve.topology.model import Tier
from toposerve.topology.workloads import (
    DS_NAME,
    DS_REVISION,
    DS_ROLE,
    DS_SLICE,
    GROUP,
    GROUP_SIZE,
    LEVEL,
    LLMD_ROLE,
    LWS_EXCLUSIVE,
    LWS_GROUP_INDEX,
    LWS_GROUP_KEY,
    LWS_NAME,
    LWS_REVISION,
    LWS_SIZE,
    LWS_SUBGROUP_EXCLUSIVE,
    LWS_SUBGROUP_INDEX,
    LWS_SUBGROUP_KEY,
    LWS_SUBGROUP_POLICY,
    LWS_SUBGROUP_SIZE,
    PREFERRED_LEVEL,
    ROLE,
)


@dataclass(frozen=True)
class GroupRef:
    """A pod's group as its own metadata says. ``size`` is ``None`` when
    only other objects know it (a PodGroup's ``minCount``; the
    LeaderWorkerSets of a DisaggregatedSet slice's roles)."""

    key: str
    source: Source
    size: int | None = None
    required: Tier | None = None
    preferred: Tier | None = None
    role: str | None = None
    pod_group: tuple[str, str] | None = None  # (namespace, name) of an in-tree PodGroup
    problem: str | None = None  # metadata the extender could not read, for the filter reason


def _meta(pod: dict[str, Any]) -> tuple[dict[str, str], dict[str, str], str]:
    md = pod.get("metadata") or {}
    return md.get("labels") or {}, md.get("annotations") or {}, md.get("namespace") or "default"


class BadCount(ValueError):
    """A size that is not a whole number in range; the message names its source."""


def count(value: object, what: str, *, least: int = 1) -> int:
    """A group's size, or a count that makes one, as a label or annotation
    (ASCII digits only: Python's ``int`` also takes '٣', ' 3', '+3', '3_0')
    or an object's field (a JSON integer) says it: ``least`` to
    ``MAX_GROUP_SIZE`` (past it no group is placed, see ``Group.too_big``),
    else ``BadCount`` naming ``what``."""
    shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:40]}..."
    if isinstance(value, str) and value.isascii() and value.isdigit():
        digits = value.lstrip("0")
        # no int() of a 250 KiB annotation: past the bound's own length it is past the bound
        n = int(digits or "0") if len(digits) <= len(str(MAX_GROUP_SIZE)) else MAX_GROUP_SIZE + 1
    elif isinstance(value, int) and not isinstance(value, bool):
        n = value
    else:
        raise BadCount(f"{what}: {shown} is not a whole number (ASCII digits)")
    if n < least:
        raise BadCount(f"{what}: {shown} is less than {least}")
    if n > MAX_GROUP_SIZE:
        raise BadCount(f"{what}: {shown} is more than {MAX_GROUP_SIZE}; no group may have more "
                       f"than {MAX_GROUP_SIZE} pods")
    return n


def _count(value: object, what: str, least: int = 1) -> tuple[int | None, str | None]:
    """(the count, or None when absent or bad; why it is bad)."""
    if value is None:
        return None, None
    try:
        return count(value, what, least=least), None
    except BadCount as err:
        return None, str(err)


def _level(text: str | None, dialect: Dialect, what: str) -> tuple[Tier | None, str | None]:
    if not text:
        return None, None
    try:
        return parse_level(text, dialect), None
    except UnknownLevel as err:
        return None, f"{what}: {err}"


def identify(pod: dict[str, Any], dialect: Dialect) -> GroupRef | None:
    labels, notes, ns = _meta(pod)

    def get(key: str) -> str | None:
        return labels.get(key) or notes.get(key)

    role = get(ROLE) or labels.get(LLMD_ROLE)
    required, bad_req = _level(get(LEVEL), dialect, LEVEL)
    preferred, bad_pref = _level(get(PREFERRED_LEVEL), dialect, PREFERRED_LEVEL)
    problem = bad_req or bad_pref

    if (name := labels.get(GROUP)) is not None:
        size, bad = _count(get(GROUP_SIZE), GROUP_SIZE)
        return GroupRef(f"toposerve/{ns}/{name}", Source.TOPOSERVE, size, required, preferred,
                        role, problem=problem or bad)

    spec = pod.get("spec") or {}
    if (pg := (spec.get("schedulingGroup") or {}).get("podGroupName")):
        return GroupRef(f"podgroup/{ns}/{pg}", Source.POD_GROUP, None, required, preferred,
                        role, pod_group=(ns, pg), problem=problem)

    if DS_NAME in labels:
        ds_role = labels.get(DS_ROLE) or role
        return GroupRef(disaggregated_key(ns, labels), Source.DISAGGREGATED_SET, None,
                        required, preferred, ds_role, problem=problem)

    if (lws := labels.get(LWS_NAME)) is not None:
        group = labels.get(LWS_GROUP_KEY) or labels.get(LWS_GROUP_INDEX, "0")
        rev = labels.get(LWS_REVISION, "")
        size, bad_size = _count(notes.get(LWS_SIZE), LWS_SIZE)
        exclusive = notes.get(LWS_EXCLUSIVE)
        sub_exclusive = notes.get(LWS_SUBGROUP_EXCLUSIVE)
        key = f"lws/{ns}/{lws}/{group}/{rev}"
        if sub_exclusive and not exclusive:
            # only the subgroups must each share a domain: each is a group of its own
            if sub := labels.get(LWS_SUBGROUP_KEY):
                key += f"/{sub}"
                sub_size, bad_sub = _subgroup_size(size, notes, labels)
                size, exclusive, bad_size = sub_size, sub_exclusive, bad_size or bad_sub
            else:  # a leader excluded from the subgroups: alone, anywhere
                key, size = f"{key}/leader", 1
        lws_req, bad = _level(exclusive, dialect, LWS_EXCLUSIVE)
        return GroupRef(key, Source.LWS, size, required or lws_req, preferred, role,
                        problem=problem or bad_size or bad)
    return None


def _subgroup_size(size: int | None, notes: dict[str, str],
                   labels: dict[str, str]) -> tuple[int | None, str | None]:
    """How many pods LWS puts in the pod's subgroup: ``subgroup-size``, one
    more in the first when only ``size - 1`` divides into subgroups and the
    leader joins it (policy LeaderWorker; pkg/webhooks/pod_webhook.go);
    and what is wrong with ``subgroup-size``, if anything."""
    sub, bad = _count(notes.get(LWS_SUBGROUP_SIZE), LWS_SUBGROUP_SIZE)
    if sub is None or size is None:
        return sub, bad
    leader_extra = (size - 1) % sub == 0 and size % sub != 0
    first = labels.get(LWS_SUBGROUP_INDEX) == "0"
    joins = notes.get(LWS_SUBGROUP_POLICY, "LeaderWorker") != "LeaderExcluded"
    return (sub + 1 if leader_extra and first and joins else sub), None


def disaggregated_key(namespace: str, labels: dict[str, str]) -> str:
    """The group of a DisaggregatedSet slice at one revision, from the labels
    its controller puts on the slice's LeaderWorkerSets and their pods."""
    return f"disaggregatedset/{namespace}/{labels[DS_NAME]}/{labels.get(DS_SLICE, '0')}/" \
           f"{labels.get(DS_REVISION, '')}"


def lws_pods(obj: dict[str, Any]) -> tuple[str | None, int, str | None]:
    """(its DisaggregatedSet slice's group key, or None; how many pods; what
    is wrong with the counts, if anything) of a ``leaderworkerset.x-k8s.io/v1``
    LeaderWorkerSet: ``replicas`` (0 when scaled to zero) groups of
    ``leaderWorkerTemplate.size`` pods (both default to 1)."""
    md = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    labels = md.get("labels") or {}
    name = f"LeaderWorkerSet {md.get('namespace') or 'default'}/{md.get('name', '')}"
    replicas, bad = _count(spec.get("replicas", 1), f"{name} spec.replicas", least=0)
    size, bad_size = _count((spec.get("leaderWorkerTemplate") or {}).get("size", 1),
                            f"{name} spec.leaderWorkerTemplate.size")
    key = disaggregated_key(md.get("namespace") or "default", labels) \
        if DS_NAME in labels else None
    return key, (replicas or 0) * (size or 0), bad or bad_size


def is_active(pod: dict[str, Any]) -> bool:
    """A pod that holds or will hold resources: not finished, not being deleted."""
    md = pod.get("metadata") or {}
    phase = (pod.get("status") or {}).get("phase")
    return md.get("deletionTimestamp") is None and phase not in ("Succeeded", "Failed")


def pod_group_spec(obj: dict[str, Any], dialect: Dialect) -> tuple[int | None, Tier | None,
                                                                  str | None]:
    """(minCount, required level, problem) of a ``scheduling.k8s.io/v1beta1`` PodGroup."""
    spec = obj.get("spec") or {}
    gang = (spec.get("schedulingPolicy") or {}).get("gang") or {}
    size, bad = _count(gang.get("minCount"), "PodGroup spec.schedulingPolicy.gang.minCount")
    topo = (spec.get("schedulingConstraints") or {}).get("topology") or []
    key = topo[0].get("key") if topo else None
    level, problem = _level(key, dialect, "PodGroup schedulingConstraints.topology")
    return size, level, problem or bad
