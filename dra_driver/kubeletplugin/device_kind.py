"""The one interface a kind of device implements to become a DRA driver on
this framework (the GPU driver, the NIC driver): enumerate its devices,
validate an opaque config, prepare allocated devices (CDI edits per device)
and undo that. The framework does everything else: sockets, claims,
serialization, checkpoint, CDI files, claim status, slices, health.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from toposerve.dra_driver.kubeletplugin.cdi import ContainerEdits
from toposerve.dra_driver.resourceslice import Pool


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str
    # The pods the claim is reserved for (``status.reservedFor``) as the
    # claim read before ``prepare`` says; empty elsewhere. Not identity.
    pod_uids: tuple[str, ...] = field(default=(), compare=False)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


@dataclass(frozen=True)
class AllocatedDevice:
    """One allocation result of a claim for this driver on this node."""

    request: str          # as in the result: "<request>" or "<request>/<subrequest>"
    pool: str
    device: str
    share_id: str | None = None
    admin_access: bool = False
    # A share of a device that allows multiple allocations: what the
    # scheduler counted it to consume (``consumedCapacity``), name -> quantity.
    consumed: Mapping[str, str] = field(default_factory=dict)
    # Validated opaque configs that apply to this device, lowest precedence
    # first: the class's, then the claim's (a later one overrides an earlier).
    configs: tuple[Any, ...] = ()


@dataclass(frozen=True)
class PreparedEdits:
    """What ``prepare`` hands back: CDI edits per device, edits for the whole
    claim (applied once to a container using any of its devices), and
    optional ``status.devices[].data`` and ``.networkData``
    (``interfaceName``, ``ips``, ``hardwareAddress``) per device."""

    devices: Mapping[str, ContainerEdits]
    common: ContainerEdits = field(default_factory=ContainerEdits)
    data: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    network_data: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


class DeviceKind(Protocol):
    @property
    def driver(self) -> str:
        """The DRA driver name, e.g. ``gpu.toposerve.io``."""
        ...

    def enumerate(self) -> Sequence[Pool]:
        """The pools (with devices) to publish for this node, as of now."""
        ...

    def validate_config(self, parameters: Mapping[str, Any]) -> Any:
        """Parse one opaque config's ``parameters``; raise ``ValueError``
        whose message names the bad field."""
        ...

    def prepare(self, claim: ClaimRef, devices: Sequence[AllocatedDevice]) -> PreparedEdits:
        """Make the devices usable by the claim's pods; must be idempotent
        (it may run again after a crash)."""
        ...

    def unprepare(self, claim: ClaimRef, devices: Sequence[str]) -> None:
        """Undo ``prepare`` for these device names; must be idempotent and
        must succeed for devices that were never prepared."""
        ...
