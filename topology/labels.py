"""Node labels <-> domain paths. A dialect names the label key of each
tier; presets cover GKE's topology labels, the well-known zone/hostname
labels and our own."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from toposerve.topology.model import DomainPath

LABEL_PREFIX = "topology.toposerve.io"
PROFILE_LABEL = f"{LABEL_PREFIX}/profile"
ZONE_LABEL = "topology.kubernetes.io/zone"
HOSTNAME_LABEL = "kubernetes.io/hostname"


class Dialect(BaseModel):
    """Which node-label key carries each tier. ``None``: this dialect has no such level."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    zone: str | None = ZONE_LABEL
    block: str | None = None
    rack: str | None = None
    nvlink: str | None = None
    host: str = HOSTNAME_LABEL


class DialectName(StrEnum):
    TOPOSERVE = "toposerve"
    GKE = "gke"
    KUBERNETES = "kubernetes"


PRESETS: dict[DialectName, Dialect] = {
    DialectName.TOPOSERVE: Dialect(
        block=f"{LABEL_PREFIX}/block",
        rack=f"{LABEL_PREFIX}/rack",
        nvlink=f"{LABEL_PREFIX}/nvlink-domain",
    ),
    # GKE: a sub-block is the group of hosts behind one set of leaf switches
    # (for GB200, the NVL72 rack), so it maps to rack; GKE has no separate
    # NVLink label.
    DialectName.GKE: Dialect(
        block="cloud.google.com/gce-topology-block",
        rack="cloud.google.com/gce-topology-subblock",
        host="cloud.google.com/gce-topology-host",
    ),
    DialectName.KUBERNETES: Dialect(),
}


def _keys(dialect: Dialect) -> dict[str, str | None]:
    return {"zone": dialect.zone, "block": dialect.block, "rack": dialect.rack,
            "nvlink": dialect.nvlink, "host": dialect.host}


def to_labels(path: DomainPath, dialect: Dialect) -> dict[str, str]:
    out: dict[str, str] = {}
    for field, key in _keys(dialect).items():
        value = getattr(path, field)
        if key is not None and value is not None:
            out[key] = value
    return out


def from_labels(node_name: str, labels: dict[str, str], dialect: Dialect) -> DomainPath:
    """A node's path; a missing label leaves its tier unknown (``None``),
    and the host falls back to the node name."""
    values = {field: labels.get(key) if key else None for field, key in _keys(dialect).items()}
    values["host"] = values["host"] or node_name
    return DomainPath(**values)
