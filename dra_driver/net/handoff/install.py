"""Installing the ``toposerve-nic`` CNI plugin on a node (the NIC driver's
init container, ``toposerve driver net-install-cni``): its executable into
the host's CNI bin dir, and its entry chained last into the pod network's
conflist. Both idempotent; the conflist is replaced atomically, and left
byte for byte as it was when the entry is already there."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dra_driver.kubeletplugin.files import write_atomic
from dra_driver.net.handoff.cni import PLUGIN_TYPE

# Where the image has the static binary (``make nic-cni`` builds it; the
# chart's ``netDriver.cni.plugin`` default names the same path).
DEFAULT_PLUGIN = Path("/usr/local/libexec/toposerve/toposerve-nic")


class InstallError(RuntimeError):
    """The plugin cannot be installed; the message names the file and the fix."""


def plugin_entry(kubelet_dir: Path) -> dict[str, str]:
    """The chain entry: the driver's folders under the node's kubelet root."""
    data = kubelet_dir / "plugins/net.toposerve.io"
    return {"type": PLUGIN_TYPE, "stateDir": str(data / "handoff"),
            "journalDir": str(data / "journal"), "serverSocket": str(data / "handoff.sock")}


def chained(conflist: Mapping[str, Any], entry: Mapping[str, Any]) -> dict[str, Any] | None:
    """``conflist`` with ``entry`` last in its ``plugins``; None when a
    plugin of the entry's type is already in there (wherever, however
    configured: an operator's own entry is kept)."""
    plugins = conflist.get("plugins")
    if not isinstance(plugins, list) or not plugins:
        raise InstallError("it has no \"plugins\" list: give a .conflist file "
                           "(a single-plugin .conf cannot chain)")
    if any(isinstance(p, Mapping) and p.get("type") == entry["type"] for p in plugins):
        return None
    return {**conflist, "plugins": [*plugins, dict(entry)]}


def install(bin_dir: Path, plugin: Path, conf_dir: Path | None = None,
            chain_into: str | None = None, entry: Mapping[str, Any] | None = None
            ) -> list[str]:
    """Copy the executable ``plugin`` (the Go forwarder) into
    ``bin_dir``; chain ``entry`` into ``conf_dir/chain_into`` when given.
    Returns what changed (file paths)."""
    changed = []
    exe = bin_dir / PLUGIN_TYPE
    try:
        body = plugin.read_bytes()
    except OSError as err:
        raise InstallError(f"{plugin}: cannot read the toposerve-nic binary ({err.strerror}): "
                           "build it with `make nic-cni` and give its path") from None
    if not exe.exists() or exe.read_bytes() != body:
        write_atomic(exe, body, mode=0o755)
        changed.append(str(exe))
    if chain_into is None:
        return changed
    assert conf_dir is not None and entry is not None
    path = conf_dir / chain_into
    try:
        doc = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise InstallError(f"{path}: no such conflist yet (the pod network writes it when it "
                           "starts; this is retried), or fix netDriver.cni.chainInto") from None
    except ValueError as err:
        raise InstallError(f"{path} is not JSON ({err}): fix the file or "
                           "netDriver.cni.chainInto") from None
    if not isinstance(doc, dict):
        raise InstallError(f"{path}: not a JSON object: fix netDriver.cni.chainInto")
    try:
        new = chained(doc, entry)
    except InstallError as err:
        raise InstallError(f"{path}: {err}") from None
    if new is not None:
        write_atomic(path, (json.dumps(new, indent=2) + "\n").encode(),
                     mode=path.stat().st_mode & 0o777)
        changed.append(str(path))
    return changed
