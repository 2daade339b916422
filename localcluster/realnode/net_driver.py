"""``toposerve driver net`` for the real node, as a host process
(``host_driver``): its hardware a profile's fake sysfs tree (the same PCI
layout as the GPU driver's, so GPU and NIC share PCIe roots), its NICs
veth stand-ins in the host's namespace (``nics``) named as that tree names
them. The hand-off into pods: the node always chains the CNI plugin
``toposerve-nic`` (the static Go forwarder, ``toposerve.localcluster.realnode.forwarder``),
which has this process's resident hand-off server do the move."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from toposerve.localcluster.realnode import nics
from toposerve.localcluster.realnode.host_driver import HostDriver
from toposerve.topology.profiles import load_profile
from toposerve.topology.sysfs import write_profile_sysfs

DRIVER = "net.toposerve.io"
PLUGIN_DIR = Path("/var/lib/kubelet/plugins") / DRIVER  # the driver's default: the kubelet's
STATE_DIR = PLUGIN_DIR / "handoff"  # the driver's and the CNI plugin's default
JOURNAL_DIR = PLUGIN_DIR / "journal"


@dataclass
class NetDriver(HostDriver):
    profile: str = "hgx-h100"

    def stand_ins(self) -> list[nics.StandIn]:
        return nics.stand_ins_for(load_profile(self.profile).hardware())

    def driver_args(self) -> list[str]:
        sysfs = self.workdir / "sysfs"
        if not sysfs.exists():
            write_profile_sysfs(load_profile(self.profile), sysfs)
        return ["net", "--sysfs-root", str(sysfs)]  # link events rescan, not a fast timer

    def start(self, timeout_s: float = 30) -> None:
        """The stand-ins (kept across a driver restart), then the driver."""
        if not nics.FABRIC_NETNS.exists():
            nics.create(self.stand_ins())
        super().start(timeout_s)

    def remove_stand_ins(self) -> None:
        """After the pods with NICs are gone; the node's teardown does it too."""
        nics.remove()
