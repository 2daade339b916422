"""Building ``toposerve-nic``, the executable containerd runs: a static Go
binary (``dra_driver/net/handoff/cni-forwarder/``, stdlib only,
``CGO_ENABLED=0``) that forwards each CNI call to the NIC driver's resident
hand-off server, so a node needs no Python for it. Built into the tool cache
keyed by a hash of its source (``make nic-cni``, or ``python -m
toposerve.localcluster.realnode.forwarder``, which prints the path). Tooling: the
driver only takes the built binary's path (``toposerve driver net install
--plugin``)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import toposerve.dra_driver.net.handoff
from toposerve.dra_driver.net.handoff.cni import PLUGIN_TYPE as NAME
from toposerve.localcluster.tools import cache_dir

SOURCE = Path(toposerve.dra_driver.net.handoff.__file__).resolve().parent / "cni-forwarder"


class ForwarderMissing(RuntimeError):
    """The binary is not built and cannot be; the message says what to do."""


def source_hash() -> str:
    """Of go.mod and the .go files (names and bytes), in name order."""
    h = hashlib.sha256()
    for p in sorted(SOURCE.iterdir()):
        if p.name == "go.mod" or p.suffix == ".go":
            h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def binary() -> Path:
    """Where the build of the current source is (or goes): in the tool cache
    beside the cluster tools."""
    return cache_dir() / "bin" / f"{NAME}-{source_hash()}" / NAME


def build() -> Path:
    """The binary of the current source, built first if it is not cached."""
    out = binary()
    if os.access(out, os.X_OK):
        return out
    go = shutil.which("go")
    if go is None:
        raise ForwarderMissing(f"cannot build {NAME}: Go is not on PATH (need go >= 1.22; "
                               "see https://go.dev/doc/install)")
    tmp = out.with_name(f".{NAME}.tmp")
    out.parent.mkdir(parents=True, exist_ok=True)
    # stdlib only, so nothing is downloaded; a static binary runs on any node
    env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
    done = subprocess.run([go, "build", "-trimpath", "-ldflags", "-s -w", "-o", str(tmp), "."],
                          cwd=SOURCE, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ForwarderMissing(f"go build of {SOURCE} failed: {done.stderr.strip()}")
    tmp.replace(out)
    return out


def main() -> int:
    try:
        print(build())
    except ForwarderMissing as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
