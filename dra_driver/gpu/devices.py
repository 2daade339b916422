"""GPU devices of one node as ResourceSlice JSON, from the topology model.

Whole GPUs are ``gpu-<index>`` with the attribute names NVIDIA's DRA
driver uses where they exist (``type``, ``uuid``, ``productName``,
``brand``, ``architecture``, ``cudaComputeCapability``, ``driverVersion``,
``cudaDriverVersion``, ``index``, ``minor``), memory as capacity, and the
shared placement vocabulary (``toposerve.topology.slice_attributes``).

A GPU whose model declares partitions (MIG-like, in the profile) is
published (unless the node's ``gpu.toposerve.io/partitions`` label is
``off``: whole GPUs only, as a GPU with MIG disabled) with its partitions
``gpu-<index>-<profile>-<start>`` through shared counters
(DRAPartitionableDevices): one counter set per GPU holding its memory
slices, multiprocessors and memory; the whole GPU consumes all of it,
each partition its part, so the scheduler never hands out a GPU and one of
its partitions, nor two partitions that overlap.

With NVML (``nvml.NvmlNode``), a GPU NVML reports is published as NVML
describes it, matched by PCI bus id: its real UUID, product name, memory,
architecture, compute capability, minor number, the driver's and CUDA's
versions, its MIG profiles as the partitions (instead of the catalog's)
and, once its NVLink fabric is up, ``nvlinkDomain`` = ``<cluster
UUID>.<clique id>`` from the hardware (over the node's label). Sysfs still
gives every GPU's place (PCIe root, switch, NUMA node).

With ``memory_shares`` (DRAConsumableCapacity), whole GPUs are published
shareable: ``allowMultipleAllocations`` and their ``memory`` capacity with a
request policy (``memory_share_policy``), so claims asking
``capacity.requests.memory`` share one GPU within its memory. Such GPUs
carry no partitions: a share-holding GPU would hold every counter of its
set anyway, and the partitions' ``multiprocessors`` capacity, having no
policy, would be consumed whole by each share.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from toposerve.dra_driver.gpu.nvml import NvmlGpu, NvmlNode
from toposerve.dra_driver.resourceslice import Pool
from toposerve.topology.config_file import ConfigError
from toposerve.topology.model import DeviceKind, DevicePlace, NodeTopology
from toposerve.topology.profiles import (
    DeviceModel,
    PartitionLayout,
    PartitionProfile,
    catalog,
    load_profile,
)
from toposerve.topology.quantity import format_bytes, parse_quantity
from toposerve.topology.slice_attributes import (
    check_entry,
    device_entry,
    integer,
    quantity,
    string,
    version,
)

DRIVER = "gpu.toposerve.io"
NVIDIA = "0x10de"
DEFAULT_DRIVER_VERSION = "570.124.06"
DEFAULT_CUDA_DRIVER_VERSION = "12.8"
# A node label: "off" publishes whole GPUs only. Partitions cost the
# scheduler's allocator about ten times a whole GPU's work on every node it
# filters (each device and counter is converted and checked per node per
# pod), so nodes that never serve partitions should not carry them.
PARTITIONS_LABEL = "gpu.toposerve.io/partitions"
# Memory shares are whole multiples of this (requests are rounded up to it):
# model weights and KV budgets are sized in GiB, and a coarse step keeps the
# leftover of a GPU usable by another share instead of a few MiB of slack.
SHARE_STEP = 2**30
# A stable namespace for the UUIDs of simulated GPUs (no NVML to ask).
_UUIDS = uuid.UUID("5f0c2a8e-1c0b-4f59-9d57-2f7a8f3d6b10")


def _model(node: NodeTopology, vendor: str, device: str) -> DeviceModel | None:
    """The device's catalog entry: the node's own profile first (two
    profiles may describe one PCI id differently), then every profile."""
    try:
        for m in load_profile(node.profile).spec.models.values():
            if (m.vendor_id, m.device_id) == (vendor, device):
                return m
    except ConfigError:
        pass  # a discovered node's profile name need not be a profile we ship
    return catalog().get((vendor, device))


def gpu_uuid(node_name: str, pci_bus_id: str) -> str:
    """What stands in for NVML's UUID: stable per node and PCI address."""
    return f"GPU-{uuid.uuid5(_UUIDS, f'{node_name}/{pci_bus_id}')}"


def _index(place: DevicePlace) -> int:
    return int(place.device.name.rsplit("-", 1)[1])


def _vendor_attributes(m: DeviceModel | None, nvidia: bool, driver_version: str,
                       cuda_driver_version: str) -> dict[str, Any]:
    """What the catalog knows (a GPU NVML does not report)."""
    attrs: dict[str, Any] = {"driverVersion": version(driver_version)}
    if m is not None:
        for key, value in (("productName", m.product_name), ("brand", m.brand),
                           ("architecture", m.architecture)):
            if value:
                attrs[key] = string(value)
        if nvidia and m.compute_capability:
            attrs["cudaComputeCapability"] = version(m.compute_capability)
    if nvidia:
        attrs["cudaDriverVersion"] = version(cuda_driver_version)
    return attrs


def _nvml_attributes(g: NvmlGpu, node: NvmlNode, catalog_model: str) -> dict[str, Any]:
    """What NVML says, over the catalog; a product the catalog does not
    know is named by NVML, never ``unknown-...``."""
    attrs: dict[str, Any] = {
        "uuid": string(g.uuid), "minor": integer(g.minor), "productName": string(g.name),
        "cudaComputeCapability": version(g.compute_capability),
        "driverVersion": version(node.driver_version),
        "cudaDriverVersion": version(node.cuda_driver_version)}
    if catalog_model.startswith("unknown-"):
        attrs["model"] = string(g.name)
    if g.brand:
        attrs["brand"] = string(g.brand)
    if g.architecture:
        attrs["architecture"] = string(g.architecture)
    if g.nvlink_domain:
        attrs["nvlinkDomain"] = string(g.nvlink_domain)
    return attrs


def nvml_layout(g: NvmlGpu) -> PartitionLayout | None:
    """The GPU's MIG profiles as a partition layout (None: not MIG-capable):
    memory slices and multiprocessors of the whole GPU are those of its
    largest profiles."""
    profiles = [p for p in g.mig_profiles or () if p.placements]
    if not profiles:
        return None
    return PartitionLayout.model_validate({
        "type": "mig",
        "memorySlices": max(start + p.slices for p in profiles for start in p.placements),
        "multiprocessors": max(p.multiprocessors for p in profiles),
        "profiles": [{"name": p.name, "memory": f"{p.memory_mb}Mi",
                      "multiprocessors": p.multiprocessors, "memorySlices": p.slices,
                      "placements": list(p.placements)} for p in profiles]})


def counter_set_name(index: int) -> str:
    return f"gpu-{index}-counters"


def _counters(memory: str, multiprocessors: int, slices: range) -> dict[str, Any]:
    out = {"memory": quantity(memory), "multiprocessors": quantity(str(multiprocessors))}
    out.update({f"memory-slice-{i}": quantity("1") for i in slices})
    return out


def partition_name(index: int, profile: PartitionProfile, start: int) -> str:
    return f"gpu-{index}-{profile.name.replace('.', '')}-{start}"


def _partitions(index: int, whole: dict[str, Any], layout: PartitionLayout,
                uuid_: str) -> list[dict[str, Any]]:
    out = []
    shared = {k: v for k, v in whole["attributes"].items()
              if k not in ("type", "uuid", "minor")}
    for p in layout.profiles:
        for start in p.placements:
            memory = format_bytes(parse_quantity(p.memory))
            entry = {
                "name": partition_name(index, p, start),
                "attributes": {**shared, "type": string(layout.type),
                               "parentUUID": string(uuid_), "profile": string(p.name),
                               "placementStart": integer(start)},
                "capacity": {"memory": quantity(memory),
                             "multiprocessors": quantity(str(p.multiprocessors))},
                "consumesCounters": [{
                    "counterSet": counter_set_name(index),
                    "counters": _counters(memory, p.multiprocessors,
                                          range(start, start + p.memory_slices))}],
            }
            check_entry(entry)
            out.append(entry)
    return out


def memory_share_policy(memory_bytes: int) -> dict[str, Any] | None:
    """The ``requestPolicy`` of a shareable GPU's memory: shares of
    ``SHARE_STEP`` multiples, at least one step; a claim that asks no memory
    gets the most the steps allow (all of it but under a step), so a plain
    whole-GPU claim keeps the GPU to itself. None: too small to share."""
    steps = memory_bytes // SHARE_STEP
    if steps < 2:  # the apiserver refuses a policy whose min plus one step passes the value
        return None
    step = format_bytes(SHARE_STEP)
    return {"default": format_bytes(steps * SHARE_STEP),
            "validRange": {"min": step, "step": step}}


def _shareable(entry: dict[str, Any], memory_bytes: int | None) -> None:
    """Make the whole GPU ``entry`` shareable by memory, if it can be."""
    policy = memory_share_policy(memory_bytes) if memory_bytes is not None else None
    if policy is not None:
        entry["allowMultipleAllocations"] = True
        entry["capacity"]["memory"] = {**entry["capacity"]["memory"], "requestPolicy": policy}


def partitions_wanted(labels: Mapping[str, str]) -> bool:
    """Whether a node with these labels publishes its GPUs' partitions."""
    return labels.get(PARTITIONS_LABEL, "on") != "off"


def gpu_pool(node: NodeTopology, *, driver_version: str = DEFAULT_DRIVER_VERSION,
             cuda_driver_version: str = DEFAULT_CUDA_DRIVER_VERSION, node_uid: str = "",
             partitions: bool = True, nvml: NvmlNode | None = None,
             withheld: frozenset[str] = frozenset(), memory_shares: bool = False) -> Pool:
    """The node's GPUs (and, with ``partitions``, their partitions) as one
    pool named for the node; NVML's facts where it reports the GPU; GPUs
    whose PCI bus id is in ``withheld`` are left out. ``memory_shares``:
    whole GPUs shareable by memory, without partitions."""
    places = sorted((p for p in node.hardware.places()
                     if p.device.kind == DeviceKind.GPU and p.device.pci_bus_id not in withheld),
                    key=_index)
    wholes: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    counter_sets: list[dict[str, Any]] = []
    for place in places:
        d, i = place.device, _index(place)
        m = _model(node, d.vendor_id, d.device_id)
        nvidia = d.vendor_id == NVIDIA
        entry = device_entry(place, node.path)
        uuid_ = gpu_uuid(node.name, d.pci_bus_id)
        entry["attributes"].update({
            "type": string("gpu"), "uuid": string(uuid_), "index": integer(i),
            "minor": integer(i),
            **_vendor_attributes(m, nvidia, driver_version, cuda_driver_version)})
        g = nvml.gpus.get(d.pci_bus_id) if nvml is not None else None
        layout = m.partitions if m is not None else None
        memory_bytes = d.memory_bytes
        if g is not None and nvml is not None:
            entry["attributes"].update(_nvml_attributes(g, nvml, d.model))
            uuid_ = g.uuid
            memory_bytes = g.memory_bytes
            entry.setdefault("capacity", {})["memory"] = quantity(format_bytes(memory_bytes))
            layout = nvml_layout(g)
        if not partitions or memory_shares:
            layout = None
        if layout is not None and memory_bytes is not None:
            memory = format_bytes(memory_bytes)
            entry["capacity"]["multiprocessors"] = quantity(str(layout.multiprocessors))
            everything = _counters(memory, layout.multiprocessors, range(layout.memory_slices))
            counter_sets.append({"name": counter_set_name(i), "counters": everything})
            entry["consumesCounters"] = [{"counterSet": counter_set_name(i),
                                          "counters": everything}]
            parts += _partitions(i, entry, layout, uuid_)
        if memory_shares:
            _shareable(entry, memory_bytes)
        check_entry(entry)
        wholes.append(entry)
    # whole GPUs first, then partitions by GPU, smallest first: the
    # allocator takes the first device that fits
    return Pool(name=node.name, node_name=node.name, devices=(*wholes, *parts),
                shared_counters=tuple(counter_sets), node_uid=node_uid)
