"""The NIC driver ``net.toposerve.io``: discovery (sysfs + netlink) and the
node's labels -> one pool (``devices.discovered_pool``) -> the publisher;
prepare and unprepare through the framework (``toposerve.dra_driver.kubeletplugin``).

``prepare`` moves nothing: it checks each NIC's merged ``NetConfig``,
writes the claim's hand-off record (``records``) for the CNI plugin that
moves the NICs into the pod's network namespace, returns CDI edits for the
RDMA character devices, and the ``networkData`` the claim's status shows.
``unprepare`` removes the record. Both are idempotent.

The process also repairs the mover's journal at start-up and serves the
CNI plugin's calls on its hand-off socket (``handoff.server``) and, with
binding conditions on, says when an allocated NIC is ready (``binding``).
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from toposerve.dra_driver.driver_process import DriverProcess, Latest, PluginOptions
from toposerve.dra_driver.kubeletplugin import (
    AllocatedDevice,
    ClaimRef,
    ContainerEdits,
    DeviceNode,
    HealthBoard,
    PreparedEdits,
    merge_opaque,
    parse_opaque,
)
from toposerve.dra_driver.kubeletplugin.binding import (
    Readiness,
    with_binding_conditions,
)
from toposerve.dra_driver.kubeletplugin.sockets import PathError, make_folder
from toposerve.dra_driver.net.binding import CONDITIONS, link_readiness
from toposerve.dra_driver.net.config import NetConfig
from toposerve.dra_driver.net.devices import DRIVER, discovered_pool
from toposerve.dra_driver.net.discovery import NetFilters, Nic, discover
from toposerve.dra_driver.net.handoff import cni
from toposerve.dra_driver.net.handoff.journal import DEFAULT_JOURNAL_DIR, Journal
from toposerve.dra_driver.net.handoff.mover import repair_journal
from toposerve.dra_driver.net.handoff.server import HandoffServer
from toposerve.dra_driver.net.link_events import LinkWatch
from toposerve.dra_driver.net.records import (
    DEFAULT_STATE_DIR,
    ClaimRecord,
    NicHandoff,
    all_records,
    remove_record,
    write_record,
)
from toposerve.dra_driver.resourceslice import Pool
from toposerve.kubeapi.typed import ApiClient, CoreV1Api
from toposerve.topology.labels import PRESETS, from_labels
from toposerve.topology.model import DomainPath

log = structlog.get_logger("toposerve.net.driver")

CDI_VENDOR = f"k8s.{DRIVER}"
CDI_CLASS = "nic"
# Shared by every RDMA device: the connection manager (present when rdma_cm is loaded).
RDMA_CM = "infiniband/rdma_cm"


@dataclass(frozen=True)
class NetDriverOptions(PluginOptions):
    state_dir: Path = DEFAULT_STATE_DIR
    netns: str | None = None  # netlink in this named namespace (tests); None: our own
    filters: NetFilters = field(default_factory=NetFilters)
    # netlink events trigger rescans (``link_events``); the timer is the safety net
    rescan_interval_s: float = 30.0
    journal_dir: Path = DEFAULT_JOURNAL_DIR
    # the resident hand-off server's socket (the CNI plugin's serverSocket); None: none
    handoff_socket: Path | None = cni.SERVER_SOCKET


def netns_path(netns: str | None) -> str | None:
    """A named namespace (``ip netns``) as the path the mover opens."""
    if netns is None or netns.startswith("/"):
        return netns
    return f"/var/run/netns/{netns}"


@dataclass(frozen=True)
class _Discovered:
    pool: Pool
    nics: Mapping[str, Nic]


def network_data(nic: Nic, host_if_name: str, cfg: NetConfig) -> dict[str, Any]:
    """``status.devices[].networkData``: the interface as the pod will see it."""
    out: dict[str, Any] = {"interfaceName": cfg.interface_name or host_if_name}
    if cfg.addresses:
        out["ips"] = [str(a) for a in cfg.addresses]
    if nic.link is not None:
        out["hardwareAddress"] = nic.link.mac
    return out


def check_claim(configs: Mapping[str, NetConfig], host_names: Mapping[str, str]) -> None:
    """Two NICs of one claim must not end with one name or one address in the
    pod (a config for a request of two NICs applies to both)."""
    names: dict[str, str] = {}
    addresses: dict[str, str] = {}
    for device, cfg in configs.items():
        name = cfg.interface_name or host_names[device]
        if name in names:
            raise ValueError(f"devices {names[name]} and {device} would both be {name!r} in "
                             "the pod: give each request its own interfaceName")
        names[name] = device
        for a in cfg.addresses:
            if str(a.ip) in addresses:
                raise ValueError(f"devices {addresses[str(a.ip)]} and {device} would both have "
                                 f"address {a.ip}: give each request its own addresses")
            addresses[str(a.ip)] = device


class NetKind:
    """The NIC device kind (``device_kind.DeviceKind``)."""

    driver = DRIVER

    def __init__(self, api: ApiClient, opts: NetDriverOptions) -> None:
        self.api = api
        self.opts = opts
        self._found = Latest(self._discover)
        self._node: tuple[DomainPath, str] | None = None

    def _node_place(self) -> tuple[DomainPath, str]:
        """The node's domain path (from its labels) and UID, read once."""
        if self._node is None:
            node = CoreV1Api(self.api).read_node(self.opts.node_name, _request_timeout=20)
            meta = node.metadata
            assert meta is not None
            path = from_labels(self.opts.node_name, meta.labels or {},
                               PRESETS[self.opts.dialect])
            self._node = (path, meta.uid or "")
        return self._node

    def discover(self) -> _Discovered:
        return self._found.refresh()

    def current(self) -> _Discovered:
        return self._found.get()

    def _discover(self) -> _Discovered:
        # A NIC in a pod is judged, and named, by the host name its record kept.
        away = {n.device: n.hostIfName for r in all_records(self.opts.state_dir)
                for n in r.nics}
        nics = discover(self.opts.sysfs_root, self.opts.filters, netns=self.opts.netns,
                        dev_root=self.opts.dev_root, away=away)
        path, uid = self._node_place()
        return _Discovered(pool=discovered_pool(self.opts.node_name, path, nics, node_uid=uid),
                           nics={n.name: n for n in nics})

    # -- DeviceKind ---------------------------------------------------------

    def enumerate(self) -> Sequence[Pool]:
        pool = self.discover().pool
        if self.opts.binding_conditions:
            pool = with_binding_conditions(pool, CONDITIONS)
        return [pool]

    def validate_config(self, parameters: Mapping[str, Any]) -> NetConfig:
        return parse_opaque(parameters, NetConfig)

    def _nic(self, device: str) -> Nic:
        nic = self.current().nics.get(device)
        if nic is None:  # published a moment ago, perhaps: look again once
            nic = self.discover().nics.get(device)
        if nic is None:
            raise ValueError(f"device {device} is not on this node any more")
        return nic

    def prepare(self, claim: ClaimRef, devices: Sequence[AllocatedDevice]) -> PreparedEdits:
        nics: dict[str, Nic] = {}
        configs: dict[str, NetConfig] = {}
        hosts: dict[str, str] = {}
        for d in devices:
            nic = nics[d.device] = self._nic(d.device)
            if nic.if_name is None:
                raise ValueError(f"device {d.device} has no network interface to hand over")
            hosts[d.device] = nic.if_name
            try:
                configs[d.device] = merge_opaque(d.configs, NetConfig)
            except ValueError as err:
                raise ValueError(f"device {d.device}: {err}") from None
        check_claim(configs, hosts)
        write_record(self.opts.state_dir, ClaimRecord(
            claimUid=claim.uid, claim=f"{claim.namespace}/{claim.name}",
            podUids=list(claim.pod_uids),
            nics=[NicHandoff(device=name, hostIfName=hosts[name],
                             pciAddress=nic.pci.bdf if nic.pci else None,
                             config=configs[name],
                             rdmaDevice=nic.pci.rdma_device if nic.pci else None)
                  for name, nic in nics.items()]))
        edits = {name: self._rdma_edits(nic) for name, nic in nics.items()}
        return PreparedEdits(
            devices=edits,
            network_data={name: network_data(nic, hosts[name], configs[name])
                          for name, nic in nics.items()})

    def _rdma_edits(self, nic: Nic) -> ContainerEdits:
        """The NIC's uverbs character devices (and rdma_cm) in the container,
        at the paths RDMA libraries open."""
        if not nic.char_devices:
            return ContainerEdits()
        paths = [Path(p) for p in nic.char_devices]
        cm = self.opts.dev_root / RDMA_CM
        if cm.exists():
            paths.append(cm)
        return ContainerEdits(
            env={"TOPOSERVE_RDMA_DEVICE": nic.pci.rdma_device or ""} if nic.pci else {},
            device_nodes=tuple(DeviceNode(path=f"/dev/{p.relative_to(self.opts.dev_root)}",
                                          host_path=str(p)) for p in paths))

    def unprepare(self, claim: ClaimRef, devices: Sequence[str]) -> None:
        remove_record(self.opts.state_dir, claim.uid)

    # -- health ---------------------------------------------------------------

    def _present(self, nic: Nic) -> bool:
        return nic.pci is None or (self.opts.sysfs_root / "bus/pci/devices" / nic.pci.bdf
                                   ).exists()

    def check_health(self, board: HealthBoard) -> None:
        """A PCI NIC whose function left the bus is unhealthy; a published
        device is healthy otherwise (a link that is down is a state, not a fault)."""
        found = self.current()
        results = []
        for name, nic in found.nics.items():
            present = self._present(nic)
            results.append((found.pool.name, name, present,
                            "" if present else f"PCI device {nic.pci.bdf if nic.pci else ''} "
                                               "is gone"))
        board.update(results)

    def binding_readiness(self, devices: Collection[str]) -> dict[str, Readiness]:
        """How each allocated NIC is, as of the last rescan (``binding``)."""
        nics = self.current().nics
        return {d: link_readiness(nic, nic is not None and self._present(nic))
                for d in devices for nic in [nics.get(d)]}


class NetDriver(DriverProcess):
    """The whole process: plugin, publisher, and rescans of the links (state,
    addresses, NICs coming and going) and health on netlink events and on a
    slow timer."""

    def __init__(self, api: ApiClient, opts: NetDriverOptions) -> None:
        self.opts = opts
        self.kind = NetKind(api, opts)
        self._handoff: HandoffServer | None = None
        self._rescanning = threading.Lock()  # the timer's and the events' rescans
        self._watch = LinkWatch(self._rescan, netns_path(opts.netns))
        super().__init__(
            api, self.kind, opts, cdi_vendor=CDI_VENDOR, cdi_class=CDI_CLASS,
            interval_s=opts.rescan_interval_s, tick=self._rescan, loop_name="rescan",
            readiness_of=self.kind.binding_readiness)

    def start(self) -> None:
        """Repair first (a NIC a crashed mover left half-moved goes back to
        the host or stays in its pod), then serve the hand-off and the kubelet."""
        host = netns_path(self.opts.netns)
        repaired = repair_journal(Journal(self.opts.journal_dir), host)
        if repaired:
            log.info("hand-off journal repaired", nics=repaired)
        sock = self.opts.handoff_socket
        if sock is not None:
            try:
                make_folder(sock.parent)
                self._handoff = HandoffServer(sock, host_netns=host).start()
            except OSError as err:  # a file in the way, a path too long, no permission
                raise PathError(err.errno, err.strerror or str(err),
                                err.filename or str(sock)) from None
        super().start()
        self._watch.start()

    def stop(self) -> None:
        self._watch.stop()
        super().stop()
        if self._handoff is not None:
            self._handoff.stop()
            self._handoff = None

    def _rescan(self) -> None:
        with self._rescanning:
            self.plugin.refresh_pools()  # the publisher writes only what changed
            self.kind.check_health(self.plugin.health)
        if self.binding is not None:
            self.binding.kick()  # a link that came up or went down decides its claims now
