"""Packing members into nodes: best-fit decreasing, and plans that use as
few NVLink domains as possible, best-fit (least left over) among those.

Free counts are small integers (accelerators a node), so nodes are kept in
buckets by free count and a member finds its best-fitting node by walking
a handful of buckets, not thousands of nodes."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Assignment = list[tuple[int, str | None]]  # (demand, node); None: needs no accelerator


def best_fit(demands: Sequence[int], free: Mapping[str, int]) -> Assignment | None:
    """Each demand (largest first) on the node whose free count fits it
    most tightly; ``None`` when some demand fits no node."""
    buckets: dict[int, list[str]] = defaultdict(list)
    for name in sorted(free, reverse=True):  # popped from the end: name order
        if free[name] > 0:
            buckets[free[name]].append(name)
    out: Assignment = []
    for d in sorted(demands, reverse=True):
        if d <= 0:
            out.append((d, None))
            continue
        fit = min((v for v, names in buckets.items() if v >= d and names), default=None)
        if fit is None:
            return None
        node = buckets[fit].pop()
        if fit - d > 0:
            buckets[fit - d].append(node)
        out.append((d, node))
    return out


def fits(demands: Sequence[int], free: Mapping[str, int]) -> bool:
    if sum(demands) > sum(free.values()):
        return False
    return best_fit(demands, free) is not None


@dataclass(frozen=True)
class Plan:
    assignment: Assignment
    subdomains: tuple[str, ...]  # the NVLink domains it uses, by key
    leftover: int  # free accelerators of the considered nodes left after it

    def nodes(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for d, n in self.assignment:
            if n is not None:
                out[n] += d
        return dict(out)


def plan(demands: Sequence[int], free: Mapping[str, int], subdomain: Mapping[str, str],
         prefer: frozenset[str] = frozenset()) -> Plan | None:
    """Place ``demands`` on the nodes of ``free``, whose NVLink domain is
    ``subdomain[node]``: in one NVLink domain when one has room (the one
    that leaves least over), else in as few as possible, the last of them
    the smallest that completes the group. NVLink domains in ``prefer``
    (where the group already has members) are used first."""
    need = sum(demands)
    total = sum(free.values())
    if need > total:
        return None
    by_sub: dict[str, dict[str, int]] = defaultdict(dict)
    for n, f in free.items():
        by_sub[subdomain[n]][n] = f
    room = {s: sum(v.values()) for s, v in by_sub.items()}

    def attempt(subs: Sequence[str]) -> Assignment | None:
        return best_fit(demands, {n: f for s in subs for n, f in by_sub[s].items()})

    singles = sorted((s not in prefer, room[s] - need, s) for s in by_sub if room[s] >= need)
    for _, _, s in singles:
        got = attempt([s])
        if got is not None:
            return Plan(got, (s,), total - need)
    order = sorted(by_sub, key=lambda s: (s not in prefer, -room[s], s))
    chosen: list[str] = []
    assignment: Assignment | None = None
    for s in order:
        chosen.append(s)
        if sum(room[c] for c in chosen) >= need:
            assignment = attempt(chosen)
            if assignment is not None:
                break
    if assignment is None:
        return None
    # best fit for the last one: the smallest unused domain that still completes the group
    for s in sorted((s for s in by_sub if s not in chosen), key=lambda s: (room[s], s)):
        if chosen[-1] in prefer or room[s] >= room[chosen[-1]]:
            break
        got = attempt([*chosen[:-1], s])
        if got is not None:
            chosen[-1], assignment = s, got
            break
    return Plan(assignment, tuple(chosen), total - need)
