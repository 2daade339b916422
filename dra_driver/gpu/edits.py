"""CDI container edits for the GPUs of one claim (pure: the node's topology
and its published devices in, edits out).

Per device: its device nodes. For the whole claim (applied once to a
container that uses any of its devices): the vendor's control nodes, the
visible-devices variables and the topology environment.

- NVIDIA: ``/dev/nvidia<minor>``; ``/dev/nvidiactl``, ``/dev/nvidia-uvm``,
  ``/dev/nvidia-uvm-tools``; ``NVIDIA_VISIBLE_DEVICES`` and
  ``CUDA_VISIBLE_DEVICES`` list the UUIDs (``MIG-...`` for a partition), so
  they mean the same inside the container whatever its enumeration order.
- AMD: ``/dev/dri/card<i>`` and ``/dev/dri/renderD<128+i>``; ``/dev/kfd``;
  ``AMD_VISIBLE_DEVICES`` the host indices, ``ROCR_VISIBLE_DEVICES`` and
  ``HIP_VISIBLE_DEVICES`` the container's own ``0..n-1`` (only the claim's
  render nodes are there).
- Topology (``GpuConfig.topologyEnv``): ``TOPOSERVE_GPU_NUMA_NODES``,
  ``TOPOSERVE_GPU_CPUS``, ``TOPOSERVE_GPU_PCIE_ROOTS``,
  ``TOPOSERVE_GPU_PCI_BUS_IDS``, and the NICs aligned with the GPUs
  (``GpuConfig.nicAlignment``): ``TOPOSERVE_NICS``, ``TOPOSERVE_RDMA_DEVICES``.
- Memory shares (a claim holding a share of a GPU published with
  ``allowMultipleAllocations``): ``TOPOSERVE_GPU_MEMORY_BYTES``, the bytes of
  memory the claim may use on each GPU in ``*_VISIBLE_DEVICES`` order (its
  shares' ``consumedCapacity``, summed per GPU; a GPU held whole gives all
  its memory). The GPU does not enforce it: the workload must keep within it
  (e.g. vLLM's ``--gpu-memory-utilization``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toposerve.dra_driver.gpu.config import GpuConfig
from toposerve.dra_driver.kubeletplugin import (
    AllocatedDevice,
    ContainerEdits,
    DeviceNode,
    PreparedEdits,
)
from toposerve.topology.model import Device, DeviceKind, DevicePlace, NodeHardware
from toposerve.topology.quantity import parse_quantity

NVIDIA, AMD = "0x10de", "0x1002"
_CONTROL = {NVIDIA: ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"), AMD: ("kfd",)}


@dataclass(frozen=True)
class GpuDevice:
    """One allocated device as the edits need it."""

    name: str
    index: int          # of the whole GPU (a partition's parent)
    minor: int          # of the whole GPU: /dev/nvidia<minor>
    visible_id: str     # what *_VISIBLE_DEVICES names it by
    place: DevicePlace  # of the whole GPU
    partition: bool


def _attr(device: Mapping[str, Any], key: str) -> Any:
    value = (device.get("attributes") or {}).get(key) or {}
    return next(iter(value.values()), None)


def resolve(names: Sequence[str], published: Mapping[str, Mapping[str, Any]],
            hw: NodeHardware) -> list[GpuDevice]:
    """The named devices of the pool, with their GPU's place in the node."""
    out = []
    for name in names:
        dev = published.get(name)
        if dev is None:
            raise ValueError(f"device {name} is not published by this node")
        index = int(_attr(dev, "index"))
        parent = _attr(dev, "parentUUID")
        place = hw.place(f"gpu-{index}")
        whole = published.get(f"gpu-{index}", dev)
        minor = _attr(whole, "minor")
        if parent is not None:
            # Stable per parent and partition, as MIG UUIDs are per instance.
            visible = f"MIG-{uuid.uuid5(uuid.NAMESPACE_URL, f'{parent}/{name}')}"
        else:
            visible = str(_attr(dev, "uuid"))
        out.append(GpuDevice(name=name, index=index,
                             minor=index if minor is None else int(minor),
                             visible_id=visible, place=place,
                             partition=parent is not None))
    return out


def memory_grants(devices: Sequence[AllocatedDevice],
                  published: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """Device name -> bytes of memory the claim may use there, when any of
    its devices is a share (else empty: nothing to tell a whole-GPU claim).
    A share's ``consumedCapacity`` is what the scheduler counted against the
    GPU; a GPU held whole gives its ``memory`` capacity."""
    if not any(d.consumed for d in devices):
        return {}
    out: dict[str, int] = {}
    for d in devices:
        if d.consumed:
            got = d.consumed.get("memory")
            if got is None:
                raise ValueError(f"share {d.share_id} of {d.device} consumes no memory "
                                 f"(consumedCapacity {dict(d.consumed)})")
            out[d.device] = out.get(d.device, 0) + parse_quantity(got)
        else:
            whole = ((published.get(d.device) or {}).get("capacity") or {}).get("memory")
            if whole is not None:
                out[d.device] = parse_quantity(whole["value"])
    return out


def aligned_nics(hw: NodeHardware, gpus: Sequence[DevicePlace], level: str) -> list[Device]:
    """NICs that share ``level`` (switch, root, numa) with one of the GPUs."""
    if level == "none":
        return []

    def near(nic: DevicePlace, gpu: DevicePlace) -> bool:
        if level == "switch" and gpu.switch is not None:
            return nic.switch == gpu.switch
        if level in ("switch", "root"):
            return nic.root == gpu.root
        return nic.numa == gpu.numa

    return [p.device for p in hw.places()
            if p.device.kind == DeviceKind.NIC and any(near(p, g) for g in gpus)]


def _node(rel: str, dev_root: Path) -> DeviceNode:
    host = dev_root / rel
    if not host.exists():
        raise ValueError(f"device node {host} does not exist (is the GPU driver loaded?)")
    container = f"/dev/{rel}"
    return DeviceNode(path=container, host_path=None if str(host) == container else str(host))


def _device_nodes(g: GpuDevice, vendor: str, dev_root: Path) -> tuple[DeviceNode, ...]:
    if vendor == AMD:
        return (_node(f"dri/card{g.index}", dev_root),
                _node(f"dri/renderD{128 + g.index}", dev_root))
    return (_node(f"nvidia{g.minor}", dev_root),)


def _unique(values: Sequence[str]) -> str:
    return ",".join(dict.fromkeys(values))


def gpu_edits(gpus: Sequence[GpuDevice], hw: NodeHardware, config: GpuConfig,
              dev_root: Path, memory: Mapping[str, int] | None = None) -> PreparedEdits:
    """``memory``: ``memory_grants`` of the claim."""
    vendors = {g.place.device.vendor_id for g in gpus}
    if len(vendors) != 1 or not vendors <= set(_CONTROL):
        raise ValueError(f"one claim's GPUs must all be NVIDIA or all AMD, got {sorted(vendors)}")
    vendor = vendors.pop()
    per_device = {g.name: ContainerEdits(device_nodes=_device_nodes(g, vendor, dev_root))
                  for g in gpus}
    if vendor == AMD:
        env = {"AMD_VISIBLE_DEVICES": _unique([str(g.index) for g in gpus]),
               "ROCR_VISIBLE_DEVICES": ",".join(str(i) for i in range(len(gpus))),
               "HIP_VISIBLE_DEVICES": ",".join(str(i) for i in range(len(gpus)))}
    else:
        ids = _unique([g.visible_id for g in gpus])
        env = {"NVIDIA_VISIBLE_DEVICES": ids, "CUDA_VISIBLE_DEVICES": ids}
    if memory:
        visible = {g.visible_id: g.name for g in gpus}
        env["TOPOSERVE_GPU_MEMORY_BYTES"] = ",".join(
            str(memory.get(name, 0)) for name in visible.values())
    places = [g.place for g in gpus]
    nics = aligned_nics(hw, places, config.nic_alignment)
    if config.topology_env:
        numas = sorted({p.numa for p in places})
        cpus = {n.id: n.cpus for n in hw.numa_nodes}
        env.update({
            "TOPOSERVE_GPU_NUMA_NODES": ",".join(map(str, numas)),
            "TOPOSERVE_GPU_CPUS": ",".join(cpus[n] for n in numas if cpus.get(n)),
            "TOPOSERVE_GPU_PCIE_ROOTS": _unique([p.root for p in places]),
            "TOPOSERVE_GPU_PCI_BUS_IDS": _unique([p.device.pci_bus_id for p in places]),
            "TOPOSERVE_NICS": ",".join(n.interface for n in nics if n.interface),
            "TOPOSERVE_RDMA_DEVICES": ",".join(n.rdma_device for n in nics if n.rdma_device),
        })
    # the driver's own variables win over a config's (GpuConfig refuses them
    # too): they say which GPUs the allocation granted
    env = {**config.env, **env}
    common = ContainerEdits(env=env, device_nodes=tuple(_node(rel, dev_root)
                                                        for rel in _CONTROL[vendor]))
    data = {g.name: {"uuid": g.visible_id, "pciBusID": g.place.device.pci_bus_id,
                     "numaNode": g.place.numa, "pcieRoot": g.place.root,
                     "alignedNics": [n.interface for n in aligned_nics(hw, [g.place],
                                                                       config.nic_alignment)
                                     if n.interface],
                     **({"memoryBytes": memory[g.name]} if memory and g.name in memory else {})}
            for g in gpus}
    return PreparedEdits(devices=per_device, common=common, data=data)
