"""Plain data the placement functions work on: nodes with free
accelerators, groups and their members, and the decisions (promises) the
extender made for groups. The watch code builds these; nothing here does I/O."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum

from scheduler_ext.placement.levels import Domain, domain_of
from topology.model import DomainPath, Tier


@dataclass(frozen=True)
class NodeState:
    """A node as placement sees it: where it sits and its accelerators."""

    name: str
    path: DomainPath
    capacity: int = 0  # accelerator units published for the node
    used: int = 0  # allocated claims + bound pods whose claims are not allocated yet
    profile: str | None = None  # hardware profile, for the tier costs

    @property
    def free(self) -> int:
        return max(0, self.capacity - self.used)

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
    members need most."""

    key: str
    source: Source
    size: int
    members: tuple[Member, ...]
    required: Tier | None = None
    preferred: Tier | None = None
    shape: Shape = Shape.WIDE_EP

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


@dataclass
class View:
    """Everything one decision reads: nodes, groups (by key) and the
    promises made so far."""

    nodes: dict[str, NodeState]
    groups: dict[str, Group] = field(default_factory=dict)
    decisions: dict[str, Decision] = field(default_factory=dict)
    # derived facts, cleared by whoever changes what they derive from:
    # ``memo`` (reservations) on any change, ``index`` (nodes by domain) when
    # a node comes, goes or moves
    memo: dict[object, object] = field(default_factory=dict)
    index: dict[Tier, dict[Domain, list[str]]] = field(default_factory=dict)
    nvlink: dict[str, str] = field(default_factory=dict)  # node -> its NVLink domain's name

    def forget_places(self) -> None:
        """Nodes came, went or moved: drop what was derived from their paths."""
        self.index.clear()
        self.nvlink.clear()

    def subdomain(self, node: str) -> str:
        """The node's NVLink domain as one name (the node itself when unknown)."""
        name = self.nvlink.get(node)
        if name is None:
            n = self.nodes[node]
            key = n.domain(Tier.NVLINK)
            name = "/".join(str(v) for v in key) if key is not None else n.name
            self.nvlink[node] = name
        return name

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
