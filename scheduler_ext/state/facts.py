"""What the extender keeps of each watched object: small frozen records
parsed from the API's JSON, so the cache never holds whole objects."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

import orjson

from toposerve.scheduler_ext.placement.groups import GroupRef, identify, is_active
from toposerve.scheduler_ext.placement.levels import config_name, parse_level
from toposerve.scheduler_ext.placement.model import Decision
from toposerve.scheduler_ext.state.demand import DeviceShape, Request, device_shape, parse_requests
from toposerve.topology.labels import PROFILE_LABEL, Dialect, from_labels
from toposerve.topology.model import DomainPath
from toposerve.topology.quantity import parse_quantity

PLACEMENT_ANNOTATION = "toposerve.io/placement"
# written on a held pod when its group's size became known: a change to the pod
# is the event the scheduler waits for to try it again
SIZE_SEEN_ANNOTATION = "toposerve.io/group-size-seen"

DeviceId = tuple[str, str, str]  # (driver, pool, device)
COUNTERS = "counters/"  # a unit's name prefix when its devices share a counter set (partitions)


@dataclass(frozen=True)
class NodeFacts:
    name: str
    path: DomainPath
    profile: str | None
    extended: int  # accelerators as extended resources in allocatable


@dataclass(frozen=True)
class SliceFacts:
    name: str
    driver: str
    pool: str
    generation: int
    node: str | None
    units: tuple[tuple[str, str], ...]  # (device, unit): devices sharing a counter set share a unit
    shapes: tuple[DeviceShape, ...]  # each device's, as selectors see it (in units' order)


@dataclass(frozen=True)
class ClaimFacts:
    key: tuple[str, str]  # (namespace, name)
    requests: tuple[Request, ...]
    devices: tuple[DeviceId, ...]  # allocation results; () while unallocated
    reserved_for: tuple[str, ...]  # pod uids
    # per result, the memory bytes a share consumed (consumedCapacity); 0: not a share
    consumed: tuple[int, ...] = ()


@dataclass(frozen=True)
class PodFacts:
    uid: str
    namespace: str
    name: str
    node: str | None
    active: bool
    ref: GroupRef | None
    claims: tuple[str, ...]  # names of its ResourceClaims, where known
    templates: tuple[str, ...]  # templates of claims not created yet
    # extended resources its containers ask (name, count), whatever serves them
    resources: tuple[tuple[str, int], ...]
    # the claim the scheduler made for those a DeviceClass serves (also in
    # ``claims``), and the names it serves (DRAExtendedResource)
    extended_claim: str | None
    by_claim: frozenset[str]
    decision: Decision | None  # from the placement annotation


def _int(q: Any) -> int:
    try:
        return parse_quantity(str(q))
    except ValueError:
        return 0


def node_facts(obj: dict[str, Any], dialect: Dialect, extended: list[str]) -> NodeFacts:
    md = obj.get("metadata") or {}
    labels = md.get("labels") or {}
    alloc = (obj.get("status") or {}).get("allocatable") or {}
    return NodeFacts(md["name"], from_labels(md["name"], labels, dialect),
                     labels.get(PROFILE_LABEL), sum(_int(alloc[r]) for r in extended
                                                    if r in alloc))


def slice_facts(obj: dict[str, Any]) -> SliceFacts:
    spec = obj.get("spec") or {}
    pool = spec.get("pool") or {}
    driver = spec.get("driver", "")
    units = []
    shapes = []
    for d in spec.get("devices") or []:
        sets = [c.get("counterSet") for c in d.get("consumesCounters") or [] if
                c.get("counterSet")]
        units.append((d["name"], f"{COUNTERS}{sets[0]}" if sets else d["name"]))
        shapes.append(device_shape(driver, d))
    return SliceFacts((obj.get("metadata") or {})["name"], driver,
                      pool.get("name", ""), int(pool.get("generation") or 0),
                      spec.get("nodeName"), tuple(units), tuple(shapes))


def claim_facts(obj: dict[str, Any]) -> ClaimFacts:
    md = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    # a result with admin access holds no device: the scheduler counts it as free
    results = [r for r in ((status.get("allocation") or {}).get("devices") or {}).get(
        "results") or [] if not r.get("adminAccess")]
    return ClaimFacts(
        (md.get("namespace", "default"), md["name"]),
        parse_requests((spec.get("devices") or {}).get("requests") or []),
        tuple((r.get("driver", ""), r.get("pool", ""), r.get("device", "")) for r in results),
        tuple(r.get("uid", "") for r in status.get("reservedFor") or []),
        tuple(_int((r.get("consumedCapacity") or {}).get("memory", 0)) for r in results))


def template_requests(obj: dict[str, Any]) -> tuple[tuple[str, str], tuple[Request, ...]]:
    md = obj.get("metadata") or {}
    inner = (obj.get("spec") or {}).get("spec") or {}
    return ((md.get("namespace", "default"), md["name"]),
            parse_requests((inner.get("devices") or {}).get("requests") or []))


def _signature(fields: dict[str, Any], key: bytes) -> str:
    return hmac.new(key, orjson.dumps(fields, option=orjson.OPT_SORT_KEYS),
                    hashlib.sha256).hexdigest()


def decision_annotation(d: Decision, key: bytes) -> str:
    """The decision as written on a pod, signed with ``key`` (HMAC-SHA256):
    a pod's author can write the annotation too, and only what an extender
    holding the key decided is read back as a promise."""
    fields = {"group": d.group, "level": config_name(d.tier), "domain": list(d.domain),
              "decidedAt": d.decided_at, "expiresAt": d.expires_at, "required": d.required,
              "profiles": list(d.profiles)}
    return orjson.dumps({**fields, "signature": _signature(fields, key)}).decode()


def parse_decision(text: str, dialect: Dialect, key: bytes) -> Decision | None:
    """A decision read from a pod, if an extender holding ``key`` wrote it."""
    try:
        raw = orjson.loads(text)
        signature = str(raw.pop("signature", ""))
        if not hmac.compare_digest(signature, _signature(raw, key)):
            return None
        return Decision(str(raw["group"]), parse_level(str(raw["level"]), dialect),
                        tuple(raw["domain"]), float(raw["decidedAt"]),
                        float(raw["expiresAt"]), bool(raw.get("required", False)),
                        tuple(str(p) for p in raw.get("profiles") or ()))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None  # not ours to trust: decided afresh


def _extended_resources(containers: list[dict[str, Any]]) -> tuple[tuple[str, int], ...]:
    """Domain-qualified resources (``nvidia.com/gpu``, a DeviceClass's
    implicit name) the containers ask, summed by name."""
    asked: dict[str, int] = {}
    for c in containers:
        req = ((c.get("resources") or {}).get("requests") or {}) or \
            ((c.get("resources") or {}).get("limits") or {})
        for name, q in req.items():
            if "/" in name and (n := _int(q)) > 0:
                asked[name] = asked.get(name, 0) + n
    return tuple(sorted(asked.items()))


def pod_facts(obj: dict[str, Any], dialect: Dialect, key: bytes) -> PodFacts:
    md = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    made = {s.get("name"): s.get("resourceClaimName")
            for s in status.get("resourceClaimStatuses") or []}
    claims: list[str] = []
    templates: list[str] = []
    for rc in spec.get("resourceClaims") or []:
        if rc.get("resourceClaimName"):
            claims.append(rc["resourceClaimName"])
        elif made.get(rc.get("name")):
            claims.append(made[rc.get("name")])
        elif rc.get("resourceClaimTemplateName"):
            templates.append(rc["resourceClaimTemplateName"])
    # the claim the scheduler made for its extended resources served by DRA
    ext = status.get("extendedResourceClaimStatus") or {}
    ext_claim = str(ext.get("resourceClaimName") or "") or None
    if ext_claim is not None:
        claims.append(ext_claim)
    by_claim = frozenset(str(m.get("resourceName")) for m in
                         ext.get("requestMappings") or [] if m.get("resourceName"))
    note = (md.get("annotations") or {}).get(PLACEMENT_ANNOTATION)
    return PodFacts(md.get("uid", ""), md.get("namespace", "default"), md.get("name", ""),
                    spec.get("nodeName") or None, is_active(obj), identify(obj, dialect),
                    tuple(claims), tuple(templates),
                    _extended_resources(spec.get("containers") or []), ext_claim, by_claim,
                    parse_decision(note, dialect, key) if note else None)
