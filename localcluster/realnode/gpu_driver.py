"""``toposerve driver gpu`` for the real node, as a host process
(``host_driver``): a fake sysfs tree of a profile for the hardware and
stand-in device nodes. For tests, benchmarks and the demo."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from toposerve.localcluster.realnode.fakedev import stand_in_dev_root
from toposerve.localcluster.realnode.host_driver import CDI_ROOT, HostDriver
from toposerve.topology.profiles import load_profile
from toposerve.topology.sysfs import write_profile_sysfs

DRIVER = "gpu.toposerve.io"
PLUGIN_DIR = Path("/var/lib/kubelet/plugins") / DRIVER  # the driver's default: the kubelet's
__all__ = ["CDI_ROOT", "DRIVER", "PLUGIN_DIR", "GpuDriver"]


@dataclass
class GpuDriver(HostDriver):
    profile: str = "hgx-h100"

    def driver_args(self) -> list[str]:
        sysfs = self.workdir / "sysfs"
        if not sysfs.exists():
            write_profile_sysfs(load_profile(self.profile), sysfs)
        dev = stand_in_dev_root(self.workdir / "dev")
        return ["gpu", "--sysfs-root", str(sysfs), "--dev-root", str(dev)]
