"""Distances and costs: pure functions over the model.

Tiers compare whole path prefixes, so two racks that reuse the name "r1"
in different blocks are still different racks.
"""

from __future__ import annotations

from toposerve.topology.model import Affinity, DomainPath, NodeHardware, Tier, TierLink

# Tiers above the host, outermost first: the order paths are compared in.
_OUTER_FIRST = (Tier.ZONE, Tier.BLOCK, Tier.RACK, Tier.NVLINK)


def device_affinity(hw: NodeHardware, a: str, b: str) -> Affinity:
    """How close two devices of one node are."""
    pa, pb = hw.place(a), hw.place(b)
    if pa.device.name == pb.device.name:
        return Affinity.SAME_DEVICE
    if pa.switch is not None and pa.switch == pb.switch:
        return Affinity.SAME_SWITCH
    if pa.root == pb.root:
        return Affinity.SAME_ROOT
    if pa.numa == pb.numa:
        return Affinity.SAME_NUMA
    return Affinity.SAME_NODE


def node_tier(a: DomainPath, b: DomainPath) -> Tier:
    """The nearest tier two nodes share. Unknown levels are never shared."""
    if a.host == b.host:
        return Tier.SAME_NODE
    shared = Tier.BEYOND
    for tier in _OUTER_FIRST:
        va, vb = a.value(tier), b.value(tier)
        if va is None or va != vb:
            break
        shared = tier
    return shared


def transfer_seconds(nbytes: int, link: TierLink) -> float:
    return link.latency_us * 1e-6 + nbytes / (link.bandwidth_gbps * 1e9)


def kv_transfer_seconds(nbytes: int, src: DomainPath, dst: DomainPath,
                        links: dict[Tier, TierLink]) -> float:
    """Estimated time to move a KV cache of ``nbytes`` from src to dst:
    latency(tier) + bytes / bandwidth(tier); zero when src is dst."""
    if nbytes < 0:
        raise ValueError("nbytes must be >= 0")
    if src == dst:
        return 0.0
    return transfer_seconds(nbytes, links[node_tier(src, dst)])
