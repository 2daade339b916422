"""Plain data the placement functions work on: nodes with free
accelerators, groups and their members, and the decisions (promises) the
extender made for groups. The watch code builds these; nothing here does I/O."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from toposerve.scheduler_ext.placement.levels import Domain, domain_of
from toposerve.scheduler_ext.placement.shares import fresh_units
from toposerve.topology.model import DomainPath, Tier


@dataclass(frozen=True)
class NodeState:
    """A node as placement sees it: where it sits and its accelerators."""

    name: str
    path: DomainPath
    capacity: int = 0  # accelerator units published for the node
    used: int = 0  # allocated claims + bound pods whose claims are not allocated yet
    profile: str | None = None  # hardware profile, for the tier costs
    partitioned: bool = False  # its accelerators are published as partitions too
    # shareable units (allowMultipleAllocations) holding shares: the bytes left
    # on each; and the bytes of its smallest shareable unit holding none (0: none)
    rooms: tuple[int, ...] = ()
    share_unit: int = 0

    @property
    def free(self) -> int:
        return max(0, self.capacity - self.used)

    def needs(self, demand: int, shares: Sequence[int]) -> int | None:
        """The units a pod asking ``demand`` whole units and ``shares``
        (bytes) takes here: its shares fill the rooms before opening free
        units. None: a share is larger than any shareable unit here."""
        if not shares:
            return demand
        opened = fresh_units(shares, self.rooms, self.share_unit)
        return None if opened is None else demand + opened

    def domain(self, tier: Tier) -> Domain | None:
        return domain_of(self.path, tier)


class Shape(StrEnum):
    """How a group wants to be laid out."""

    WIDE_EP = "wide-ep"  # one gang: as few NVLink domains as possible
    PD = "pd"  # prefill/decode: decode near prefill by KV-transfer cost


class Source(StrEnum):
    """Which controller's labels named the group."""

    LWS = "lws"
    DISAGGREGATED_SET = "disaggregatedset"
    POD_GROUP = "podgroup"
    TOPOSERVE = "toposerve"


PREFILL, DECODE = "prefill", "decode"
# the most pods a group may have: past it a group is refused at once (its
# size comes from labels any pod author writes, and pending members are laid
# out one by one)
MAX_GROUP_SIZE = 100_000


@dataclass(frozen=True)
class Member:
    """One pod of a group."""

    uid: str
    name: str  # namespace/name
    demand: int  # accelerators it needs, on one node
    role: str | None = None
    node: str | None = None  # bound (spec.nodeName), or assumed there
    assumed: bool = False  # ``node`` is where we scored it best, not yet its binding


@dataclass(frozen=True)
class Group:
    """A group of pods that must (required) or should (preferred) share a
    domain. ``size`` counts pods that do not exist yet (LWS creates its
    workers after the leader); they are assumed to need what the known
    members need most. ``size_known`` is False when only another object
    can say the size (a DisaggregatedSet slice's LeaderWorkerSets, an
    in-tree PodGroup) and the extender has not seen it: ``size`` is then
    just the members seen so far. ``problem``: what of those objects
    cannot be read (a size or level), so that no member is placed."""

    key: str
    source: Source
    size: int
    members: tuple[Member, ...]
    required: Tier | None = None
    preferred: Tier | None = None
    shape: Shape = Shape.WIDE_EP
    size_known: bool = True
    problem: str | None = None

    def member(self, uid: str) -> Member | None:
        return next((m for m in self.members if m.uid == uid), None)

    def bound(self) -> list[Member]:
        return [m for m in self.members if m.node is not None]

    def unknown_demand(self) -> int:
        """What a member not yet created is assumed to need."""
        return max((m.demand for m in self.members), default=0)

    def pending(self, without: str | None = None) -> list[int]:
        """Demands of members not bound yet, including ones not created
        yet; ``without``: leave out this member (the pod being placed)."""
        out = [m.demand for m in self.members if m.node is None and m.uid != without]
        missing = self.size - len(self.members)
        out += [self.unknown_demand()] * max(0, missing)
        return out

    def pending_count(self) -> int:
        """``len(self.pending())`` without laying the list out."""
        return sum(1 for m in self.members if m.node is None) + \
            max(0, self.size - len(self.members))

    def pending_demand(self) -> int:
        """``sum(self.pending())`` without laying the list out."""
        return sum(m.demand for m in self.members if m.node is None) + \
            self.unknown_demand() * max(0, self.size - len(self.members))

    def too_big(self) -> str | None:
        """Why the group is refused whatever the cluster holds, if it is."""
        if self.size > MAX_GROUP_SIZE:
            return (f"group {self.key} has {self.size} pods; no group may have more than "
                    f"{MAX_GROUP_SIZE}")
        return None

    def total_demand(self) -> int:
        return sum(m.demand for m in self.members) + \
            self.unknown_demand() * max(0, self.size - len(self.members))

    def roles(self) -> Counter[str]:
        return Counter(m.role or "" for m in self.members)


@dataclass(frozen=True)
class Decision:
    """The domain the extender promised a group, and until when the
    capacity stays promised if no member of the group comes asking."""

    group: str
    tier: Tier
    domain: Domain
    decided_at: float
    expires_at: float
    required: bool = False
    profiles: tuple[str, ...] = ()  # hardware profiles of the nodes it may use; (): any

    def live(self, now: float) -> bool:
        return now < self.expires_at

    def holds(self, group: Group | None, now: float) -> bool:
        """Whether the promise stands: until it expires unused, and for as
        long as its group is partly placed with pods still waiting (a long
        scheduling queue can keep a member from its turn past the TTL, and
        letting the room go then strands what is bound)."""
        return self.live(now) or (group is not None and any(m.node for m in group.members)
                                  and any(m.node is None for m in group.members))


ROOMS = "rooms"  # View.memo's key of the free room per domain


@dataclass(frozen=True)
class Layout:
    """Where one promise's pending members were laid out, and what from:
    the group, its domain's nodes (their names and states) and what older
    promises held on them. Valid while all of those are the same objects
    and values, so a call re-lays only the promises whose inputs moved."""

    group: Group
    where: tuple[Tier, Domain, tuple[str, ...]]  # the decision's tier, domain, profiles
    source: list[str]  # the domain's nodes as ``View.in_domain`` lists them
    names: tuple[str, ...]  # those of the decision's profiles
    states: tuple[NodeState, ...]
    held: tuple[int, ...]  # per node of ``names``, held by older promises
    mine: dict[str, int]  # node -> accelerators this promise holds there


@dataclass
class View:
    """Everything one decision reads: nodes, groups (by key) and the
    promises made so far."""

    nodes: dict[str, NodeState]
    groups: dict[str, Group] = field(default_factory=dict)
    decisions: dict[str, Decision] = field(default_factory=dict)
    # derived facts, built on first use and kept by ``forget``: ``memo``
    # (reservations) cleared on any change; the rest (a domain's nodes, each
    # node's place, NVLink domain and profile, the widest NVLink domain) moved
    # by the nodes that came, went or changed
    memo: dict[object, object] = field(default_factory=dict)
    index: dict[Tier, dict[Domain, list[str]]] = field(default_factory=dict)
    nvlink: dict[str, str] = field(default_factory=dict)  # node -> its NVLink domain's name
    places: dict[Tier, dict[str, Domain | None]] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)  # node -> its profile ("": none)
    by_profile: dict[str, list[str]] = field(default_factory=dict)  # profile -> its nodes
    # each live promise's layout, checked against its inputs on use (never stale)
    layouts: dict[str, Layout] = field(default_factory=dict)
    widest: int | None = None  # the most accelerators one NVLink domain has (None: not known)
    caps: dict[str, int] = field(default_factory=dict)  # NVLink domain -> its accelerators

    def forget(self, before: Mapping[str, NodeState | None] | None = None) -> None:
        """Some nodes changed (``before``: each as it was; None: it came),
        or members or decisions did: drop what ``memo`` derived, but move
        what is kept per node by the changed nodes alone: the free room per
        domain (``room``), and for a node that came, went or changed place
        its entries in the domain indexes, places and profiles. A domain
        whose node list changed gets a new list, so the promise layouts made
        from the old one are laid out anew, and only those."""
        before = before or {}
        moved = {name: was for name, was in before.items()
                 if (now := self.nodes.get(name)) is None or was is None
                 or (was.path, was.profile) != (now.path, now.profile)}
        for name, was in moved.items():
            self._move(name, was, self.nodes.get(name))
        if self.widest is not None:
            for name, was in before.items():
                now = self.nodes.get(name)
                if name in moved or was is None or now is None or was.capacity != now.capacity:
                    self._recount(was, now)
        rooms = self.memo.get(ROOMS)
        self.memo.clear()
        if not isinstance(rooms, dict):
            return
        for name, old in before.items():
            new = self.nodes.get(name)
            for (tier, profiles), by_domain in rooms.items():
                for ns, sign in ((old, -1), (new, 1)):
                    d = None if ns is None else ns.domain(tier)
                    if ns is None or d is None:
                        continue
                    counted = not profiles or (ns.profile or "") in profiles
                    by_domain[d] = by_domain.get(d, 0) + (sign * ns.free if counted else 0)
                if old is not None and (d := old.domain(tier)) is not None and \
                        d not in self.index.get(tier, {}):
                    by_domain.pop(d, None)  # its last node left
        self.memo[ROOMS] = rooms

    def _move(self, name: str, was: NodeState | None, now: NodeState | None) -> None:
        """``name`` came (``was`` None), went (``now`` None) or changed place
        or profile: its entries in whatever of the indexes is built."""
        for tier, index in self.index.items():
            old = None if was is None else was.domain(tier)
            new = None if now is None else now.domain(tier)
            if old == new:
                continue
            if old is not None:
                left = [n for n in index.get(old, []) if n != name]
                if left:
                    index[old] = left
                else:
                    index.pop(old, None)
            if new is not None:
                index[new] = sorted([*index.get(new, []), name])
        for tier, place in self.places.items():
            if now is None:
                place.pop(name, None)
            else:
                place[name] = now.domain(tier)
        self.nvlink.pop(name, None)
        if self.kinds:
            if (kind := self.kinds.pop(name, None)) is not None and kind in self.by_profile:
                if left := [n for n in self.by_profile[kind] if n != name]:
                    self.by_profile[kind] = left
                else:
                    del self.by_profile[kind]
            if now is not None:
                kind = self.kinds[name] = now.profile or ""
                if self.by_profile:
                    self.by_profile[kind] = [*self.by_profile.get(kind, []), name]

    def _recount(self, was: NodeState | None, now: NodeState | None) -> None:
        """Keep ``widest`` by the accelerators of each NVLink domain."""
        for ns, sign in ((was, -1), (now, 1)):
            if ns is not None:
                sub = _subdomain_of(ns)
                self.caps[sub] = self.caps.get(sub, 0) + sign * ns.capacity
                if not self.caps[sub]:
                    del self.caps[sub]
        self.widest = max(self.caps.values(), default=0)

    def profile_of(self) -> dict[str, str]:
        """Each node's hardware profile ("" when unlabelled); like ``place``,
        changes only with the node's labels."""
        if not self.kinds and self.nodes:
            self.kinds.update((name, n.profile or "") for name, n in self.nodes.items())
        return self.kinds

    def of_profile(self) -> dict[str, list[str]]:
        """The nodes of each hardware profile ("": unlabelled), kept as long as
        ``profile_of``."""
        got = self.by_profile
        if not got and self.nodes:
            for name, kind in self.profile_of().items():
                got.setdefault(kind, []).append(name)
        return got

    def room(self, tier: Tier, profiles: tuple[str, ...]) -> dict[Domain, int]:
        """Free accelerators per domain of ``tier``, over its nodes of
        ``profiles`` (all when empty). Lives in ``memo`` (a ``memo.clear()``
        rebuilds it) but survives ``forget``: a group picking its domain
        reads every domain's room, and a call that changed a few nodes
        should not cost a pass over all of them."""
        rooms = self.memo.setdefault(ROOMS, {})
        assert isinstance(rooms, dict)
        got = rooms.get((tier, profiles))
        if got is None:
            self.in_domain(tier, ())  # builds the index
            got = {d: self._room(tier, d, profiles) for d in self.index[tier]}
            rooms[(tier, profiles)] = got
        return got

    def _room(self, tier: Tier, domain: Domain, profiles: tuple[str, ...]) -> int:
        total = 0
        for n in self.in_domain(tier, domain):
            ns = self.nodes[n]
            if not profiles or (ns.profile or "") in profiles:
                total += ns.free
        return total

    def place(self, tier: Tier) -> dict[str, Domain | None]:
        """Each node's domain at ``tier`` (a node's path only changes with
        its labels, so this lives as long as ``index``)."""
        got = self.places.get(tier)
        if got is None:
            got = {name: n.domain(tier) for name, n in self.nodes.items()}
            self.places[tier] = got
        return got

    def subdomain(self, node: str) -> str:
        """The node's NVLink domain as one name (the node itself when unknown)."""
        name = self.nvlink.get(node)
        if name is None:
            name = self.nvlink[node] = _subdomain_of(self.nodes[node])
        return name

    def widest_subdomain(self) -> int:
        """The most accelerators any one NVLink domain has (``subdomain``),
        free or not: no group of ``n`` fits in fewer than ``n / widest`` of
        them. Lives as long as ``place``, and until a node's capacity moves."""
        if self.widest is None:
            caps: dict[str, int] = defaultdict(int)
            for n in self.nodes.values():
                caps[_subdomain_of(n)] += n.capacity
            self.caps = {k: v for k, v in caps.items() if v}
            self.widest = max(self.caps.values(), default=0)
        return self.widest

    def in_domain(self, tier: Tier, domain: Domain) -> list[str]:
        """Names of the nodes in ``domain`` at ``tier``."""
        index = self.index.get(tier)
        if index is None:
            index = {}
            for name in sorted(self.nodes):
                if (d := self.nodes[name].domain(tier)) is not None:
                    index.setdefault(d, []).append(name)
            self.index[tier] = index
        return index.get(domain, [])


def _subdomain_of(n: NodeState) -> str:
    key = n.domain(Tier.NVLINK)
    return "/".join(str(v) for v in key) if key is not None else n.name
