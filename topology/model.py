"""The shared topology model: one set of pydantic types for the driver, the
extender and the router.

Inside a node: NUMA nodes > PCIe roots > PCIe switches > devices. Above
nodes: a domain path (zone > block > rack > NVLink domain > host) whose
levels are read from node labels (see ``labels``).
"""

from __future__ import annotations

import re
from enum import IntEnum, StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

BDF_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
ROOT_RE = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")


class Frozen(BaseModel):
    """Base for topology facts: immutable, strict about unknown keys."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class DeviceKind(StrEnum):
    GPU = "gpu"
    NIC = "nic"


class Tier(IntEnum):
    """Node<->node distance, nearest first. The order is the contract:
    costs never fall as the tier rises."""

    SAME_NODE = 0
    NVLINK = 1
    RACK = 2
    BLOCK = 3
    ZONE = 4
    BEYOND = 5


class Affinity(IntEnum):
    """Device<->device distance inside one node, nearest first. ``NVLINK``:
    two GPUs of one NVLink domain, whatever PCIe lies between them (a node's
    hardware alone never says so; the devices' ``nvlinkDomain`` does)."""

    SAME_DEVICE = 0
    NVLINK = 1
    SAME_SWITCH = 2
    SAME_ROOT = 3
    SAME_NUMA = 4
    SAME_NODE = 5


Bdf = Annotated[str, Field(pattern=BDF_RE.pattern, description="extended BDF: 0000:18:00.0")]


class Device(Frozen):
    """One accelerator or NIC, with the facts the scheduler and router use."""

    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    kind: DeviceKind
    model: str
    vendor_id: str = Field(pattern=r"^0x[0-9a-f]{4}$")
    device_id: str = Field(pattern=r"^0x[0-9a-f]{4}$")
    pci_bus_id: Bdf
    memory_bytes: int | None = Field(default=None, ge=0, description="accelerator memory")
    interface: str | None = Field(default=None, description="NIC: kernel interface name")
    speed_mbps: int | None = Field(default=None, ge=0, description="NIC: link speed")
    mtu: int | None = Field(default=None, ge=68)
    mac: str | None = Field(default=None, pattern=r"^([0-9a-f]{2}:){5}[0-9a-f]{2}$")
    rdma_device: str | None = Field(default=None, description="NIC: RDMA device, e.g. mlx5_0")


class PcieSwitch(Frozen):
    """A switch, identified by the BDF of its upstream port."""

    bdf: Bdf
    devices: tuple[Device, ...] = ()


class PcieRoot(Frozen):
    """A PCIe root complex, named as Kubernetes names it: ``pci<domain>:<bus>``."""

    name: str = Field(pattern=ROOT_RE.pattern)
    switches: tuple[PcieSwitch, ...] = ()
    devices: tuple[Device, ...] = Field(default=(), description="devices with no switch above them")


class NumaNode(Frozen):
    id: int = Field(ge=0)
    cpus: str = Field(default="", description="kernel cpulist, e.g. 0-55,112-167")
    roots: tuple[PcieRoot, ...] = ()


class DevicePlace(Frozen):
    """Where a device sits inside its node."""

    device: Device
    numa: int
    root: str
    switch: str | None


class NodeHardware(Frozen):
    """Everything inside one node that topology cares about."""

    numa_nodes: tuple[NumaNode, ...]

    @model_validator(mode="after")
    def _unique(self) -> NodeHardware:
        names = [p.device.name for p in self.places()]
        bdfs = [p.device.pci_bus_id for p in self.places()]
        for label, values in (("device name", names), ("PCI bus id", bdfs)):
            dup = sorted({v for v in values if values.count(v) > 1})
            if dup:
                raise ValueError(f"{label} used twice in one node: {', '.join(dup)}")
        return self

    def places(self) -> list[DevicePlace]:
        out: list[DevicePlace] = []
        for numa in self.numa_nodes:
            for root in numa.roots:
                out.extend(DevicePlace(device=d, numa=numa.id, root=root.name, switch=None)
                           for d in root.devices)
                for sw in root.switches:
                    out.extend(DevicePlace(device=d, numa=numa.id, root=root.name, switch=sw.bdf)
                               for d in sw.devices)
        return out

    def place(self, device_name: str) -> DevicePlace:
        for p in self.places():
            if p.device.name == device_name:
                return p
        raise KeyError(f"no device {device_name!r} in this node")

    def devices(self, kind: DeviceKind | None = None) -> list[Device]:
        return [p.device for p in self.places() if kind is None or p.device.kind == kind]


class TierLink(Frozen):
    """What moving bytes between two places of a tier costs."""

    bandwidth_gbps: float = Field(gt=0, description="gigabytes per second")
    latency_us: float = Field(ge=0, description="fixed cost per transfer, microseconds")


class DomainPath(Frozen):
    """A node's place above the host: one value per tier, outermost first.
    ``None`` means the node's labels do not say."""

    zone: str | None = None
    block: str | None = None
    rack: str | None = None
    nvlink: str | None = None
    host: str

    def value(self, tier: Tier) -> str | None:
        return {
            Tier.ZONE: self.zone,
            Tier.BLOCK: self.block,
            Tier.RACK: self.rack,
            Tier.NVLINK: self.nvlink,
            Tier.SAME_NODE: self.host,
        }.get(tier)

    def gaps(self) -> list[Tier]:
        """Unknown levels outside a known one. Paths are compared from the
        outside in, so nothing inside a gap is ever shared: a place written
        by hand should have none."""
        outer = (Tier.ZONE, Tier.BLOCK, Tier.RACK, Tier.NVLINK)
        known = [i for i, t in enumerate(outer) if self.value(t) is not None]
        return [t for t in outer[:known[-1]] if self.value(t) is None] if known else []


class NodeTopology(Frozen):
    """One node: its name, place in the domain tree, profile and hardware."""

    name: str
    path: DomainPath
    profile: str
    hardware: NodeHardware

    @field_validator("name")
    @classmethod
    def _dns(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", v) or len(v) > 253:
            raise ValueError("node name must be a DNS subdomain (lower case, digits, '-', '.')")
        return v
