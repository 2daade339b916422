"""What the ResourceSlice publisher decides, as pure functions over plain
data: how a pool is cut into slices, what the slices are called, which
writes bring the cluster from what is there to what is wanted, and which
fields an apiserver dropped (and behind which feature gate).

The publisher (``publisher.py``) does the I/O around these.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES = 128
MAX_DEVICES_TAINTS_OR_COUNTERS = 64
MAX_COUNTER_SETS = 8
MAX_NAME = 253

# A field the apiserver drops when its feature gate is off, by the field's key.
GATES = {
    "taints": "DRADeviceTaints",
    "sharedCounters": "DRAPartitionableDevices",
    "consumesCounters": "DRAPartitionableDevices",
    "perDeviceNodeSelection": "DRAPartitionableDevices",
    "bindsToNode": "DRADeviceBindingConditions",
    "bindingConditions": "DRADeviceBindingConditions",
    "bindingFailureConditions": "DRADeviceBindingConditions",
    "allowMultipleAllocations": "DRAConsumableCapacity",
    "requestPolicy": "DRAConsumableCapacity",
    "nodeAllocatableResources": "DRANodeAllocatableResources",
    "ints": "DRAListTypeAttributes",
    "bools": "DRAListTypeAttributes",
    "strings": "DRAListTypeAttributes",
    "versions": "DRAListTypeAttributes",
}


@dataclass(frozen=True)
class Pool:
    """One pool of one driver: what the driver wants published."""

    name: str                                   # pool name; for node-local pools the node name
    node_name: str                              # spec.nodeName of every slice of the pool
    devices: tuple[Mapping[str, Any], ...]      # resource.k8s.io/v1 Device JSON (camelCase keys)
    shared_counters: tuple[Mapping[str, Any], ...] = ()   # CounterSet JSON, {"name", "counters"}
    # The Node's UID for the slices' owner reference; looked up when empty.
    node_uid: str = ""


@dataclass(frozen=True)
class DesiredSlice:
    """One slice as it should be, generation left out (it is decided per write)."""

    name: str
    key: str                 # "devices" or "sharedCounters"
    packed: bytes            # the JSON array for ``key``, zlib-compressed: a thousand
                             # nodes' devices are ~100 MB of JSON, ~6 MB packed
    digest: str              # of the canonical spec without the generation

    def items(self) -> bytes:
        return zlib.decompress(self.packed)


@dataclass(frozen=True)
class DesiredPool:
    pool: str
    node_name: str
    node_uid: str
    slices: tuple[DesiredSlice, ...]


@dataclass(frozen=True)
class Observed:
    """What the publisher keeps of a slice it saw: enough to compare and to
    write, not the whole object (a thousand nodes' slices would not fit)."""

    name: str
    uid: str
    resource_version: int
    pool: str
    generation: int
    node_name: str
    digest: str                                  # canonical spec without the generation
    metadata: Mapping[str, Any]                  # labels, ownerReferences, resourceVersion...
    taint_times: Mapping[tuple[str, str, str, str], str] = field(default_factory=dict)


@dataclass(frozen=True)
class Write:
    name: str
    create: bool
    body: dict[str, Any]
    sent_digest: str         # what we asked for, to recognise the server's form of it


@dataclass(frozen=True)
class PoolPlan:
    deletes: tuple[Observed, ...] = ()
    writes: tuple[Write, ...] = ()
    generation: int = 0

    def empty(self) -> bool:
        return not self.deletes and not self.writes


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _without_taint_times(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The apiserver stamps ``timeAdded`` on taints; compare without it."""
    devices = spec.get("devices")
    if not devices or not any(d.get("taints") for d in devices):
        return dict(spec)
    out = dict(spec)
    out["devices"] = [
        {**d, "taints": [{k: v for k, v in t.items() if k != "timeAdded"} for t in d["taints"]]}
        if d.get("taints") else d for d in devices]
    return out


def canonical_digest(spec: Mapping[str, Any]) -> str:
    """A slice spec's identity for comparison: sorted keys, no generation,
    no taint time stamps."""
    s = _without_taint_times(spec)
    pool = s.get("pool")
    if isinstance(pool, Mapping):
        s["pool"] = {k: v for k, v in pool.items() if k != "generation"}
    return _digest(orjson.dumps(s, option=orjson.OPT_SORT_KEYS))


def slice_name(driver: str, pool: str, index: int, count: int) -> str:
    """Deterministic, sorted by index within the pool, and a valid DNS
    subdomain (a pool name may hold '/', a slice name may not)."""
    base = f"{pool}-{driver}".replace("/", "-").lower()
    width = max(2, len(str(count - 1)))
    suffix = f"-{index:0{width}d}"
    if len(base) + len(suffix) > MAX_NAME:
        cut = MAX_NAME - len(suffix) - 13
        base = f"{base[:cut].rstrip('-.')}-{_digest(base.encode())[:12]}"
    return base + suffix


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def split(pool: Pool) -> list[tuple[str, Sequence[Mapping[str, Any]]]]:
    """The pool's slices in order: counter sets first (a slice holds
    devices or counters, not both), then devices, 128 a slice or 64 when any
    device has taints or consumes counters. A pool with nothing in it still
    gets one empty slice: "no devices" is not "no driver"."""
    out: list[tuple[str, Sequence[Mapping[str, Any]]]] = [
        ("sharedCounters", c) for c in _chunks(pool.shared_counters, MAX_COUNTER_SETS)]
    devices = pool.devices
    limited = any(d.get("taints") or d.get("consumesCounters") for d in devices)
    size = MAX_DEVICES_TAINTS_OR_COUNTERS if limited else MAX_DEVICES
    out += [("devices", c) for c in _chunks(devices, size)]
    return out or [("devices", ())]


def desired_pool(driver: str, pool: Pool) -> DesiredPool:
    parts = split(pool)
    slices = []
    for i, (key, items) in enumerate(parts):
        spec = {"driver": driver, "nodeName": pool.node_name,
                "pool": {"name": pool.name, "resourceSliceCount": len(parts)},
                key: list(items)}
        slices.append(DesiredSlice(
            name=slice_name(driver, pool.name, i, len(parts)), key=key,
            packed=zlib.compress(orjson.dumps(list(items), option=orjson.OPT_SORT_KEYS), 1),
            digest=canonical_digest(spec)))
    return DesiredPool(pool=pool.name, node_name=pool.node_name, node_uid=pool.node_uid,
                       slices=tuple(slices))


def observe(obj: Mapping[str, Any]) -> Observed:
    """The parts of a ResourceSlice object (as the apiserver sent it) the
    publisher keeps."""
    meta = obj["metadata"]
    spec = obj.get("spec", {})
    pool = spec.get("pool", {})
    times = {(d["name"], t.get("key", ""), t.get("value", ""), t.get("effect", "")): t["timeAdded"]
             for d in spec.get("devices") or () for t in d.get("taints") or ()
             if t.get("timeAdded")}
    keep = {k: meta[k] for k in ("name", "uid", "resourceVersion", "labels", "ownerReferences",
                                 "annotations", "finalizers") if k in meta}
    return Observed(name=meta["name"], uid=meta.get("uid", ""),
                    resource_version=int(meta.get("resourceVersion") or 0),
                    pool=pool.get("name", ""), generation=int(pool.get("generation", 0)),
                    node_name=spec.get("nodeName", ""), digest=canonical_digest(spec),
                    metadata=keep, taint_times=times)


def _owner(node_name: str, node_uid: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid,
            "controller": True}


def _metadata_ok(obs: Observed, labels: Mapping[str, str], node_name: str) -> bool:
    have = obs.metadata.get("labels") or {}
    if any(have.get(k) != v for k, v in labels.items()):
        return False
    return any(o.get("kind") == "Node" and o.get("name") == node_name
               for o in obs.metadata.get("ownerReferences") or ())


def _items_with_taint_times(d: DesiredSlice, obs: Observed | None) -> Any:
    """Devices keep the time their taint was first published (as Go's
    controller does), so rewriting a slice does not move it."""
    if d.key != "devices" or obs is None or not obs.taint_times:
        return orjson.Fragment(d.items())
    devices = orjson.loads(d.items())
    for dev in devices:
        for t in dev.get("taints") or ():
            when = obs.taint_times.get((dev["name"], t.get("key", ""), t.get("value", ""),
                                        t.get("effect", "")))
            if when and "timeAdded" not in t:
                t["timeAdded"] = when
    return devices


def _body(driver: str, want: DesiredPool, d: DesiredSlice, generation: int,
          labels: Mapping[str, str], obs: Observed | None) -> dict[str, Any]:
    spec = {"driver": driver, "nodeName": want.node_name,
            "pool": {"name": want.pool, "generation": generation,
                     "resourceSliceCount": len(want.slices)},
            d.key: _items_with_taint_times(d, obs)}
    if obs is None:
        meta: dict[str, Any] = {"name": d.name, "labels": dict(labels),
                                "ownerReferences": [_owner(want.node_name, want.node_uid)]}
    else:
        meta = dict(obs.metadata)
        meta["labels"] = {**(meta.get("labels") or {}), **labels}
        owners = list(meta.get("ownerReferences") or ())
        if not any(o.get("kind") == "Node" and o.get("name") == want.node_name for o in owners):
            owners.append(_owner(want.node_name, want.node_uid))
        meta["ownerReferences"] = owners
    return {"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": meta, "spec": spec}


def plan(driver: str, want: DesiredPool | None, have: Iterable[Observed], *,
         labels: Mapping[str, str] | None = None,
         server_forms: Mapping[str, tuple[str, str]] | None = None) -> PoolPlan:
    """The writes that make the pool's slices ``want`` (``None``: the pool
    should not exist). ``server_forms`` maps a slice name to (digest we
    sent, digest the apiserver stored) from our last write of it, so that
    a server's normal form of what we asked for (or a field it dropped)
    counts as unchanged.

    Any change to the pool's content bumps its generation and rewrites
    every slice of it, so consumers never mix two versions; a slice whose
    only fault is its metadata (labels, owner) is fixed in place."""
    have = list(have)
    labels = labels or {}
    server_forms = server_forms or {}
    if want is None:
        return PoolPlan(deletes=tuple(have))
    by_name = {o.name: o for o in have}
    wanted = {d.name for d in want.slices}
    obsolete = tuple(o for o in have if o.name not in wanted)
    generation = max((o.generation for o in have), default=0)

    def same(d: DesiredSlice) -> bool:
        o = by_name.get(d.name)
        if o is None or o.generation != generation or o.node_name != want.node_name:
            return False
        return o.digest == d.digest or server_forms.get(d.name) == (d.digest, o.digest)

    changed = not all(same(d) for d in want.slices)
    if changed:
        generation += 1
    writes = []
    for d in want.slices:
        o = by_name.get(d.name)
        if changed or o is None or not _metadata_ok(o, labels, want.node_name):
            writes.append(Write(name=d.name, create=o is None, sent_digest=d.digest,
                                body=_body(driver, want, d, generation, labels, o)))
    return PoolPlan(deletes=obsolete, writes=tuple(writes), generation=generation)


def dropped_fields(sent: Any, got: Any, path: str = "spec") -> list[tuple[str, str]]:
    """(field path, feature gate) for everything we sent that the apiserver
    did not keep. A gate we cannot name is reported as "unknown"."""
    out: list[tuple[str, str]] = []
    if isinstance(sent, Mapping):
        if not isinstance(got, Mapping):
            return [(path, _gate_of(path, sent))]
        for k, v in sent.items():
            if k not in got:
                if v not in (None, [], {}, False):
                    out.append((f"{path}.{k}", _gate_of(k, v)))
            elif k != "timeAdded":
                out += dropped_fields(v, got[k], f"{path}.{k}")
    elif isinstance(sent, list):
        if not isinstance(got, list) or len(got) != len(sent):
            return [(path, _gate_of(path.rsplit(".", 1)[-1], sent))]
        for i, (a, b) in enumerate(zip(sent, got, strict=True)):
            name = a.get("name") if isinstance(a, Mapping) else None
            out += dropped_fields(a, b, f"{path}[{name if name else i}]")
    return out


def _gate_of(key: str, value: Any) -> str:
    key = key.rsplit("[", 1)[0]
    if key in GATES:
        return GATES[key]
    if isinstance(value, Mapping):
        for k in value:
            if k in GATES:
                return GATES[k]
    return "unknown"
