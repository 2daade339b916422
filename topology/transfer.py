"""How far KV moves between two pods, from the devices each holds: the one
function the extender and the router ask (``transfer``).

A pod's devices are what its ResourceClaims were allocated, each with its
place as its ResourceSlice publishes it (``slice_attributes.held_device``):
NVLink domain, PCIe switch and root, NUMA node. A pod that holds no claim
has only its node's place (its labels), and ``transfer`` is then
``node_tier`` with the inside of the node unknown.

Inside one node, two pods' GPUs are as near as the nearest level (same
device, NVLink domain, PCIe switch, root, NUMA node) at which every GPU of
either side finds one of the other's: each prefill GPU holds KV heads some
decode GPU needs, and each decode GPU needs heads from some prefill GPU, so
the farthest of those pairs is what the transfer waits for. A decode pod on
GPUs 0-1 and a prefill pod on GPU 1 share a switch (0 and 1 sit on one);
with the decode pod on GPUs 1 and 4, they share only the node.

Between nodes, devices of one NVLink domain make it NVLink whatever the
labels say (and labels saying so are overruled by devices saying
otherwise); else the node tier, refined by how near each side's GPUs sit to
the NICs it holds (GPUDirect RDMA through one switch, or a trip through the
root or the socket). A level a device does not publish is never shared."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from pydantic import Field

from toposerve.topology.distance import node_tier
from toposerve.topology.model import Affinity, DeviceKind, DomainPath, Frozen, Tier


class HeldDevice(Frozen):
    """A device a pod holds, where its slice says it sits (None: not said)."""

    driver: str
    pool: str
    name: str
    kind: DeviceKind | None = Field(default=None, description="gpu, nic; None: neither")
    nvlink_domain: str | None = None
    pcie_switch: str | None = None
    pcie_root: str | None = None
    numa: int | None = None

    @property
    def ref(self) -> str:
        """driver/pool/device: how a claim's allocation names it."""
        return f"{self.driver}/{self.pool}/{self.name}"

    def at(self, level: Affinity) -> str | None:
        """Its value at a level of ``Affinity`` (below the node)."""
        if level == Affinity.SAME_DEVICE:
            return self.ref
        if level == Affinity.NVLINK:
            return self.nvlink_domain
        if level == Affinity.SAME_SWITCH:
            return self.pcie_switch
        if level == Affinity.SAME_ROOT:
            return self.pcie_root
        if level == Affinity.SAME_NUMA:
            return None if self.numa is None else str(self.numa)
        return None


# the levels below the node, nearest first; and those a GPU and a NIC can share
_INSIDE = (Affinity.SAME_DEVICE, Affinity.NVLINK, Affinity.SAME_SWITCH, Affinity.SAME_ROOT,
           Affinity.SAME_NUMA)
_PCIE = (Affinity.SAME_SWITCH, Affinity.SAME_ROOT, Affinity.SAME_NUMA)

Values = frozenset[str] | None  # a level's values over a set of devices; None: not all known


def _values(devices: list[HeldDevice], level: Affinity) -> Values:
    vals = [d.at(level) for d in devices]
    return frozenset(v for v in vals if v is not None) if vals and None not in vals else None


def _shared(a: Values, b: Values) -> bool | None:
    """Whether every device of either side finds one of the other's at a
    level: the same values (None: unknown)."""
    if a is None or b is None:
        return None
    return a == b


@dataclass(frozen=True)
class DeviceSet:
    """What one pod holds, reduced once (a pod's devices change rarely, and
    ``transfer`` runs for every decode candidate of every split request)."""

    devices: tuple[HeldDevice, ...] = ()
    gpus: dict[Affinity, Values] = field(init=False, compare=False, repr=False)
    nic: Affinity = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        gpus = [d for d in self.devices if d.kind == DeviceKind.GPU]
        nics = [d for d in self.devices if d.kind == DeviceKind.NIC]
        levels = {lv: _values(gpus, lv) for lv in _INSIDE}
        # the farthest any of its GPUs is from the nearest of its NICs
        nic = next((lv for lv in _PCIE if (g := levels[lv]) is not None
                    and (n := _values(nics, lv)) is not None and g <= n), Affinity.SAME_NODE)
        object.__setattr__(self, "gpus", levels)
        object.__setattr__(self, "nic", nic)


NO_DEVICES = DeviceSet()


class Transfer(NamedTuple):
    """How far KV moves: the tier between the nodes, then, inside it, how
    near the devices are (inside one node: GPU to GPU; between nodes: GPU
    to the NIC it leaves by, the worse side's). Compared as a tuple:
    nearest first."""

    tier: Tier
    affinity: Affinity

    @property
    def rank(self) -> int:
        return self.tier * len(Affinity) + self.affinity


_LAST_RANK = Transfer(Tier.BEYOND, Affinity.SAME_NODE).rank


def closeness(t: Transfer) -> float:
    """1 for the nearest transfer (the same device), 0 for the farthest
    (beyond every known domain, the inside of both nodes unknown), evenly
    spaced between by rank."""
    return 1 - t.rank / _LAST_RANK


def transfer(src: DomainPath, src_devices: DeviceSet, dst: DomainPath,
             dst_devices: DeviceSet) -> Transfer:
    """How far KV moves from a pod at ``src`` holding ``src_devices`` to one at
    ``dst`` holding ``dst_devices`` (symmetric)."""
    tier = node_tier(src, dst)
    a, b = src_devices.gpus, dst_devices.gpus
    if tier == Tier.SAME_NODE:
        return Transfer(tier, next((lv for lv in _INSIDE if _shared(a[lv], b[lv])),
                                   Affinity.SAME_NODE))
    nvlink = _shared(a[Affinity.NVLINK], b[Affinity.NVLINK])
    if nvlink or (tier == Tier.NVLINK and nvlink is None):
        return Transfer(Tier.NVLINK, Affinity.NVLINK)
    tier = Tier.RACK if tier == Tier.NVLINK else tier  # the devices say otherwise
    return Transfer(tier, max(src_devices.nic, dst_devices.nic))
