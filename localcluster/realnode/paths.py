"""Where the real node keeps its files. One real node per machine: the
kubelet's own paths and port are fixed, so these are too."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from toposerve.localcluster.tools import state_dir

# The kubelet advertises its --hostname-override as the node's InternalIP when
# it is an IP literal; any other name makes it pick the machine's own address.
NODE_NAME = "127.0.0.1"
KUBELET_PORT = 10250
KUBELET_HEALTHZ_PORT = 10248
# Pods get 127.9.x.y (kwok nodes use 127.8.x node IPs and 127.15-254.x pods).
POD_SUBNET = "127.9.0.0/16"
PAUSE_IMAGE = "toposerve.local/pause:1"
BUSYBOX_IMAGE = "toposerve.local/busybox:1"
REAL_NODE_LABEL = "toposerve.io/node-kind"
# Keeps other tests' and users' pods off the real node unless they ask for it.
REAL_NODE_TAINT = {"key": "toposerve.io/real-node", "value": "true", "effect": "NoSchedule"}
REAL_NODE_TOLERATION = {"key": "toposerve.io/real-node", "operator": "Exists",
                        "effect": "NoSchedule"}


@dataclass(frozen=True)
class Layout:
    home: Path  # on disk: configs, logs, containerd's root, the owner record
    run: Path  # tmpfs, short paths (socket names have a 108-byte limit)
    kubelet_root: Path = Path("/var/lib/kubelet")
    pod_logs: Path = Path("/var/log/pods")
    container_logs: Path = Path("/var/log/containers")
    nri_socket: Path = Path("/var/run/nri/nri.sock")
    cdi_dirs: tuple[Path, ...] = (Path("/etc/cdi"), Path("/var/run/cdi"))
    lock_file: Path = Path("/run/toposerve-realnode.lock")
    cgroup_root: Path = Path("/sys/fs/cgroup")

    @property
    def config(self) -> Path:
        return self.home / "config"

    @property
    def logs(self) -> Path:
        return self.home / "logs"

    @property
    def containerd_root(self) -> Path:
        return self.home / "containerd"

    @property
    def containerd_state(self) -> Path:
        return self.run / "containerd"

    @property
    def containerd_socket(self) -> Path:
        return self.run / "containerd.sock"

    @property
    def shim_sockets(self) -> Path:
        return self.run / "s"

    @property
    def runc_root(self) -> Path:
        return self.run / "runc"

    @property
    def cni_bin(self) -> Path:
        return self.home / "cni" / "bin"

    @property
    def cni_conf(self) -> Path:
        return self.home / "cni" / "net.d"

    @property
    def cni_ipam(self) -> Path:
        return self.run / "ipam"

    @property
    def owner_file(self) -> Path:
        return self.home / "owner.json"

    def runtime_cgroups(self) -> list[Path]:
        """containerd's cgroup parent ``k8s.io`` in every v1 hierarchy (the
        kubelet, with cgroupsPerQOS off, makes no cgroups of its own)."""
        return sorted(self.cgroup_root.glob("*/k8s.io"))

    def state_roots(self) -> tuple[Path, ...]:
        """What teardown removes: everything of ours but the last run's logs."""
        return (self.run, self.config, self.containerd_root, self.home / "cni", self.owner_file,
                self.kubelet_root, self.pod_logs, self.container_logs)


def default_layout() -> Layout:
    return Layout(home=state_dir() / "realnode", run=Path("/run/toposerve-realnode"))
