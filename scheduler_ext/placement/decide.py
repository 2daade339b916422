"""The extender's decisions as pure functions over a ``View``.

- The first member of a group to be filtered picks a domain at the asked
  level that has room for the *whole* group (members placed, pending, and
  not yet created); the group is then held there, and the capacity it still
  needs is promised to it (other groups see it as taken) until the promise
  expires unused.
- Among domains that fit: fewest NVLink domains, then least left over
  (best fit), so big domains stay free for big groups.
- A preferred level climbs one level at a time when nothing fits; a
  required level never does.
- Decode members score nodes by modelled KV-transfer time from their
  slice's prefill members, over the tier ``toposerve.topology.transfer``
  gives (the router's too).
- Pods outside any group go anywhere but onto accelerators promised to a
  group (else a rack a slice was promised fills with single-GPU pods
  between its members' turns, and the slice splits); those asking
  accelerators are packed best fit, and counted where they were scored.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from enum import StrEnum

from toposerve.scheduler_ext.placement import pack
from toposerve.scheduler_ext.placement.levels import (
    Domain,
    climb,
    contains,
    display,
    level_name,
)
from toposerve.scheduler_ext.placement.model import (
    DECODE,
    PREFILL,
    Decision,
    Group,
    Layout,
    Shape,
    Source,
    View,
)
from toposerve.topology.distance import transfer_seconds
from toposerve.topology.model import Tier, TierLink
from toposerve.topology.transfer import NO_DEVICES, transfer

MAX_SCORE = 10


@dataclass(frozen=True)
class Policy:
    promise_ttl_s: float = 120.0
    default_preferred: Tier = Tier.NVLINK
    kv_bytes: int = 8 * 2**30  # one request's KV cache, for the transfer-cost model
    links: Callable[[str | None], dict[Tier, TierLink]] | None = None  # profile -> tier costs
    pack_ungrouped: bool = True  # pods of no group: best fit (``prioritize_ungrouped``)
    # the scheduler offers a sample of the feasible nodes (percentageOfNodesToScore
    # below 100): a node not offered may still be feasible (``_unoffered_room``)
    sampled: bool = False


class Outcome(StrEnum):
    """Why a filter call ended as it did (the metrics' reason label)."""

    PASS_THROUGH = "pass-through"  # not in a group
    KEPT_OFF = "kept-off"  # not in a group, and some nodes' free room is promised to one
    HELD = "held"  # a member of a group that has its domain
    DECIDED = "decided"  # this call chose the group's domain
    CLIMBED = "climbed"  # the preferred level was full; one level up
    NO_FIT = "no-fit"  # the whole group fits no domain
    BAD_METADATA = "bad-metadata"  # the group's labels cannot be read
    SIZE_UNKNOWN = "size-unknown"  # the object that says the group's size is not seen yet


@dataclass
class FilterResult:
    passed: list[str]
    failed: dict[str, str] = field(default_factory=dict)
    decision: Decision | None = None  # the group's decision after this call (new or renewed)
    outcome: Outcome = Outcome.PASS_THROUGH
    # no domain could hold the group even empty: preempting pods would not help
    unresolvable: bool = False


def _subdomain(view: View, node: str) -> str:
    return view.subdomain(node)


def _nodes(view: View, tier: Tier, domain: Domain, profiles: Iterable[str]) -> list[str]:
    allowed = set(profiles)
    return [n for n in view.in_domain(tier, domain)
            if not allowed or (view.nodes[n].profile or "") in allowed]


def reservations(view: View, now: float, exclude: str | None = None) -> dict[str, int]:
    """Accelerators promised, per node, to the pending members of every
    live decision but ``exclude``'s."""
    out: dict[str, int] = defaultdict(int)
    for group, nodes in _promised(view, now).items():
        if group != exclude:
            for n, d in nodes.items():
                out[n] += d
    return dict(out)


def _promised(view: View, now: float) -> dict[str, dict[str, int]]:
    """Per live decision, where its pending members are laid out. Older
    promises are laid out first, so a newer one never takes what an older
    one holds. Memoized until the view changes (or the second turns); a
    promise whose group, nodes and older holds are as they were keeps its
    layout (``View.layouts``), so a call re-lays only what moved."""
    key = ("promised", now // 1)
    memo = view.memo.get(key)
    if isinstance(memo, dict):
        return memo
    reserved: dict[str, int] = defaultdict(int)
    out: dict[str, dict[str, int]] = {}
    layouts: dict[str, Layout] = {}
    for d in sorted(view.decisions.values(), key=lambda d: (d.decided_at, d.group)):
        group = view.groups.get(d.group)
        if group is None or not d.holds(group, now) or group.too_big() or group.problem:
            continue
        lay = _layout(view, group, d, reserved)
        for n, held in lay.mine.items():
            reserved[n] += held
        layouts[d.group] = lay
        out[d.group] = lay.mine
    view.layouts = layouts
    view.memo[key] = out
    return out


def _layout(view: View, group: Group, d: Decision, reserved: dict[str, int]) -> Layout:
    where = (d.tier, d.domain, d.profiles)
    source = view.in_domain(d.tier, d.domain)  # the same list while the index lives
    old = view.layouts.get(d.group)
    if old is not None and old.group is group and old.where == where and \
            old.source is source and \
            all(view.nodes.get(n) is s and reserved.get(n, 0) == r
                for n, s, r in zip(old.names, old.states, old.held, strict=True)):
        return old
    names = tuple(_nodes(view, d.tier, d.domain, d.profiles))
    states = tuple(view.nodes[n] for n in names)
    held = tuple(reserved.get(n, 0) for n in names)
    free = {n: max(0, s.free - r) for n, s, r in zip(names, states, held, strict=True)}
    pending = group.pending()
    placed = pack.plan(pending, free, {n: _subdomain(view, n) for n in names},
                       _bound_subdomains(view, group)) if pending else None
    # a promise that no longer fits whole still holds what it can
    assignment = placed.assignment if placed else _greedy(pending, free)
    mine: dict[str, int] = defaultdict(int)
    for demand, n in assignment:
        if n is not None:
            mine[n] += demand
    return Layout(group, where, source, names, states, held, dict(mine))


def _greedy(demands: list[int], free: dict[str, int]) -> pack.Assignment:
    left = dict(free)
    out: pack.Assignment = []
    for d in sorted(demands, reverse=True):
        fit = pack.best_fit([d], left)
        if fit:
            node = fit[0][1]
            if node is not None:
                left[node] -= d
            out.append(fit[0])
    return out


def _bound_subdomains(view: View, group: Group) -> frozenset[str]:
    return frozenset(_subdomain(view, m.node) for m in group.bound() if m.node in view.nodes)


def _free(view: View, names: Iterable[str], reserved: dict[str, int]) -> dict[str, int]:
    return {n: max(0, view.nodes[n].free - reserved.get(n, 0)) for n in names if n in view.nodes}


def _rooms(view: View, tier: Tier, profiles: tuple[str, ...],
           reserved: dict[str, int]) -> dict[Domain, int]:
    """Per domain of ``tier``, ``sum(_free(view, _nodes(...), reserved).values())``
    without a pass over every node: the room kept per domain, less what the
    reserved nodes lose (``max(0, f - r) == f - min(f, r)``)."""
    rooms = dict(view.room(tier, profiles))
    place = view.place(tier)
    for n, r in reserved.items():
        ns = view.nodes.get(n)
        if r > 0 and ns is not None and (d := place.get(n)) is not None and \
                (not profiles or (ns.profile or "") in profiles):
            rooms[d] -= min(ns.free, r)
    return rooms


def _name(dom: Domain) -> tuple[str, ...]:
    """A domain's order by name (a node-level domain may lack its NVLink part)."""
    return dom if None not in dom else tuple(v or "" for v in dom)  # type: ignore[return-value]


def _by_left_then_name(by_left: dict[int, list[Domain]]) -> Iterator[tuple[tuple[str, ...],
                                                                        Domain]]:
    """The domains in (left over, name) order, each with its name, named
    and sorted a left-over value at a time: the search mostly stops in the
    first, so naming every domain of a 5,000-node view is not paid."""
    for left in sorted(by_left):
        yield from sorted((_name(dom), dom) for dom in by_left[left])


@dataclass(frozen=True)
class _Pick:
    tier: Tier
    domain: Domain
    plan: pack.Plan


def _choose(view: View, group: Group, offered: AbstractSet[str], reserved: dict[str, int],
            levels: list[Tier], inside: Domain | None, profiles: tuple[str, ...]) -> _Pick | None:
    """The best domain for the whole group: the first level of ``levels``
    where one fits; at that level fewest NVLink domains, then least left
    over, then name. A domain qualifies when it holds one of the
    ``offered`` nodes or the group's placed members. ``inside``: the new
    domain must contain this one."""
    bound = [m.node for m in group.bound() if m.node in view.nodes]
    need = group.pending_demand()
    pending: list[int] | None = None  # laid out once a domain has room for them all
    prefer = _bound_subdomains(view, group)
    # no plan uses fewer NVLink domains than this: the first plan that does
    # (in left-over order) ranks best, and the domains after it need none
    fewest = max(1, -(-need // max(1, view.widest_subdomain())))
    for tier in levels:
        place = view.place(tier)
        pins = {place.get(b) for b in bound}
        if None in pins or len(pins) > 1:
            continue  # the placed members share no domain at this level
        # a plan leaves exactly (free - need) over and uses at least ``fewest``
        # NVLink domains, so in (left over, name) order the first plan using
        # that few ranks best and the rest (hundreds of racks) need no plan;
        # whether a domain holds an offered node is asked in that order too
        # (a pass over 5,000 offered nodes' domains cost more than the rest)
        by_left: dict[int, list[Domain]] = defaultdict(list)
        for dom, room in _rooms(view, tier, profiles, reserved).items():
            if (left := room - need) >= 0 and (not pins or dom in pins) and \
                    (inside is None or contains(dom, inside)):
                by_left[left].append(dom)
        best: tuple[tuple[int, int, tuple[str, ...]], _Pick] | None = None
        for name, dom in _by_left_then_name(by_left):
            if not pins and not any(n in offered for n in view.in_domain(tier, dom)):
                continue
            free = _free(view, _nodes(view, tier, dom, profiles), reserved)
            pending = group.pending() if pending is None else pending
            got = pack.plan(pending, free, {n: _subdomain(view, n) for n in free}, prefer)
            if got is None:
                continue
            rank = (len(got.subdomains), got.leftover, name)
            if best is None or rank < best[0]:
                best = (rank, _Pick(tier, dom, got))
            if len(got.subdomains) <= fewest:
                break
        if best is not None:
            return best[1]
    return None


def _profiles(view: View, offered: AbstractSet[str]) -> tuple[str, ...]:
    """The hardware profiles of the ``offered`` nodes: per profile, whether
    any of its nodes is offered (the first one usually is), rather than a
    pass over 5,000 offered nodes."""
    return tuple(sorted(kind for kind, names in view.of_profile().items()
                        if any(n in offered for n in names)))


def _largest(view: View, tier: Tier, reserved: dict[str, int] | None,
             profiles: tuple[str, ...]) -> int:
    """The most accelerators one domain of ``tier`` has free (after
    ``reserved``), or has at all (``reserved`` None)."""
    sums: dict[Domain, int] = defaultdict(int)
    allowed = set(profiles)
    for n in view.nodes.values():
        d = n.domain(tier)
        if d is not None and (not allowed or (n.profile or "") in allowed):
            sums[d] += n.capacity if reserved is None else \
                max(0, n.free - reserved.get(n.name, 0))
    return max(sums.values(), default=0)


def _levels(group: Group, policy: Policy) -> list[Tier]:
    if group.required is not None:
        return [group.required]
    return climb(group.preferred if group.preferred is not None else policy.default_preferred)


def _no_fit_reason(view: View, group: Group, reserved: dict[str, int], levels: list[Tier],
                   profiles: tuple[str, ...]) -> str:
    pods = group.pending_count()
    need = group.pending_demand()
    where = level_name(levels[0]) if len(levels) == 1 else \
        f"{level_name(levels[0])} (nor any wider domain)"
    most = _largest(view, levels[0], reserved, profiles)
    return (f"group {group.key} needs {need} accelerators for {pods} pods in one {where}; "
            f"the most free in one {level_name(levels[0])} is {most}: waiting, no pod placed "
            "until the whole group fits")


def _size_unknown_reason(group: Group) -> str:
    owner = {Source.DISAGGREGATED_SET: "the slice's LeaderWorkerSets (one per role)",
             Source.POD_GROUP: "its PodGroup"}.get(group.source, "its owner object")
    return (f"group {group.key}: its size is not known yet ({owner} not seen; "
            f"{len(group.members)} pods so far): waiting, no pod placed until it is")


def filter_ungrouped(view: View, demand: int, candidates: list[str], now: float,
                     shares: Sequence[int] = ()) -> FilterResult:
    """Which candidate nodes a pod of no group, asking ``demand``
    accelerators and ``shares`` (bytes of memory shares), may go to: any
    whose free accelerators past what live promises hold there still cover
    what it takes there (shares that fit beside other shares take none;
    whether the pod fits at all is the scheduler's to say)."""
    if demand <= 0 and not shares:
        return FilterResult(candidates)
    promised = _promised(view, now)
    held = reservations(view, now)
    short = {n: (ns.free, h) for n, h in held.items()
             if (ns := view.nodes.get(n)) is not None
             and ns.free - h < (ns.needs(demand, shares) or 0)}
    if not short:  # most calls: a pass over the few promised nodes only
        return FilterResult(candidates)
    passed: list[str] = []
    failed: dict[str, str] = {}
    for c in candidates:
        if c in short:
            free, h = short[c]
            groups = sorted(g for g, nodes in promised.items() if c in nodes)
            failed[c] = (f"{h} of the {free} free accelerators here are promised to "
                         f"the pending pods of group {', '.join(groups)}")
        else:
            passed.append(c)
    return FilterResult(passed, failed, outcome=Outcome.KEPT_OFF if failed else
                        Outcome.PASS_THROUGH)


def filter_member(view: View, group: Group, uid: str, candidates: list[str], policy: Policy,
                  now: float) -> FilterResult:
    """Which candidate nodes member ``uid`` of ``group`` may go to."""
    member = group.member(uid)
    assert member is not None, "the pod being placed must be a member of its group"
    if group.problem is not None:  # its PodGroup or LeaderWorkerSets say it wrongly
        return FilterResult([], dict.fromkeys(candidates, f"cannot place the pod's group: "
                                                          f"{group.problem}"),
                            None, Outcome.BAD_METADATA, unresolvable=True)
    if (too_big := group.too_big()) is not None:
        return FilterResult([], dict.fromkeys(candidates, too_big), None, Outcome.NO_FIT,
                            unresolvable=True)
    reserved = reservations(view, now, exclude=group.key)
    decision = view.decisions.get(group.key)
    outcome = Outcome.HELD
    if (decision is None or not decision.holds(group, now)) and not group.size_known and \
            not group.bound():
        # a domain chosen for part of the group could strand the rest: hold all
        return FilterResult([], dict.fromkeys(candidates, _size_unknown_reason(group)), None,
                            Outcome.SIZE_UNKNOWN, unresolvable=True)
    if decision is None or not decision.holds(group, now):
        offered = {*candidates, *(m.node for m in group.bound() if m.node)}
        profiles = _profiles(view, offered)
        levels = _levels(group, policy)
        pick = _choose(view, group, offered, reserved, levels, None, profiles)
        if pick is None:
            reason = _no_fit_reason(view, group, reserved, levels, profiles)
            never = group.total_demand() > _largest(view, levels[-1], None, profiles)
            return FilterResult([], dict.fromkeys(candidates, reason), None, Outcome.NO_FIT,
                                unresolvable=never)
        decision = Decision(group.key, pick.tier, pick.domain, now, now + policy.promise_ttl_s,
                            required=group.required is not None, profiles=profiles)
        outcome = Outcome.DECIDED
    else:
        decision = replace(decision, expires_at=now + policy.promise_ttl_s)
    while True:
        passed, failed = _check(view, group, member.uid, member.demand, candidates, decision,
                                reserved)
        if passed or decision.required or decision.tier >= Tier.BEYOND:
            break
        # pods in flight (scored, not bound yet: the group's own anywhere, any
        # group's in its domain) make the free counts unsure: wait for their
        # bindings (the scheduler retries) rather than widen the group for nothing
        if any(m.assumed for m in group.members) or _in_flight(view, decision):
            break
        if policy.sampled and _unoffered_room(view, group, member.demand, candidates,
                                              decision, reserved):
            break  # a sample without the domain's free nodes: the next try may have them
        pick = _choose(view, group, {*candidates, *(m.node for m in group.bound() if m.node)},
                       reserved, climb(Tier(decision.tier + 1)), decision.domain,
                       decision.profiles)
        if pick is None:
            break
        decision = replace(decision, tier=pick.tier, domain=pick.domain)
        outcome = Outcome.CLIMBED
    return FilterResult(passed, failed, decision, outcome)


def _unoffered_room(view: View, group: Group, demand: int, candidates: list[str],
                    decision: Decision, reserved: dict[str, int]) -> bool:
    """Whether the decided domain still holds every pending member by the
    extender's own count, on a node with room for this one that was not
    among the ``candidates``: with a sampling scheduler, that node was most
    likely left out of this attempt's sample, not found infeasible, and
    climbing would split the group for nothing."""
    names = _nodes(view, decision.tier, decision.domain, decision.profiles)
    free = _free(view, names, reserved)
    offered = set(candidates)
    return any(f >= demand and n not in offered for n, f in free.items()) and \
        pack.fits(group.pending(), free)


def _in_flight(view: View, decision: Decision) -> bool:
    """Whether a member of any group is assumed on a node of the decision's domain."""
    place = view.place(decision.tier)
    return any(m.assumed and m.node is not None and place.get(m.node) == decision.domain
               for g in view.groups.values() for m in g.members)


def _check(view: View, group: Group, uid: str, demand: int, candidates: list[str],
           decision: Decision, reserved: dict[str, int]) -> tuple[list[str], dict[str, str]]:
    names = _nodes(view, decision.tier, decision.domain, decision.profiles)
    base = _free(view, names, reserved)
    rest = group.pending(without=uid)
    where = display(decision.domain, decision.tier)
    outside = f"group {group.key} is held to {where}, where the whole group fits"
    promised = "the free accelerators here are promised to another group"
    crowded = (f"group {group.key}: a member here would leave too little room in {where} "
               f"for the other {len(rest)} pending members")
    # every offered node fails as outside the domain, then the few inside are
    # looked at (``failed`` doubles as the set of offered nodes)
    failed = dict.fromkeys(candidates, outside)
    passed: list[str] = []
    memo: dict[int, bool] = {}
    for c in names:
        if c not in failed:
            continue
        f = base.get(c, 0)
        if f < demand:
            failed[c] = promised
            continue
        if demand > 0:
            if f not in memo:
                trial = dict(base)
                trial[c] = f - demand
                memo[f] = pack.fits(rest, trial)
            if not memo[f]:
                failed[c] = crowded
                continue
        del failed[c]
        passed.append(c)
    return passed, failed


def neutral() -> dict[str, int]:
    """No opinion: every node scores 0 (nodes left out of a score map score 0)."""
    return {}


KV_WEIGHT = 0.7  # P/D members: KV-transfer cost first, packing breaks its ties


def prioritize_member(view: View, group: Group, uid: str, candidates: list[str],
                      policy: Policy, now: float) -> dict[str, int]:
    """Scores 0..10 toward the nodes the group's plan packs it into (the
    NVLink domains it already uses first); for P/D members with placed
    peers of the other role, mostly by modelled KV-transfer time from the
    nearest peer. Exactly one node scores 10 (the member's own place in
    the plan), so the scheduler's pick is predictable (see ``top``)."""
    decision = view.decisions.get(group.key)
    member = group.member(uid)
    if decision is None or member is None or not decision.holds(group, now) or \
            group.too_big() or group.problem:
        return neutral()
    names = _nodes(view, decision.tier, decision.domain, decision.profiles)
    offered = set(candidates)
    candidates = [n for n in names if n in offered]  # outside the domain: 0
    # P/D: a member goes where its role is scarce, so the other role can
    # land beside it (prefill and decode on one node move KV over NVLink)
    crowd: Counter[str] = Counter(m.node for m in group.members if m.node and m.uid != uid
                                  and group.shape == Shape.PD and m.role == member.role)
    raw, own = _pack_scores(view, group, member.demand, names, candidates, now, crowd)
    if group.shape == Shape.PD and member.role in (PREFILL, DECODE) and policy.links:
        other = DECODE if member.role == PREFILL else PREFILL
        peers = [m.node for m in group.members if m.role == other and m.node in view.nodes]
        if peers:
            kv = _kv_scores(view, peers, candidates, set(names), policy)
            raw = {c: KV_WEIGHT * kv[c] + (1 - KV_WEIGHT) * raw[c] for c in candidates}
    if not candidates:
        return {}
    best = max(candidates, key=lambda c: (raw[c], c == own))
    # the member's own slot stands well above the rest, so that the
    # scheduler's other scores rarely outvote it and the assumption holds
    scores = {c: min(MAX_SCORE - 4, round(raw[c])) for c in candidates if raw[c] > 0}
    if raw[best] > 0:
        scores[best] = MAX_SCORE
    return scores


def prioritize_ungrouped(view: View, demand: int, candidates: list[str], policy: Policy,
                         now: float, shares: Sequence[int] = ()) -> dict[str, int]:
    """A pod of no group asking ``demand`` accelerators (and ``shares``,
    bytes of memory shares: beside other shares before a free unit, at
    equal room left): the one candidate
    it leaves least free, past what is promised there (then the one in the
    rack with least free), scores 10 and the rest 0. Partly used nodes and
    racks fill first, so whole ones stay free for groups; and the pod is
    assumed there (``top``), so a group deciding before it binds sees it.
    Nodes with partitions come last: a partition claim fits nowhere else,
    and a GPU with one partition taken counts as used here, so such nodes
    look fuller than they are (packing filled them with whole-GPU pods and
    left partition pods with no room)."""
    if (demand <= 0 and not shares) or not policy.pack_ungrouped:
        return neutral()
    held = reservations(view, now)
    nodes = view.nodes
    # (partitioned, left, opens a shared unit) as one int, in a loop lean
    # enough for 5,000 candidates a call; then the rack with least room among the tied
    last = 1 << 21  # past any count of accelerators: nodes with partitions rank after
    best = 2 * last
    tied: list[str] = []
    for c in candidates:
        ns = nodes.get(c)
        if ns is None:
            continue
        need = ns.needs(demand, shares)
        if need is None:
            continue
        left = ns.capacity - ns.used - need - held.get(c, 0)
        if left < 0:
            continue
        left = 2 * left + (need > demand)
        if ns.partitioned:
            left += last
        if left < best:
            best, tied = left, [c]
        elif left == best:
            tied.append(c)
    if len(tied) <= 1:
        return {tied[0]: MAX_SCORE} if tied else {}
    rooms = _rooms(view, Tier.RACK, (), held)
    place = view.place(Tier.RACK)

    def fullest_rack(n: str) -> tuple[int, int, tuple[str, ...], str]:
        d = place.get(n)  # nodes outside any rack after those in one
        return (1, 0, (), n) if d is None else (0, rooms[d], _name(d), n)
    return {min(tied, key=fullest_rack): MAX_SCORE}


def top(scores: dict[str, int]) -> str | None:
    """The one node that scored 10, if any."""
    best = [n for n, s in scores.items() if s == MAX_SCORE]
    return best[0] if len(best) == 1 else None


def _pack_scores(view: View, group: Group, demand: int, names: list[str],
                 candidates: list[str], now: float,
                 crowd: Counter[str]) -> tuple[dict[str, float], str | None]:
    inside = set(names)
    reserved = reservations(view, now, exclude=group.key)
    free = _free(view, names, reserved)
    used = set(_bound_subdomains(view, group))
    planned = pack.plan(group.pending(), free, {n: _subdomain(view, n) for n in free},
                        frozenset(used))
    targets = set(planned.nodes()) if planned else set()
    used |= set(planned.subdomains) if planned else set()
    allowed = set(candidates)
    slots = [n for d, n in planned.assignment if d == demand and n in allowed] \
        if planned else []
    own = min(slots, key=lambda n: (crowd[n], slots.index(n))) if slots else None
    scores: dict[str, float] = {}
    for c in candidates:
        if c not in inside or c not in view.nodes:
            scores[c] = 0
        elif c == own:
            scores[c] = MAX_SCORE
        elif c in targets:
            scores[c] = 6
        elif _subdomain(view, c) in used:
            scores[c] = 4
        else:
            scores[c] = 2
    return scores, own


def _tier(view: View, src: str, dst: str) -> Tier:
    """The tier KV crosses from node ``src`` to node ``dst``, as the router
    reckons it, from the nodes alone: a pod's devices are allocated in the
    scheduling cycle that picks its node, after the extender is asked."""
    return transfer(view.nodes[src].path, NO_DEVICES, view.nodes[dst].path, NO_DEVICES).tier


def _kv_scores(view: View, peers: list[str], candidates: list[str], inside: set[str],
               policy: Policy) -> dict[str, int]:
    assert policy.links is not None
    cost: dict[str, float] = {}
    for c in candidates:
        if c not in view.nodes:
            continue
        # the tier's cost even on the peer's own node, so that ratios stay finite
        cost[c] = min(transfer_seconds(policy.kv_bytes, policy.links(view.nodes[p].profile)[
            _tier(view, p, c)]) for p in peers)
    best = min((v for c, v in cost.items() if c in inside), default=None)
    out: dict[str, int] = {}
    for c in candidates:
        if c not in cost or c not in inside or best is None:
            out[c] = 0
        elif cost[c] <= 0:
            out[c] = MAX_SCORE
        else:
            out[c] = max(1, round(MAX_SCORE * best / cost[c]))
    return out


def modelled_kv_seconds(view: View, group: Group, policy: Policy) -> float | None:
    """Mean over the group's decode members of the KV-transfer time from
    their nearest prefill member, as the cost model gives it (for the
    benchmark and the demo)."""
    if policy.links is None:
        return None
    pre = [m.node for m in group.members if m.role == PREFILL and m.node in view.nodes]
    dec = [m.node for m in group.members if m.role == DECODE and m.node in view.nodes]
    if not pre or not dec:
        return None
    times = [min(0.0 if view.nodes[p].path == view.nodes[d].path else transfer_seconds(
                     policy.kv_bytes, policy.links(view.nodes[p].profile)[_tier(view, p, d)])
                 for p in pre) for d in dec]
    return sum(times) / len(times)
