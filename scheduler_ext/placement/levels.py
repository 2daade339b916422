"""Topology levels a group can ask for, and the domain a node sits in at
each level, read from the shared topology model's domain paths.

A domain is named by the path prefix from the zone down to its level, the
way ``toposerve.topology.distance.node_tier`` compares paths, so two racks that
reuse a name in different blocks stay different racks."""

from __future__ import annotations

from functools import cache

from toposerve.topology.labels import Dialect
from toposerve.topology.model import DomainPath, Tier

Domain = tuple[str | None, ...]

# The spellings a label or config value may use for a level.
LEVEL_NAMES: dict[str, Tier] = {
    "host": Tier.SAME_NODE, "node": Tier.SAME_NODE,
    "nvlink": Tier.NVLINK, "nvlink-domain": Tier.NVLINK, "nvlinkdomain": Tier.NVLINK,
    "rack": Tier.RACK, "subblock": Tier.RACK,
    "block": Tier.BLOCK,
    "zone": Tier.ZONE,
    "cluster": Tier.BEYOND, "any": Tier.BEYOND,
}
_PRINTED = {Tier.SAME_NODE: "node", Tier.NVLINK: "NVLink domain", Tier.RACK: "rack",
            Tier.BLOCK: "block", Tier.ZONE: "zone", Tier.BEYOND: "cluster"}
_CONFIG = {Tier.SAME_NODE: "host", Tier.NVLINK: "nvlink", Tier.RACK: "rack",
           Tier.BLOCK: "block", Tier.ZONE: "zone", Tier.BEYOND: "cluster"}


class UnknownLevel(ValueError):
    """A level name or node-label key the extender cannot map to a tier."""


def parse_level(text: str, dialect: Dialect) -> Tier:
    """A level from its name (``rack``) or from the node-label key the
    dialect uses for it (``topology.toposerve.io/rack``, as LWS's
    ``exclusive-topology`` and PodGroups' topology keys give it)."""
    name = text.strip().lower()
    if name in LEVEL_NAMES:
        return LEVEL_NAMES[name]
    keys = {dialect.host: Tier.SAME_NODE, dialect.nvlink: Tier.NVLINK, dialect.rack: Tier.RACK,
            dialect.block: Tier.BLOCK, dialect.zone: Tier.ZONE}
    if text in keys:
        return keys[text]
    if text == "kubernetes.io/hostname":
        return Tier.SAME_NODE
    known = ", ".join(sorted({*_CONFIG.values()}))
    raise UnknownLevel(f"unknown topology level {text!r}: use one of {known} or a node-label "
                       "key of the configured topology dialect")


def level_name(tier: Tier) -> str:
    """How a person reads the level: 'rack', 'NVLink domain'."""
    return _PRINTED[tier]


def config_name(tier: Tier) -> str:
    """How a label or config file spells the level: 'rack', 'nvlink'."""
    return _CONFIG[tier]


@cache  # paths do not change; placement asks for the same ones all the time
def domain_of(path: DomainPath, tier: Tier) -> Domain | None:
    """The node's domain at ``tier``; ``None`` when its labels leave the
    level (or a level outside it) unknown, so it shares no such domain."""
    if tier == Tier.BEYOND:
        return ()
    if tier == Tier.SAME_NODE:
        return (path.zone, path.block, path.rack, path.nvlink, path.host)
    values = (path.zone, path.block, path.rack, path.nvlink)[:Tier.ZONE - tier + 1]
    if any(v is None for v in values):
        return None
    return values


def contains(outer: Domain, inner: Domain) -> bool:
    return inner[:len(outer)] == outer


def display(domain: Domain, tier: Tier) -> str:
    """A domain's name for a person: its innermost value."""
    if tier == Tier.BEYOND or not domain:
        return "the cluster"
    return f"{level_name(tier)} {domain[-1]}"


def climb(start: Tier) -> list[Tier]:
    """``start`` and every wider level, one at a time, up to the whole cluster."""
    return [Tier(t) for t in range(start, Tier.BEYOND + 1)]
