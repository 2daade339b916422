"""Laying out a fake cluster: node names and domain paths for N nodes of
a profile, grouped as the profile says (nodes per NVLink domain, rack,
block, zone)."""

from __future__ import annotations

from dataclasses import dataclass

from toposerve.topology.model import DomainPath
from toposerve.topology.profiles import HardwareProfile


@dataclass(frozen=True)
class PlannedNode:
    name: str
    profile: str
    path: DomainPath
    index: int  # position in the whole cluster, used for address assignment


def plan_nodes(groups: list[tuple[HardwareProfile, int]]) -> list[PlannedNode]:
    """Nodes for each (profile, count), in order. Domains are per profile, so
    two profiles never share a rack; zones are shared by name."""
    out: list[PlannedNode] = []
    for profile, count in groups:
        if count <= 0:
            raise ValueError(f"profile {profile.name}: node count must be > 0, got {count}")
        g = profile.spec.grouping
        for i in range(count):
            zone = f"zone-{i // g.nodes_per_zone}"
            block = f"{profile.name}-b{i // g.nodes_per_block}"
            rack = f"{block}-r{(i % g.nodes_per_block) // g.nodes_per_rack}"
            nvl = f"{rack}-n{(i % g.nodes_per_rack) // g.nodes_per_nvlink_domain}"
            name = f"{profile.name}-{i:04d}"
            out.append(PlannedNode(name=name, profile=profile.name, index=len(out),
                                   path=DomainPath(zone=zone, block=block, rack=rack,
                                                   nvlink=nvl, host=name)))
    return out
