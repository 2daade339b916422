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
    # derived facts, cleared by whoever changes what they derive from:
    # ``memo`` (reservations) on any change (``forget``), ``index`` (nodes by domain) when
    # a node comes, goes or moves
    memo: dict[object, object] = field(default_factory=dict)
    index: dict[Tier, dict[Domain, list[str]]] = field(default_factory=dict)
    nvlink: dict[str, str] = field(default_factory=dict)  # node -> its NVLink domain's name
    places: dict[Tier, dict[str, Domain | None]] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)  # node -> its profile ("": none)
    by_profile: dict[str, list[str]] = field(default_factory=dict)  # profile -> its nodes
    # each live promise's layout, checked against its inputs on use (never stale)
    layouts: dict[str, Layout] = field(default_factory=dict)
    widest: int | None = None  # the most accelerators one NVLink domain has (None: not known)

    def forget_places(self) -> None:
        """Nodes came, went or moved: drop what was derived from their paths."""
        self.index.clear()
        self.nvlink.clear()
        self.places.clear()
        self.kinds.clear()
        self.by_profile.clear()
        self.memo.clear()
        self.widest = None

    def forget(self, before: Mapping[str, NodeState | None] | None = None) -> None:
        """Free counts of some nodes (not their places), members or decisions
        changed: drop what ``memo`` derived, but keep the free room per domain
        (``room``), moved by each changed node's difference; ``before``: the
        changed nodes as they were."""
        for name, was in (before or {}).items():
            now = self.nodes.get(name)
            if was is None or now is None or was.capacity != now.capacity:
                self.widest = None
        rooms = self.memo.get(ROOMS)
        self.memo.clear()
        if not isinstance(rooms, dict):
            return
        for name, old in (before or {}).items():
            new = self.nodes.get(name)
            if old is None or new is None or old.profile != new.profile:
                return  # rebuilt when next asked for
            if delta := new.free - old.free:
                for (tier, profiles), by_domain in rooms.items():
                    d = self.place(tier).get(name)
                    if d is not None and (not profiles or (new.profile or "") in profiles):
                        by_domain[d] = by_domain.get(d, 0) + delta
        self.memo[ROOMS] = rooms

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
            n = self.nodes[node]
            key = n.domain(Tier.NVLINK)
            name = "/".join(str(v) for v in key) if key is not None else n.name
            self.nvlink[node] = name
        return name

    def widest_subdomain(self) -> int:
        """The most accelerators any one NVLink domain has (``subdomain``),
        free or not: no group of ``n`` fits in fewer than ``n / widest`` of
        them. Lives as long as ``place``, and until a node's capacity moves."""
        if self.widest is None:
            sums: dict[str, int] = defaultdict(int)
            for name, n in self.nodes.items():
                sums[self.subdomain(name)] += n.capacity
            self.widest = max(sums.values(), default=0)
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
