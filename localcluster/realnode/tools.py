"""The real node's binaries: built into the version-keyed cache by
hack/build-node-tools.sh, runc and busybox from Debian."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from toposerve.localcluster.tools import ToolsMissing, cache_dir, versions


@dataclass(frozen=True)
class NodeTools:
    kubelet: Path
    containerd: Path
    ctr: Path
    shim: Path
    pause: Path
    runc: Path
    busybox: Path


def _debian(name: str, package: str) -> Path:
    found = shutil.which(name)
    if found is None:
        raise ToolsMissing(f"{name} not found: run `make setup` (or apt-get install {package})")
    return Path(found)


def find_node_tools() -> NodeTools:
    v = versions()
    b = cache_dir() / "bin"
    ctd = b / f"containerd-{v['CONTAINERD_VERSION']}"
    tools = NodeTools(
        kubelet=b / f"kubelet-{v['K8S_VERSION']}" / "kubelet",
        containerd=ctd / "containerd",
        ctr=ctd / "ctr",
        shim=ctd / "containerd-shim-runc-v2",
        pause=b / f"pause-{v['PAUSE_VERSION']}" / "pause",
        runc=_debian("runc", "runc"),
        busybox=_debian("busybox", "busybox-static"),
    )
    missing = [p.name for p in vars(tools).values() if not os.access(p, os.X_OK)]
    if missing:
        raise ToolsMissing(f"real-node tools missing ({', '.join(missing)}): run `make setup` "
                           f"(or hack/build-node-tools.sh) to build them into {b}")
    return tools
