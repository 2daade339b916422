"""Hardware profiles: data files describing a kind of node, expanded into
the explicit ``NodeHardware`` model.

PCI addresses are derived from each root's bus number the way a BIOS lays
out a switch: root port ``B:01.0``, switch upstream port ``(B+1):00.0``,
downstream ports ``(B+2):0i.0``, device i at ``(B+3+i):00.0``.
"""

from __future__ import annotations

import hashlib
import itertools
from functools import cache
from importlib import resources
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from toposerve.topology.config_file import ConfigError, load_file, parse_document
from toposerve.topology.model import (
    Device,
    DeviceKind,
    NodeHardware,
    NumaNode,
    PcieRoot,
    PcieSwitch,
    Tier,
    TierLink,
)
from toposerve.topology.quantity import parse_quantity


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class PartitionProfile(Spec):
    """One kind of partition (MIG-like): what it takes of the whole GPU, and
    where it may start, in memory slices."""

    name: str = Field(pattern=r"^[0-9]+g\.[0-9]+gb$", description="e.g. 1g.10gb")
    memory: str
    multiprocessors: int = Field(gt=0)
    memory_slices: int = Field(alias="memorySlices", gt=0)
    placements: list[int] = Field(min_length=1, description="first memory slice of each")


class PartitionLayout(Spec):
    """How a GPU may be cut: the whole GPU's memory slices and
    multiprocessors are shared counters that its partitions consume, so the
    scheduler never hands out the GPU and a partition of it at once."""

    type: str = Field(default="mig", pattern=r"^[a-z][a-z0-9]*$",
                      description="the partitions' `type` attribute")
    memory_slices: int = Field(alias="memorySlices", gt=0, le=16)
    multiprocessors: int = Field(gt=0)
    profiles: list[PartitionProfile] = Field(min_length=1)

    @model_validator(mode="after")
    def _fits(self) -> PartitionLayout:
        for p in self.profiles:
            if p.multiprocessors > self.multiprocessors:
                raise ValueError(f"partition {p.name}: {p.multiprocessors} multiprocessors, "
                                 f"the GPU has {self.multiprocessors}")
            for start in p.placements:
                if start < 0 or start + p.memory_slices > self.memory_slices:
                    raise ValueError(f"partition {p.name}: placement {start} + "
                                     f"{p.memory_slices} slices passes memorySlices "
                                     f"{self.memory_slices}")
            parse_quantity(p.memory)
        return self


class DeviceModel(Spec):
    """A kind of device as a catalog entry: what PCI ids mean."""

    kind: DeviceKind
    model: str
    vendor_id: str = Field(alias="vendorId", pattern=r"^0x[0-9a-f]{4}$")
    device_id: str = Field(alias="deviceId", pattern=r"^0x[0-9a-f]{4}$")
    pci_class: str = Field(alias="pciClass", pattern=r"^0x[0-9a-f]{6}$")
    memory: str | None = None
    speed_mbps: int | None = Field(default=None, alias="speedMbps", gt=0)
    mtu: int | None = Field(default=None, ge=68)
    rdma_prefix: str | None = Field(default=None, alias="rdmaPrefix")
    # What a GPU driver reports beside the PCI ids (NVIDIA's attribute names).
    product_name: str | None = Field(default=None, alias="productName", max_length=64)
    brand: str | None = Field(default=None, max_length=64)
    architecture: str | None = Field(default=None, max_length=64)
    compute_capability: str | None = Field(default=None, alias="computeCapability",
                                           pattern=r"^[0-9]+\.[0-9]+$",
                                           description="CUDA compute capability, e.g. 9.0")
    partitions: PartitionLayout | None = None

    @model_validator(mode="after")
    def _kind_fields(self) -> DeviceModel:
        if self.kind == DeviceKind.GPU and self.memory is None:
            raise ValueError("a gpu model needs memory (e.g. memory: 80Gi)")
        if self.kind == DeviceKind.NIC and self.speed_mbps is None:
            raise ValueError("a nic model needs speedMbps (e.g. speedMbps: 400000)")
        if self.kind == DeviceKind.NIC and self.partitions is not None:
            raise ValueError("partitions are for gpu models")
        if self.memory is not None:
            total = parse_quantity(self.memory)
            for p in self.partitions.profiles if self.partitions else ():
                if parse_quantity(p.memory) > total:
                    raise ValueError(f"partition {p.name}: memory {p.memory} is more than the "
                                     f"GPU's {self.memory}")
        return self


class RootSpec(Spec):
    bus: str = Field(pattern=r"^[0-9a-f]{4}:[0-9a-f]{2}$", description="domain:bus of the root")
    switches: list[list[str]] = Field(default_factory=list,
                                      description="per switch, the model keys of its devices")
    devices: list[str] = Field(default_factory=list, description="model keys with no switch")


class NumaSpec(Spec):
    id: int = Field(ge=0)
    cpus: str = ""
    roots: list[RootSpec]


class Grouping(Spec):
    """How a fake cluster of this profile groups nodes into domains."""

    nodes_per_nvlink_domain: int = Field(alias="nodesPerNvlinkDomain", ge=1)
    nodes_per_rack: int = Field(alias="nodesPerRack", ge=1)
    nodes_per_block: int = Field(alias="nodesPerBlock", ge=1)
    nodes_per_zone: int = Field(alias="nodesPerZone", ge=1)

    @model_validator(mode="after")
    def _nested(self) -> Grouping:
        sizes = [self.nodes_per_nvlink_domain, self.nodes_per_rack, self.nodes_per_block,
                 self.nodes_per_zone]
        for inner, outer in itertools.pairwise(sizes):
            if outer % inner:
                raise ValueError(f"domain sizes must nest: {outer} is not a multiple of {inner}")
        return self


class LinkSpec(Spec):
    bandwidth_gbps: float = Field(alias="bandwidthGBps", gt=0)
    latency_us: float = Field(alias="latencyUs", ge=0)


class TierSpecs(Spec):
    same_node: LinkSpec = Field(alias="sameNode")
    nvlink: LinkSpec
    rack: LinkSpec
    block: LinkSpec
    zone: LinkSpec
    beyond: LinkSpec

    def by_tier(self) -> dict[Tier, TierLink]:
        specs = [self.same_node, self.nvlink, self.rack, self.block, self.zone, self.beyond]
        return {Tier(i): TierLink(bandwidth_gbps=s.bandwidth_gbps, latency_us=s.latency_us)
                for i, s in enumerate(specs)}

    @model_validator(mode="after")
    def _monotonic(self) -> TierSpecs:
        links = self.by_tier()
        for t in list(Tier)[1:]:
            near, far = links[Tier(t - 1)], links[t]
            if far.bandwidth_gbps > near.bandwidth_gbps or far.latency_us < near.latency_us:
                raise ValueError(
                    f"tier {t.name.lower()} must not be cheaper than {Tier(t - 1).name.lower()}: "
                    "bandwidth may only fall and latency only rise as tiers widen")
        return self


class ProfileSpec(Spec):
    description: str = ""
    allocatable: dict[str, str]
    grouping: Grouping
    tiers: TierSpecs
    models: dict[str, DeviceModel]
    numa_nodes: list[NumaSpec] = Field(alias="numaNodes", min_length=1)

    @model_validator(mode="after")
    def _known_models(self) -> ProfileSpec:
        for numa in self.numa_nodes:
            for root in numa.roots:
                for key in [k for sw in root.switches for k in sw] + root.devices:
                    if key not in self.models:
                        raise ValueError(f"device {key!r} in numa {numa.id} root {root.bus} is "
                                         f"not a key of spec.models ({', '.join(self.models)})")
        # Discovery names devices in PCI order, so the profile must list them in it.
        order = [(n.id, r.bus) for n in self.numa_nodes for r in n.roots]
        if [r for _, r in order] != sorted(r for _, r in order) or \
                [n.id for n in self.numa_nodes] != sorted({n.id for n in self.numa_nodes}):
            raise ValueError("list numaNodes by ascending id and roots by ascending bus, "
                             "so device names follow PCI order as discovery sees it")
        for res in ("cpu", "memory", "pods"):
            if res not in self.allocatable:
                raise ValueError(f"allocatable needs {res!r}")
        return self


class Metadata(Spec):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class HardwareProfile(Spec):
    api_version: Literal["toposerve.io/v1"] = Field(alias="apiVersion")
    kind: Literal["HardwareProfile"]
    metadata: Metadata
    spec: ProfileSpec

    @property
    def name(self) -> str:
        return self.metadata.name

    def links(self) -> dict[Tier, TierLink]:
        return self.spec.tiers.by_tier()

    def hardware(self) -> NodeHardware:
        return expand(self)


def _bdf(domain: str, bus: int, dev: int = 0) -> str:
    if bus > 0xFF:
        raise ConfigError(f"PCI bus number overflows past ff under domain {domain}")
    return f"{domain}:{bus:02x}:{dev:02x}.0"


def _mac(profile: str, index: int) -> str:
    digest = hashlib.sha256(f"{profile}/{index}".encode()).digest()
    # 0x02: locally administered unicast, so it never collides with a vendor's.
    return ":".join(f"{b:02x}" for b in (0x02, *digest[:5]))


def expand(profile: HardwareProfile) -> NodeHardware:
    counters = {DeviceKind.GPU: 0, DeviceKind.NIC: 0}

    def make(key: str, bdf: str) -> Device:
        m = profile.spec.models[key]
        i = counters[m.kind]
        counters[m.kind] += 1
        domain, bus_hex = bdf.split(":")[:2]
        # systemd's predictable name: the PCI domain appears only when non-zero.
        ifname = f"enp{int(bus_hex, 16)}s0" if domain == "0000" else \
            f"enP{int(domain, 16)}p{int(bus_hex, 16)}s0"
        common = dict(name=f"{m.kind.value}-{i}", kind=m.kind, model=m.model,
                      vendor_id=m.vendor_id, device_id=m.device_id, pci_bus_id=bdf)
        if m.kind == DeviceKind.GPU:
            return Device(**common, memory_bytes=parse_quantity(m.memory or "0"))
        return Device(**common,
                      interface=ifname, speed_mbps=m.speed_mbps, mtu=m.mtu,
                      mac=_mac(profile.name, i),
                      rdma_device=f"{m.rdma_prefix}{i}" if m.rdma_prefix else None)

    numas = []
    for numa in profile.spec.numa_nodes:
        roots = []
        for root in numa.roots:
            domain, bus_hex = root.bus.split(":")
            bus = int(bus_hex, 16)
            next_bus = bus + 1
            direct = []
            for key in root.devices:
                direct.append(make(key, _bdf(domain, next_bus)))
                next_bus += 1
            switches = []
            for keys in root.switches:
                upstream = _bdf(domain, next_bus)
                first_dev_bus = next_bus + 2
                devs = [make(k, _bdf(domain, first_dev_bus + i)) for i, k in enumerate(keys)]
                switches.append(PcieSwitch(bdf=upstream, devices=tuple(devs)))
                next_bus = first_dev_bus + len(keys)
            roots.append(PcieRoot(name=f"pci{root.bus}", switches=tuple(switches),
                                  devices=tuple(direct)))
        numas.append(NumaNode(id=numa.id, cpus=numa.cpus, roots=tuple(roots)))
    return NodeHardware(numa_nodes=tuple(numas))


def bundled_names() -> list[str]:
    files = resources.files("toposerve.topology").joinpath("profiles")
    return sorted(p.name.removesuffix(".yaml") for p in files.iterdir()
                  if p.name.endswith(".yaml"))


@cache
def load_profile(name_or_path: str) -> HardwareProfile:
    """A bundled profile by name, or a profile file by path."""
    if name_or_path.endswith((".yaml", ".yml")):
        return load_file(name_or_path, HardwareProfile, "HardwareProfile")
    if name_or_path not in bundled_names():
        raise ConfigError(f"unknown profile {name_or_path!r}: choose one of "
                          f"{', '.join(bundled_names())} or give a path to a .yaml file")
    res = resources.files("toposerve.topology").joinpath("profiles", f"{name_or_path}.yaml")
    return parse_document(yaml.safe_load(res.read_text()), HardwareProfile, "HardwareProfile",
                          f"profile {name_or_path}")


def catalog() -> dict[tuple[str, str], DeviceModel]:
    """Every device model the bundled profiles know, by (vendor id, device id)."""
    out: dict[tuple[str, str], DeviceModel] = {}
    for name in bundled_names():
        for m in load_profile(name).spec.models.values():
            out[(m.vendor_id, m.device_id)] = m
    return out
