"""Stand-in device nodes for fake hardware on the real node: character
devices with /dev/null's numbers, so a runtime's CDI injection finds real
device nodes and a container gets harmless ones (``--dev-root`` of a driver)."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

# what the GPU driver's CDI edits name for an 8-GPU NVIDIA node (docs/dra-driver.md)
NVIDIA_DEVICE_NODES = (*(f"nvidia{i}" for i in range(8)), "nvidiactl", "nvidia-uvm",
                       "nvidia-uvm-tools")


def stand_in_dev_root(dev: Path, names: Sequence[str] = NVIDIA_DEVICE_NODES) -> Path:
    dev.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = dev / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    return dev
