"""``toposerve driver gpu`` for the real node, as a host process
(``host_driver``): a fake sysfs tree of a profile for the hardware and
stand-in device nodes; NVML from a library of the caller's choosing (a
test's fake one, its scenario named in ``env``) or none. For tests,
benchmarks and the demo."""

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
    nvml_library: Path | None = None  # None: the driver looks for the host's, if any
    health_interval_s: float | None = None  # None: the driver's default
    memory_shares: bool = False  # whole GPUs shareable by memory (--memory-shares)

    def driver_args(self) -> list[str]:
        sysfs = self.workdir / "sysfs"
        if not sysfs.exists():
            write_profile_sysfs(load_profile(self.profile), sysfs)
        dev = stand_in_dev_root(self.workdir / "dev")
        args = ["gpu", "--sysfs-root", str(sysfs), "--dev-root", str(dev)]
        if self.nvml_library is not None:
            args += ["--nvml-library", str(self.nvml_library)]
        if self.health_interval_s is not None:
            args += ["--health-interval", str(self.health_interval_s)]
        if self.memory_shares:
            args.append("--memory-shares")
        return args
