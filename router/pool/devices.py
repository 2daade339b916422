"""The devices each endpoint pod holds, and their health: a pod's
ResourceClaims (``spec.resourceClaims``, the generated names of template
claims in ``status.resourceClaimStatuses``) name, once allocated, the
devices they were given (``status.allocation.devices.results``: driver,
pool, device); the ResourceSlices of the pod's node publish each device's
place (``topology.slice_attributes.held_device``) and taints.

What it costs the apiserver: a GET per claim of a routable pod, once per
pod (an allocation never changes while a pod holds the claim), and one
watch of ResourceSlices per node that hosts an endpoint pod holding
devices (``fieldSelector=spec.nodeName=<node>``: that node's slices only),
started with the node's first such pod and stopped with its last; like
the pod watch, each resumes from its last resourceVersion and lists again
only after 410 Gone. Devices of a pool that is not one node's (network
attached, ``allNodes``) are not watched: their place and health are
unknown here.

A device with a ``NoSchedule`` or ``NoExecute`` taint takes its pod out of
rotation (``Pool.routable``) until the taint goes: a taint its slice
carries (the GPU driver's ``gpu.toposerve.io/xid`` or ``gpu-lost``, or any
other driver's), or one a DeviceTaintRule puts on it (an admin's, selecting
devices by driver, pool and name: one watch of the rules, which are few,
while any pod holds devices; none where the API lacks them)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import structlog

from toposerve.kubeapi import ApiError, JsonApi, Reflector
from toposerve.router.supervise import Streak, Streaks
from toposerve.topology.slice_attributes import held_device
from toposerve.topology.transfer import DeviceSet, HeldDevice

log = structlog.get_logger("router.pool.devices")

RESOURCE = "/apis/resource.k8s.io/v1"
BLOCKING = frozenset({"NoSchedule", "NoExecute"})  # taint effects that stop routing
# how long a pod's view waits for its node's slices to be listed the first
# time, so that a pod whose GPU is tainted already is not routed meanwhile
FIRST_LIST_WAIT_S = 5.0
MAX_CLAIMS = 32  # a pod's claims read (the API allows 32 a pod)

DeviceRef = tuple[str, str, str]  # (driver, pool, device), as an allocation names it


class DeviceTaint(NamedTuple):
    """A taint that stops routing, on a device a pod holds."""

    device: str  # driver/pool/device
    key: str
    value: str
    effect: str

    def __str__(self) -> str:
        return f"{self.device} {self.key}{'=' + self.value if self.value else ''}:{self.effect}"


class Rule(NamedTuple):
    """A DeviceTaintRule's taint that stops routing, and the devices it
    selects (None: any)."""

    driver: str | None
    pool: str | None
    device: str | None
    key: str
    value: str
    effect: str

    def selects(self, ref: DeviceRef) -> bool:
        return all(want is None or want == got
                   for want, got in zip((self.driver, self.pool, self.device), ref, strict=True))


def rule_of(obj: Mapping[str, Any]) -> Rule | None:
    """A DeviceTaintRule as a ``Rule``; None when its taint does not stop routing."""
    spec = obj.get("spec") or {}
    sel, taint = spec.get("deviceSelector") or {}, spec.get("taint") or {}
    if not isinstance(sel, dict) or not isinstance(taint, dict) or \
            taint.get("effect") not in BLOCKING:
        return None

    def field(name: str) -> str | None:
        v = sel.get(name)
        return v if isinstance(v, str) else None

    return Rule(field("driver"), field("pool"), field("device"), str(taint.get("key", "")),
                str(taint.get("value", "")), str(taint["effect"]))


class Holding(NamedTuple):
    """What a pod holds, as far as its node's slices tell."""

    devices: DeviceSet
    taints: tuple[DeviceTaint, ...]


NOTHING = Holding(DeviceSet(), ())


def pod_claims(pod: Mapping[str, Any]) -> list[str]:
    """The names of the ResourceClaims a pod uses (in its namespace): those
    it names, and those made for it from a template."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    made = {s.get("name"): s.get("resourceClaimName")
            for s in status.get("resourceClaimStatuses") or () if isinstance(s, dict)}
    out = []
    for c in (spec.get("resourceClaims") or ())[:MAX_CLAIMS]:
        name = (c.get("resourceClaimName") or made.get(c.get("name"))
                if isinstance(c, dict) else None)
        if isinstance(name, str) and name:
            out.append(name)
    return out


def allocated(claim: Mapping[str, Any]) -> tuple[DeviceRef, ...] | None:
    """The devices a claim was allocated; None while it is not allocated."""
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, dict):
        return None
    results = (allocation.get("devices") or {}).get("results") or ()
    return tuple((str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", "")))
                 for r in results if isinstance(r, dict))


class NodeSlices:
    """One node's ResourceSlices, by name; a device is looked up in the
    newest generation of its pool (a driver republishing a pool writes a new
    generation, then deletes the old slices)."""

    def __init__(self) -> None:
        self._slices: dict[str, tuple[str, str, int, dict[str, Mapping[str, Any]]]] = {}

    def listed(self, items: Iterable[Mapping[str, Any]]) -> None:
        self._slices.clear()
        for obj in items:
            self.event("ADDED", obj)

    def event(self, kind: str, obj: Mapping[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if not isinstance(name, str):
            return
        if kind == "DELETED":
            self._slices.pop(name, None)
            return
        spec = obj.get("spec") or {}
        pool = spec.get("pool") or {}
        devices: dict[str, Mapping[str, Any]] = {
            d["name"]: d for d in spec.get("devices") or ()
            if isinstance(d, dict) and isinstance(d.get("name"), str)}
        self._slices[name] = (str(spec.get("driver", "")), str(pool.get("name", "")),
                              int(pool.get("generation") or 0), devices)

    def device(self, ref: DeviceRef) -> Mapping[str, Any] | None:
        driver, pool, name = ref
        found: tuple[int, Mapping[str, Any]] | None = None
        for d, p, gen, devices in self._slices.values():
            if (d, p) == (driver, pool) and name in devices and (found is None or gen > found[0]):
                found = (gen, devices[name])
        return found[1] if found else None

    def holding(self, refs: Iterable[DeviceRef], rules: Iterable[Rule] = ()) -> Holding:
        """The devices of ``refs`` found here, and their taints that stop
        routing: their slices' and ``rules``'."""
        devices: list[HeldDevice] = []
        taints: list[DeviceTaint] = []
        for ref in refs:
            entry = self.device(ref)
            if entry is None:
                continue  # another node's pool, or not published (yet)
            devices.append(held_device(ref[0], ref[1], entry))
            name = "/".join(ref)
            taints += [DeviceTaint(name, str(t.get("key", "")), str(t.get("value", "")),
                                   str(t.get("effect", "")))
                       for t in entry.get("taints") or () if isinstance(t, dict)
                       and t.get("effect") in BLOCKING]
            taints += [DeviceTaint(name, r.key, r.value, r.effect) for r in rules
                       if r.selects(ref)]
        return Holding(DeviceSet(tuple(devices)), tuple(taints))


class _Held(NamedTuple):
    pod: str
    node: str
    refs: tuple[DeviceRef, ...]


class _Watch:
    """A reflector in a daemon thread of its own, until stopped. It retries
    the apiserver's errors itself; what else it raises (an object that
    breaks a callback) is counted, logged once a streak, and it runs again
    after a backoff."""

    def __init__(self, streak: Streak) -> None:
        self.streak = streak
        self.reflector: Reflector | None = None
        self._stopped = threading.Event()

    def start(self, reflector: Reflector, name: str) -> None:
        self.reflector = reflector
        threading.Thread(target=self._run, name=name[:15], daemon=True).start()

    def _run(self) -> None:
        assert self.reflector is not None
        while not self._stopped.is_set():
            try:
                self.reflector.run()
                return  # stopped
            except Exception as err:
                self.streak.failed(err)
                self._stopped.wait(self.streak.delay)

    def stop(self) -> None:
        self._stopped.set()
        if self.reflector is not None:
            self.reflector.stop()


class _NodeWatch(_Watch):
    def __init__(self, node: str) -> None:
        super().__init__(Streak("discovery", slices=node))
        self.slices = NodeSlices()
        self.listed = threading.Event()  # listed once, or failed once: nobody waits longer


class DeviceWatch:
    """The ResourceSlices of the nodes where endpoint pods hold devices,
    and what each such pod holds. ``changed(pod, uid, holding)`` is called
    (from a watch thread, under this object's lock, so in the order the
    changes happened) when a pod's holding is first known and whenever it
    changes. Pods are keyed by UID: a pod deleted and made again under its
    name is another pod."""

    def __init__(self, api: Any, changed: Callable[[str, str, Holding], object],
                 watch_timeout_s: int) -> None:
        self._api, self._changed, self._timeout = api, changed, watch_timeout_s
        self._lock = threading.Lock()
        self._pods: dict[str, _Held] = {}  # uid -> what it holds
        self._told: dict[str, Holding] = {}  # uid -> as last told
        self._nodes: dict[str, _NodeWatch] = {}
        self._claims: dict[tuple[str, str], tuple[DeviceRef, ...]] = {}  # (uid, claim)
        self._claim_streaks = Streaks("discovery", "claim")
        self._rules: dict[str, Rule] = {}  # DeviceTaintRules that stop routing, by name
        self._rules_watch: _Watch | None = None

    # runs in the pod watch's thread
    def claimed(self, rest: JsonApi, namespace: str, pod: Mapping[str, Any]
                ) -> tuple[DeviceRef, ...]:
        """The devices the pod's claims were allocated, each claim read once
        per pod; a claim that cannot be read or is not allocated yet is read
        again with the pod's next change (logged once while it fails)."""
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        refs: list[DeviceRef] = []
        for claim in pod_claims(pod):
            key = (uid, claim)
            if key not in self._claims:
                where = f"{namespace}/{claim}"
                try:
                    got = allocated(rest.request(
                        "GET", f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{claim}"))
                except ApiError as err:
                    self._claim_streaks.failed(where, err)
                    continue
                if got is None:
                    self._claim_streaks.failed(where, ValueError("the claim is not allocated"))
                    continue
                self._claim_streaks.ok(where)
                self._claims[key] = got
            refs += self._claims[key]
        return tuple(refs)

    def hold(self, pod: str, uid: str, node: str, refs: tuple[DeviceRef, ...]) -> None:
        """The pod on ``node`` holds ``refs`` (none: it is forgotten). Waits
        for the node's slices to be listed once (FIRST_LIST_WAIT_S at most),
        so that what it holds is told before the pod is routed."""
        if not refs:
            self.drop(uid)
            return
        with self._lock:  # a pod never moves: its node is the one it had
            self._pods[uid] = _Held(pod, node, refs)
            watch = self._nodes.get(node) or self._start(node)
        watch.listed.wait(FIRST_LIST_WAIT_S)
        with self._lock:
            if self._pods.get(uid) == _Held(pod, node, refs):
                self._tell(uid, watch)

    def drop(self, uid: str) -> None:
        with self._lock:
            held = self._pods.pop(uid, None)
            self._told.pop(uid, None)
            for key in [k for k in self._claims if k[0] == uid]:
                del self._claims[key]
            if held is not None:
                self._release(held.node)

    def keep(self, uids: Iterable[str]) -> None:
        """Forget the pods not among ``uids`` (a new list of pods)."""
        keep = set(uids)
        for uid in [u for u in list(self._pods) if u not in keep]:
            self.drop(uid)

    def stop(self) -> None:
        with self._lock:
            for w in self._nodes.values():
                w.stop()
            self._nodes.clear()
            if self._rules_watch is not None:
                self._rules_watch.stop()
                self._rules_watch = None

    def nodes(self) -> list[str]:
        """The nodes whose slices are watched."""
        with self._lock:
            return sorted(self._nodes)

    # the lock is held
    def _start(self, node: str) -> _NodeWatch:
        watch = self._nodes[node] = _NodeWatch(node)

        def listed(items: list[Any], _rv: int) -> None:
            with self._lock:
                watch.slices.listed(items)
                watch.listed.set()
                self._retell(node, watch)
            watch.streak.ok()

        def event(kind: str, obj: dict[str, Any]) -> None:
            with self._lock:
                watch.slices.event(kind, obj)
                self._retell(node, watch)
            watch.streak.ok()

        def failed(err: Exception) -> None:
            watch.listed.set()  # what it holds is not known: route by the node's labels
            watch.streak.failed(err)

        watch.start(Reflector(JsonApi(self._api), f"{RESOURCE}/resourceslices",
                              [("fieldSelector", f"spec.nodeName={node}")], listed, event,
                              failed, timeout=self._timeout), f"slices-{node}")
        if self._rules_watch is None:
            self._watch_rules()
        return watch

    def _watch_rules(self) -> None:
        watch = self._rules_watch = _Watch(Streak("discovery", watch="DeviceTaintRules"))

        def listed(items: list[Any], _rv: int) -> None:
            with self._lock:
                self._rules = {_name(o): r for o in items if (r := rule_of(o)) is not None}
                self._retell_all()
            watch.streak.ok()

        def event(kind: str, obj: dict[str, Any]) -> None:
            with self._lock:
                rule = None if kind == "DELETED" else rule_of(obj)
                if rule is None:
                    self._rules.pop(_name(obj), None)
                else:
                    self._rules[_name(obj)] = rule
                self._retell_all()
            watch.streak.ok()

        def failed(err: Exception) -> None:
            if isinstance(err, ApiError) and err.status == 404:
                log.info("no DeviceTaintRules API here: only the slices' taints are read")
                watch.stop()
            else:
                watch.streak.failed(err)

        watch.start(Reflector(JsonApi(self._api), f"{RESOURCE}/devicetaintrules", [], listed,
                              event, failed, timeout=self._timeout), "taint-rules")

    def _release(self, node: str) -> None:
        if not any(h.node == node for h in self._pods.values()):
            watch = self._nodes.pop(node, None)
            if watch is not None:
                watch.stop()

    def _retell(self, node: str, watch: _NodeWatch) -> None:
        for uid in [u for u, h in self._pods.items() if h.node == node]:
            self._tell(uid, watch)

    def _retell_all(self) -> None:
        for node, watch in self._nodes.items():
            self._retell(node, watch)

    def _tell(self, uid: str, watch: _NodeWatch) -> None:
        held = self._pods[uid]
        now = watch.slices.holding(held.refs, self._rules.values())
        if self._told.get(uid) != now:
            self._told[uid] = now
            self._changed(held.pod, uid, now)


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))
