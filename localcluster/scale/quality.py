"""Placement quality of a run, from where each group's pods landed: groups
wholly inside one domain of their level (and of those, how many could
have been), groups left pending, pods stranded (bound for a group that is
not wholly bound), fragmentation of the free GPUs across racks, and the
modelled KV-transfer time of P/D slices. Pure functions over plain data.

The general version of ``bench/extender_bench.py``'s figures (that bench
fixes one mix on GB200 racks; this takes any groups, levels and profiles)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from functools import cache
from typing import Any

from toposerve.localcluster.scale.workload import GroupPlan
from toposerve.topology.distance import kv_transfer_seconds
from toposerve.topology.model import DomainPath
from toposerve.topology.profiles import load_profile

KV_BYTES = 8 * 2**30  # per request, as the extender's default kvSizePerRequest


@cache
def gpus_of(profile: str) -> int:
    return sum(1 for d in load_profile(profile).hardware().devices() if d.kind == "gpu")


def domain(path: DomainPath, level: str) -> str | None:
    return {"nvlink": path.nvlink, "rack": path.rack, "block": path.block}[level]


@dataclass(frozen=True)
class Placement:
    groups: int
    in_one_domain: int
    could_fit_one_domain: int  # groups whose GPUs fit one empty domain of their level
    pending_groups: int  # not wholly bound
    stranded_pods: int
    never_placed_pods: int
    free_gpus: int  # on the racks of the profiles the groups use
    largest_free_rack: int
    fragmentation: float  # 1 - largest free rack / free GPUs (0: all free room in one rack)
    kv_ms: float | None  # mean modelled KV transfer per request over bound P/D slices


def placement(groups: list[GroupPlan], where: dict[str, str], paths: dict[str, DomainPath],
              profiles: dict[str, str], used: dict[str, int]) -> Placement:
    """``where``: bound pod -> node; ``paths``/``profiles``: node -> place,
    profile; ``used``: node -> GPUs taken by every bound pod. A pod bound
    to a node that is gone (churn removes nodes) is not placed."""
    where = {pod: node for pod, node in where.items() if node in paths}
    capacity: dict[tuple[str, str], int] = defaultdict(int)  # (level, domain) -> GPUs
    for node, path in paths.items():
        for level in ("nvlink", "rack", "block"):
            d = domain(path, level)
            if d is not None:
                capacity[(level, d)] += gpus_of(profiles[node])
    one = could = pending = stranded = never = 0
    kv: list[float] = []
    for g in groups:
        nodes = [where[g.pod_name(i)] for i in range(g.pods) if g.pod_name(i) in where]
        domains = {domain(paths[n], g.level) for n in nodes}
        if any(c >= g.pods * g.gpus_per_pod for (lv, _), c in capacity.items()
               if lv == g.level):
            could += 1
        if len(nodes) == g.pods:
            one += len(domains) == 1 and None not in domains
            if g.roles:
                kv.append(kv_seconds(g, where, paths))
        else:
            pending += 1
            stranded += len(nodes)
            never += g.pods - len(nodes)
    free = free_racks(paths, profiles, used, {g.profile for g in groups})
    total_free = sum(free.values())
    largest = max(free.values(), default=0)
    return Placement(len(groups), one, could, pending, stranded, never, total_free, largest,
                     round(1 - largest / total_free, 3) if total_free else 0.0,
                     round(1000 * sum(kv) / len(kv), 2) if kv else None)


def free_racks(paths: dict[str, DomainPath], profiles: dict[str, str], used: dict[str, int],
               only: set[str]) -> dict[str, int]:
    """rack -> free GPUs, for racks of the profiles in ``only``."""
    free: dict[str, int] = defaultdict(int)
    for node, path in paths.items():
        if profiles[node] in only and path.rack is not None:
            free[path.rack] += max(0, gpus_of(profiles[node]) - used.get(node, 0))
    return dict(free)


def kv_seconds(g: GroupPlan, where: dict[str, str], paths: dict[str, DomainPath]) -> float:
    """Per decode pod, the KV transfer from its nearest prefill pod; their mean."""
    links = load_profile(g.profile).links()
    pre = [paths[where[g.pod_name(i)]] for i, r in enumerate(g.roles) if r == "prefill"]
    dec = [paths[where[g.pod_name(i)]] for i, r in enumerate(g.roles) if r == "decode"]
    return sum(min(kv_transfer_seconds(KV_BYTES, p, d, links) for p in pre)
               for d in dec) / len(dec)


def landed(groups: list[GroupPlan], where: dict[str, str], paths: dict[str, DomainPath]
           ) -> dict[str, dict[str, int]]:
    """rack -> group -> GPUs of that group there (for the picture)."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for g in groups:
        for i in range(g.pods):
            node = where.get(g.pod_name(i))
            if node in paths and (rack := paths[node].rack) is not None:
                out[rack][g.name] += g.gpus_per_pod
    return {r: dict(v) for r, v in sorted(out.items())}


def as_dict(p: Placement) -> dict[str, Any]:
    return asdict(p)
