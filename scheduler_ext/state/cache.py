"""The extender's picture of the cluster, kept from watch events (never
read from the API per call) and turned into the placement ``View``:

- Nodes -> their place in the shared topology model (``toposerve.topology.labels``);
- ResourceSlices (the newest generation of each pool) -> accelerator units
  per node;
- ResourceClaims -> units allocated, and what each claim asks for;
- DeviceClasses -> which requests ask for accelerators (``demand``);
- Pods -> groups, roles, members placed and pending, what each needs
  (its claims or templates) and the placement decisions written on them.

Events mark the nodes and groups they touch; ``view()`` rebuilds only
those, so a call after a bind costs a few records, not the cluster."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from toposerve.scheduler_ext.config import ExtenderConfig
from toposerve.scheduler_ext.placement.groups import lws_pods, pod_group_spec
from toposerve.scheduler_ext.placement.model import (
    DECODE,
    PREFILL,
    Decision,
    Group,
    Member,
    NodeState,
    Shape,
    Source,
    View,
)
from toposerve.scheduler_ext.placement.shares import fresh_units, room
from toposerve.scheduler_ext.state.demand import (
    Demands,
    Evaluated,
    Profile,
    Request,
    extended_demand,
    profile,
    share_bytes,
)
from toposerve.scheduler_ext.state.facts import (
    COUNTERS,
    ClaimFacts,
    DeviceId,
    NodeFacts,
    PodFacts,
    SliceFacts,
    claim_facts,
    node_facts,
    pod_facts,
    slice_facts,
    template_requests,
)
from toposerve.topology.model import Tier

Key = tuple[str, str]
ASSUME_TTL_S = 30.0  # a pod scheduled where we scored it binds well within this
KINDS = ("nodes", "pods", "slices", "claims", "templates", "classes", "podgroups", "lws")


def _ident(kind: str, obj: dict[str, Any]) -> str:
    md = obj.get("metadata") or {}
    if kind == "pods":
        return str(md.get("uid", ""))
    if kind in ("nodes", "slices", "classes"):
        return str(md.get("name", ""))
    return f"{md.get('namespace', 'default')}/{md.get('name', '')}"


def _stub(kind: str, ident: str) -> dict[str, Any]:
    """Enough of a vanished object for its DELETED handler."""
    if kind == "pods":
        return {"metadata": {"uid": ident}}
    if kind in ("nodes", "slices", "classes"):
        return {"metadata": {"name": ident}}
    ns, _, name = ident.partition("/")
    return {"metadata": {"namespace": ns, "name": name}}


def _drop(index: dict[Any, set[str]], key: Any, uid: str) -> None:
    """Take ``uid`` out of ``index[key]``, and the key with its last uid (an
    index of pods that came and went must not grow with them)."""
    got = index.get(key)
    if got is not None:
        got.discard(uid)
        if not got:
            del index[key]


class ClusterState:
    """Thread-safe: watches write from their threads, the server reads."""

    def __init__(self, cfg: ExtenderConfig, clock: Callable[[], float] = time.monotonic,
                 assume_ttl_s: float = ASSUME_TTL_S) -> None:
        self.cfg = cfg
        # called (under the lock: it must not block) with a group whose size just
        # became known and its pods not bound yet, (namespace, name) each
        self.on_size_known: Callable[[Group, list[tuple[str, str]]], None] | None = None
        # called (under the lock) with a pending pod of a group the first time it is
        # seen naming a scheduler other than cfg.scheduler_name, and that name
        self.on_elsewhere: Callable[[PodFacts, str], None] | None = None
        self.elsewhere: set[str] = set()  # those pods' uids, while they stay so
        self.clock = clock
        self.assume_ttl_s = assume_ttl_s
        # signs the decisions written on pods; only those signed with it are adopted
        self.key = cfg.decision_key()
        self.dialect = cfg.dialect()
        self._drivers = set(cfg.accelerators.drivers)
        self.demands = Demands(self._drivers, cfg.accelerators.device_classes)
        self._demand_generation = self.demands.generation  # as the view was built
        self._profile_of: dict[str, Profile] = {}  # node -> its accelerators' profile
        self._extended = list(cfg.accelerators.extended_resources)
        self.lock = threading.RLock()
        self.view = View(nodes={})
        self.view_seconds = 0.0  # spent in snapshot() since the start (its callers time phases)
        self._nodes: dict[str, NodeFacts] = {}
        self._slices: dict[str, SliceFacts] = {}
        self._claims: dict[Key, ClaimFacts] = {}
        self._templates: dict[Key, tuple[Request, ...]] = {}
        self._pods: dict[str, PodFacts] = {}
        self._pod_groups: dict[Key, tuple[int | None, Tier | None, str | None]] = {}
        # LeaderWorkerSets of DisaggregatedSet slices: (their slice's group, pods)
        self._lws: dict[Key, tuple[str, int, str | None]] = {}
        # indexes
        self._slices_of: dict[str, set[str]] = defaultdict(set)  # node -> slice names
        self._device: dict[DeviceId, tuple[str, str]] = {}  # -> (node, unit)
        # (driver, pool) -> its slices' names, and the devices of its newest
        # generation in _device: a slice event reindexes its pool alone (a
        # scan of every slice and device per event was quadratic in a relist)
        self._pool_slices: dict[tuple[str, str], set[str]] = defaultdict(set)
        self._pool_devices: dict[tuple[str, str], set[str]] = {}
        self._pods_on: dict[str, set[str]] = defaultdict(set)  # node -> pod uids
        self._claims_on: dict[str, set[Key]] = defaultdict(set)  # node -> allocated claims
        self._claim_at: dict[Key, str] = {}  # allocated claim -> its node
        self._claims_of_pool: dict[tuple[str, str], set[Key]] = defaultdict(set)
        self._pods_of_claim: dict[Key, set[str]] = defaultdict(set)
        self._members: dict[str, set[str]] = defaultdict(set)  # group key -> pod uids
        # pod uid -> (node, until): where we told the scheduler to put a
        # group member and it has not shown up bound yet (its scheduling
        # cycle is over, its binding not), like the scheduler's assume cache
        self._assumed: dict[str, tuple[str, float]] = {}
        self._dirty_nodes: set[str] = set()
        self._dirty_groups: set[str] = set()
        self.synced: set[str] = set()  # kinds whose first list arrived
        self._handlers: dict[str, Callable[[str, dict[str, Any]], None]] = {
            "nodes": self.node, "pods": self.pod, "slices": self.resource_slice,
            "claims": self.resource_claim, "templates": self.claim_template,
            "classes": self.device_class,
            "podgroups": self.pod_group, "lws": self.leader_worker_set}

    def handler(self, kind: str) -> Callable[[str, dict[str, Any]], None]:
        return self._handlers[kind]

    # --- events -----------------------------------------------------------------

    def _claim_node(self, c: ClaimFacts) -> str | None:
        for dev in c.devices:
            if dev in self._device:
                return self._device[dev][0]
        return None

    def node(self, kind: str, obj: dict[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name", "")
        new = None if kind == "DELETED" else node_facts(obj, self.dialect, self._extended)
        with self.lock:
            old = self._nodes.pop(name, None)
            if new is not None:
                self._nodes[name] = new
            if old == new:
                return  # a status update: nothing placement reads changed
            self._dirty_nodes.add(name)

    def resource_slice(self, kind: str, obj: dict[str, Any]) -> None:
        with self.lock:
            new = slice_facts(obj)
            old = self._slices.pop(new.name, None)
            if old is not None:
                self._slices_of[old.node or ""].discard(old.name)
                self._pool_slices[old.driver, old.pool].discard(old.name)
            if kind != "DELETED" and new.driver in self._drivers:
                self._slices[new.name] = new
                self._slices_of[new.node or ""].add(new.name)
                self._pool_slices[new.driver, new.pool].add(new.name)
            for s in (old, new):
                if s is not None:
                    self._reindex_pool(s.driver, s.pool)

    def _reindex_pool(self, driver: str, pool: str) -> None:
        names = self._pool_slices.get((driver, pool), set())
        slices = [self._slices[n] for n in names]
        newest = max((s.generation for s in slices), default=0)
        for device in self._pool_devices.pop((driver, pool), ()):
            self._dirty_nodes.add(self._device.pop((driver, pool, device))[0])
        indexed: set[str] = set()
        for s in slices:
            if s.generation == newest and s.node:
                for device, unit in s.units:
                    self._device[(driver, pool, device)] = (s.node, unit)
                    indexed.add(device)
                self._dirty_nodes.add(s.node)
        if indexed:
            self._pool_devices[driver, pool] = indexed
        if not names:
            self._pool_slices.pop((driver, pool), None)
        # claims allocated from this pool may now map to (other) nodes
        for key in list(self._claims_of_pool.get((driver, pool), ())):
            self._place_claim(key, self._claims.get(key))

    def _place_claim(self, key: Key, c: ClaimFacts | None) -> None:
        if (old := self._claim_at.pop(key, None)) is not None:
            self._claims_on[old].discard(key)
            self._dirty_nodes.add(old)
        for pool in {d[:2] for d in (self._claims[key].devices if key in self._claims else ())}:
            self._claims_of_pool[pool].discard(key)
        if c is None:
            return
        for dev in c.devices:
            self._claims_of_pool[dev[:2]].add(key)
        if (node := self._claim_node(c)) is not None:
            self._claim_at[key] = node
            self._claims_on[node].add(key)
            self._dirty_nodes.add(node)

    def resource_claim(self, kind: str, obj: dict[str, Any]) -> None:
        with self.lock:
            new = claim_facts(obj)
            deleted = kind == "DELETED"
            self._place_claim(new.key, None if deleted else new)  # reads the old record
            if deleted:
                self._claims.pop(new.key, None)
            else:
                self._claims[new.key] = new
            self._touch_pods(self._pods_of_claim.get(new.key, set()))

    def claim_template(self, kind: str, obj: dict[str, Any]) -> None:
        with self.lock:
            key, requests = template_requests(obj)
            if kind == "DELETED":
                self._templates.pop(key, None)
            else:
                self._templates[key] = requests
            self._touch_pods(uid for uid, p in self._pods.items()
                             if p.namespace == key[0] and key[1] in p.templates)

    def device_class(self, kind: str, obj: dict[str, Any]) -> None:
        """Which devices a class's requests ask for: a change moves the
        demand of every pod (``snapshot`` rebuilds them)."""
        with self.lock:
            name = (obj.get("metadata") or {}).get("name", "")
            self.demands.set_class(name, None if kind == "DELETED" else obj)

    def pod_group(self, kind: str, obj: dict[str, Any]) -> None:
        md = obj.get("metadata") or {}
        key = (md.get("namespace", "default"), md.get("name", ""))
        with self.lock:
            group = f"podgroup/{key[0]}/{key[1]}"
            waiting = self._waiting_for_size({group})
            if kind == "DELETED":
                self._pod_groups.pop(key, None)
            else:
                self._pod_groups[key] = pod_group_spec(obj, self.dialect)
            self._dirty_groups.add(group)
            self._announce_sized(waiting)

    def leader_worker_set(self, kind: str, obj: dict[str, Any]) -> None:
        """A DisaggregatedSet slice is as big as its roles' LeaderWorkerSets
        say (their pods do not carry the replica count)."""
        md = obj.get("metadata") or {}
        key = (md.get("namespace", "default"), md.get("name", ""))
        with self.lock:
            group, pods, bad = lws_pods(obj) if kind != "DELETED" else (None, 0, None)
            old = self._lws.pop(key, None)
            touched = {g for g in (group, old[0] if old else None) if g}
            waiting = self._waiting_for_size(touched)
            if group is not None:
                self._lws[key] = (group, pods, bad)
            self._dirty_groups.update(touched)
            self._announce_sized(waiting)

    def _waiting_for_size(self, keys: Iterable[str]) -> set[str]:
        """Those of the groups whose size is not known (so none of their pods
        is placed) and that have pods waiting."""
        return {k for k in keys if (g := self._group(k)) is not None and not g.size_known and
                any(m.node is None for m in g.members)}

    def _announce_sized(self, waiting: set[str]) -> None:
        """The scheduler retries a pod the extender rejected on the next
        cluster event only (or after 5 minutes): for each group of
        ``waiting`` whose size is known now, hand its waiting pods to
        ``on_size_known``, which gives the scheduler that event."""
        for key in waiting:
            g = self._group(key)
            if g is not None and g.size_known and self.on_size_known is not None:
                waits = [m.name.partition("/") for m in g.members if m.node is None]
                self.on_size_known(g, [(ns, name) for ns, _, name in waits])

    def _touch_pods(self, uids: Iterable[str]) -> None:
        for uid in list(uids):
            p = self._pods.get(uid)
            if p is not None:
                if p.node:
                    self._dirty_nodes.add(p.node)
                if uid in self._assumed:
                    self._dirty_nodes.add(self._assumed[uid][0])
                if p.ref:
                    self._dirty_groups.add(p.ref.key)

    def pod(self, kind: str, obj: dict[str, Any]) -> None:
        facts = pod_facts(obj, self.dialect, self.key)
        with self.lock:
            self._set_pod(facts, kind == "DELETED")
            if kind == "DELETED":
                self.elsewhere.discard(facts.uid)
            else:
                self._check_scheduler(facts, str((obj.get("spec") or {}).get(
                    "schedulerName") or "default-scheduler"))

    def _check_scheduler(self, p: PodFacts, scheduler: str) -> None:
        """A group's pod that another scheduler will place never reaches the
        extender as one of its group (the cluster's own scheduler does not
        call it; the ungrouped profile samples nodes): said once a pod."""
        wanted = self.cfg.scheduler_name
        if wanted is None or p.ref is None or p.node or not p.active or scheduler == wanted:
            self.elsewhere.discard(p.uid)
        elif p.uid not in self.elsewhere:
            self.elsewhere.add(p.uid)
            if self.on_elsewhere is not None:
                self.on_elsewhere(p, scheduler)

    @contextmanager
    def observing(self, obj: dict[str, Any]) -> Iterator[PodFacts]:
        """The pod of a scheduler request: its watched record when the
        watch has shown it; else this copy, counted for the call only and
        gone after it (the watch may be behind, but a pod no watch has
        shown is the caller's word: kept, it could fill racks with pods
        that do not exist, and grow the cache by one per call)."""
        uid = (obj.get("metadata") or {}).get("uid", "")
        with self.lock:
            known = self._pods.get(uid)
            if known is not None:
                yield known
                return
            facts = pod_facts(obj, self.dialect, self.key)
            self._set_pod(facts, False)
            try:
                yield facts
            finally:
                self._set_pod(facts, True)

    def assume(self, uid: str, node: str) -> None:
        """The group member ``uid`` is (probably) going to ``node``."""
        with self.lock:
            p = self._pods.get(uid)
            if p is None or p.node:
                return
            self.unassume(uid)
            self._assumed[uid] = (node, self.clock() + self.assume_ttl_s)
            self._dirty_nodes.add(node)
            if p.ref:
                self._dirty_groups.add(p.ref.key)

    def unassume(self, uid: str) -> None:
        with self.lock:
            gone = self._assumed.pop(uid, None)
            if gone is not None:
                self._dirty_nodes.add(gone[0])
                p = self._pods.get(uid)
                if p is not None and p.ref:
                    self._dirty_groups.add(p.ref.key)

    def _set_pod(self, new: PodFacts, deleted: bool) -> None:
        if deleted or new.node or not new.active:
            self.unassume(new.uid)
        if not deleted and self._pods.get(new.uid) == new:
            # a status update: nothing placement reads changed, so neither its
            # node nor its group is rebuilt (most pod events, every kubelet beat)
            if new.ref and self._adopt_from(new):
                self._dirty_groups.add(new.ref.key)
            return
        old = self._pods.pop(new.uid, None)
        if old is not None:
            self._unindex(old)
        if not deleted and new.active:
            self._pods[new.uid] = new
            if new.node:
                self._pods_on[new.node].add(new.uid)
            for c in new.claims:
                self._pods_of_claim[(new.namespace, c)].add(new.uid)
            if new.ref:
                self._members[new.ref.key].add(new.uid)
                self._dirty_groups.add(new.ref.key)
                self._adopt_from(new)
            if new.node:
                self._dirty_nodes.add(new.node)
            elif new.uid in self._assumed:  # its claims may have come: what it adds moves
                self._dirty_nodes.add(self._assumed[new.uid][0])

    def _unindex(self, p: PodFacts) -> None:
        if p.node:
            _drop(self._pods_on, p.node, p.uid)
            self._dirty_nodes.add(p.node)
        for c in p.claims:
            _drop(self._pods_of_claim, (p.namespace, c), p.uid)
        if p.ref:
            _drop(self._members, p.ref.key, p.uid)
            self._dirty_groups.add(p.ref.key)

    def _adopt_from(self, p: PodFacts) -> bool:
        """The decision ``p`` carries for its own group, if any: the oldest
        decision for a group wins, so two replicas that raced end up
        agreeing. True if it was taken."""
        d = p.decision
        if d is None or p.ref is None or d.group != p.ref.key:
            return False
        mine = self.view.decisions.get(d.group)
        if mine is None or (d.decided_at, d.domain) < (mine.decided_at, mine.domain) or \
                (d.decided_at == mine.decided_at and d.expires_at > mine.expires_at):
            self.view.decisions[d.group] = d
            return True
        return False

    def relist(self, kind: str, items: list[dict[str, Any]]) -> None:
        """A fresh LIST of ``kind``: every item applied, and what the list
        no longer has deleted."""
        apply = self._handlers[kind]
        with self.lock:
            seen = {_ident(kind, o) for o in items}
            for gone in self.names(kind) - seen:
                apply("DELETED", _stub(kind, gone))
            for o in items:
                apply("ADDED", o)
            self.synced.add(kind)

    # --- decisions -----------------------------------------------------------------

    def decide(self, d: Decision) -> bool:
        """Record our decision for a group; True if its domain changed (to persist)."""
        with self.lock:
            old = self.view.decisions.get(d.group)
            self.view.decisions[d.group] = d
            moved = old is None or (old.tier, old.domain) != (d.tier, d.domain)
            if moved or (old is not None and not old.live(d.decided_at)):
                self.view.forget()  # a renewal alone changes no layout
            return moved

    # --- the view ------------------------------------------------------------------

    def _node_state(self, name: str) -> NodeState | None:
        f = self._nodes.get(name)
        if f is None:
            self.demands.move_profile(self._profile_of.pop(name, None), None)
            return None
        shaped = [(u, shape) for s in self._slices_of.get(name, ())
                  for (d, u), shape in zip(self._slices[s].units, self._slices[s].shapes,
                                           strict=True)
                  if self._device.get((self._slices[s].driver, self._slices[s].pool, d),
                                      ("", ""))[0] == name]
        units = {u for u, _ in shaped}
        new = profile(shaped) if shaped else None
        self.demands.move_profile(self._profile_of.pop(name, None), new)
        if new is not None:
            self._profile_of[name] = new
        used_units: set[str] = set()
        shared: dict[str, list[int]] = {}  # shareable unit -> what its shares consumed
        for key in self._claims_on.get(name, ()):
            c = self._claims.get(key)
            for i, dev in enumerate(c.devices if c else ()):
                where = self._device.get(dev)
                if where is not None and where[0] == name:
                    used_units.add(where[1])
                    if c is not None and i < len(c.consumed) and c.consumed[i]:
                        shared.setdefault(where[1], []).append(c.consumed[i])
        sizes = {u: b for u, shape in shaped if (b := share_bytes(shape)) is not None}
        extra = sum(self._unallocated(self._pods[uid]) for uid in self._pods_on.get(name, ()))
        # an assumed pod's claims are allocated (the scheduler's PreBind) before
        # it shows bound: those units count where the claims are, not twice
        extra += sum(self._unallocated(self._pods[uid]) for uid, (n, _) in self._assumed.items()
                     if n == name and uid in self._pods)
        return NodeState(name, f.path, capacity=len(units) + f.extended,
                         used=len(used_units) + extra, profile=f.profile,
                         partitioned=any(u.startswith(COUNTERS) for u in units),
                         rooms=tuple(room(sizes[u], got) for u, got in sorted(shared.items())
                                     if u in sizes),
                         share_unit=min((b for u, b in sizes.items() if u not in used_units),
                                        default=0))

    def _unallocated(self, p: PodFacts) -> int:
        """What the pod needs that no allocated claim of it counts yet."""
        allocated = sum(1 for c in p.claims if (p.namespace, c) in self._claims
                        for d in self._claims[(p.namespace, c)].devices if d in self._device)
        plugin = self._extended_of(p)[0]
        return max(0, self._demand(p) - plugin - allocated) + plugin

    def _extended_of(self, p: PodFacts) -> tuple[int, tuple[Request, ...]]:
        """Its extended resources: (from a device plugin, as a claim of a class)."""
        seen = p.extended_claim is not None and (p.namespace, p.extended_claim) in self._claims
        return extended_demand(p.resources, self.demands.resources, self._extended,
                               bound=p.node is not None, by_claim=p.by_claim, claim_seen=seen)

    def _evaluated(self, p: PodFacts) -> list[Evaluated]:
        """What each of the pod's claims and templates asks, where known, and
        its extended resources that a DeviceClass serves, as a claim would."""
        got = [self.demands.evaluate(claim.requests) for c in p.claims
               if (claim := self._claims.get((p.namespace, c))) is not None]
        got += [self.demands.evaluate(self._templates[(p.namespace, t)]) for t in p.templates
                if (p.namespace, t) in self._templates]
        if as_claim := self._extended_of(p)[1]:
            got.append(self.demands.evaluate(as_claim))
        return got

    def _asks(self, p: PodFacts) -> tuple[int, tuple[int, ...]]:
        """Whole units and memory shares (bytes) the pod asks."""
        got = self._evaluated(p)
        return (self._extended_of(p)[0] + sum(e.count for e in got),
                tuple(b for e in got for b in e.shares))

    def _demand(self, p: PodFacts) -> int:
        """Units the pod takes wherever it goes: its shares packed into
        free units of the smallest shareable size seen (beside other shares
        they may take none: ``asks`` and ``NodeState.needs`` say where)."""
        whole, shares = self._asks(p)
        if not shares:
            return whole
        opened = fresh_units(shares, (), self.demands.share_unit())
        return whole + (len(shares) if opened is None else opened)

    def demand(self, p: PodFacts) -> int:
        with self.lock:
            return self._demand(p)

    def asks(self, p: PodFacts) -> tuple[int, tuple[int, ...]]:
        with self.lock:
            return self._asks(p)

    def demand_notes(self, p: PodFacts) -> tuple[str, ...]:
        """What of the pod's requests could not be decided, and how it counts."""
        with self.lock:
            return tuple(dict.fromkeys(n for e in self._evaluated(p) for n in e.notes))

    def _group(self, key: str) -> Group | None:
        pods = [self._pods[u] for u in sorted(self._members.get(key, ())) if u in self._pods]
        refs = [p.ref for p in pods if p.ref is not None]
        if not refs:
            return None
        first = refs[0]
        members = tuple(Member(p.uid, f"{p.namespace}/{p.name}", self._demand(p),
                               p.ref.role if p.ref else None,
                               p.node or self._assumed.get(p.uid, (None, 0.0))[0],
                               assumed=not p.node and p.uid in self._assumed)
                        for p in pods)
        size = max((r.size for r in refs if r.size is not None), default=None)
        required = next((r.required for r in refs if r.required is not None), None)
        preferred = next((r.preferred for r in refs if r.preferred is not None), None)
        problem = None  # of the objects that say the group's size or level
        if first.pod_group is not None and first.pod_group in self._pod_groups:
            pg_size, pg_level, problem = self._pod_groups[first.pod_group]
            size, required = pg_size or size, required or pg_level
        if first.source == Source.DISAGGREGATED_SET:
            sets = [(pods, bad) for group, pods, bad in self._lws.values() if group == key]
            size = sum(pods for pods, _ in sets) or None
            problem = next((bad for _, bad in sets if bad), None)
        # these pods do not carry their group's size: until its object is seen
        # the members seen so far are not the group (placing them would strand them)
        known = size is not None or first.source not in (Source.DISAGGREGATED_SET,
                                                         Source.POD_GROUP)
        roles = {m.role for m in members}
        shape = Shape.PD if roles & {PREFILL, DECODE} else Shape.WIDE_EP
        return Group(key, first.source, max(size or 0, len(members)), members, required,
                     preferred, shape, size_known=known, problem=problem)

    def snapshot(self) -> View:
        """The view, with what changed since the last call rebuilt. Call
        and use it under ``lock``. The time it takes adds to ``view_seconds``."""
        with self.lock:
            started = time.perf_counter()
            try:
                return self._snapshot()
            finally:
                self.view_seconds += time.perf_counter() - started

    def _snapshot(self) -> View:
        now = self.clock()
        for uid in [u for u, (_, until) in self._assumed.items() if until <= now]:
            self.unassume(uid)
        before: dict[str, NodeState | None] = {}
        self._rebuild_nodes(before)
        if self.demands.generation != self._demand_generation:
            # a class or a kind of node came or went: every pod's demand may move
            self._demand_generation = self.demands.generation
            self._dirty_groups.update(self._members)
            self._dirty_nodes.update(n for n, uids in self._pods_on.items() if uids)
            self._dirty_nodes.update(n for n, _ in self._assumed.values())
            self._rebuild_nodes(before)
        for key in self._dirty_groups:
            g = self._group(key)
            if g is None:
                self.view.groups.pop(key, None)
                self.view.decisions.pop(key, None)
            else:
                self.view.groups[key] = g
        if before or self._dirty_groups:
            self.view.forget(before)
        self._dirty_groups.clear()
        return self.view

    def _rebuild_nodes(self, before: dict[str, NodeState | None]) -> None:
        """The dirty nodes' states; ``before`` gets what each replaced."""
        for name in self._dirty_nodes:
            ns = self._node_state(name)
            old = self.view.nodes.get(name)
            if ns == old:
                continue  # the same object stays: layouts made from it stay valid
            before.setdefault(name, old)
            if ns is None:
                self.view.nodes.pop(name, None)
            else:
                self.view.nodes[name] = ns
        self._dirty_nodes.clear()

    # for list replacement
    def names(self, kind: str) -> set[str]:
        with self.lock:
            return {"nodes": lambda: set(self._nodes), "slices": lambda: set(self._slices),
                    "pods": lambda: set(self._pods),
                    "claims": lambda: {f"{k[0]}/{k[1]}" for k in self._claims},
                    "templates": lambda: {f"{k[0]}/{k[1]}" for k in self._templates},
                    "classes": lambda: set(self.demands.classes),
                    "podgroups": lambda: {f"{k[0]}/{k[1]}" for k in self._pod_groups},
                    "lws": lambda: {f"{k[0]}/{k[1]}" for k in self._lws},
                    }[kind]()
