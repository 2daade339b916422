"""A toy scheduler loop over the placement functions, for unit tests: the
'in-tree filters' pass nodes with enough free accelerators, the extender
filters and scores, the best-scored node wins (ties by name), the pod binds
at once; pods that found no node are retried until nothing moves."""

from __future__ import annotations

from dataclasses import dataclass, replace

from toposerve.scheduler_ext.placement.decide import (
    Policy,
    filter_member,
    filter_ungrouped,
    prioritize_member,
)
from toposerve.scheduler_ext.placement.model import Group, Member, NodeState, Shape, Source, View
from toposerve.topology.layout import plan_nodes
from toposerve.topology.model import DeviceKind, Tier
from toposerve.topology.profiles import load_profile


def cluster(*groups: tuple[str, int]) -> dict[str, NodeState]:
    profiles = [(load_profile(p), n) for p, n in groups]
    gpus = {p.name: len(p.hardware().devices(DeviceKind.GPU)) for p, _ in profiles}
    return {n.name: NodeState(n.name, n.path, capacity=gpus[n.profile], profile=n.profile)
            for n in plan_nodes(profiles)}


def gang(key: str, pods: int, demand: int, required: Tier | None = None,
         preferred: Tier | None = None, roles: list[str] | None = None) -> Group:
    members = tuple(Member(uid=f"{key}-{i}", name=f"default/{key}-{i}", demand=demand,
                           role=roles[i] if roles else None) for i in range(pods))
    return Group(key=key, source=Source.TOPOSERVE, size=pods, members=members,
                 required=required, preferred=preferred,
                 shape=Shape.PD if roles else Shape.WIDE_EP)


@dataclass
class Sim:
    view: View
    policy: Policy
    now: float = 0.0
    reasons: dict[str, str] | None = None

    def free(self, node: str) -> int:
        return self.view.nodes[node].free

    def bind(self, group: Group, uid: str, node: str) -> None:
        m = group.member(uid)
        assert m is not None
        members = tuple(replace(x, node=node) if x.uid == uid else x for x in group.members)
        self.view.groups[group.key] = replace(group, members=members)
        self._use(node, m.demand)

    def _use(self, node: str, demand: int) -> None:
        n = self.view.nodes[node]
        self.view.nodes[node] = replace(n, used=n.used + demand)
        self.view.memo.clear()

    def attempt(self, key: str, uid: str) -> str | None:
        """One scheduling attempt for a pod; the node it bound to, if any."""
        group = self.view.groups[key]
        m = group.member(uid)
        assert m is not None and m.node is None
        candidates = [n for n in sorted(self.view.nodes) if self.free(n) >= m.demand]
        res = filter_member(self.view, group, uid, candidates, self.policy, self.now)
        if res.decision is not None:
            self.view.decisions[key] = res.decision
            self.view.memo.clear()
        self.reasons = res.failed
        if not res.passed:
            return None
        scores = prioritize_member(self.view, self.view.groups[key], uid, res.passed,
                                   self.policy, self.now)
        best = max(res.passed, key=lambda n: (scores.get(n, 0), -res.passed.index(n)))
        self.bind(self.view.groups[key], uid, best)
        return best

    def loose(self, demand: int) -> str | None:
        """One attempt for a pod of no group: of the nodes the extender
        passes, the fullest that fits (the way to crowd a promise most)."""
        candidates = [n for n in sorted(self.view.nodes) if self.free(n) >= demand]
        res = filter_ungrouped(self.view, demand, candidates, self.now)
        self.reasons = res.failed
        if not res.passed:
            return None
        best = min(res.passed, key=lambda n: (self.free(n), n))
        self._use(best, demand)
        return best

    def run(self, order: list[tuple[str, str]], step_s: float = 0.0) -> None:
        """Attempts in ``order``, then retries of the unplaced ones until no progress."""
        queue = list(order)
        while queue:
            left = []
            for key, uid in queue:
                if self.attempt(key, uid) is None:
                    left.append((key, uid))
                self.now += step_s
            if len(left) == len(queue):
                return
            queue = left

    def placed(self, key: str) -> list[str]:
        return [m.node for m in self.view.groups[key].members if m.node is not None]
