"""Installing the ``toposerve-nic`` CNI plugin on a node (the NIC driver's
init container, ``toposerve driver net-install-cni``): its executable into
the host's CNI bin dir, and its entry chained last into the pod network's
conflist. Both idempotent; the conflist is replaced atomically, and left
byte for byte as it was when the entry is already there.

What an install changed is recorded (``RECORD`` in the driver's folder,
written before the change): whether the executable was new, and the
conflist's bytes before the entry was added with a hash of what was
written. ``uninstall`` (``net-install-cni --uninstall``) undoes exactly
that: the conflist back byte for byte when nobody changed it since (else
only our entry taken out), the executable removed when the install made it."""

from __future__ import annotations

import base64
import errno
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from toposerve.dra_driver.kubeletplugin.files import write_atomic
from toposerve.dra_driver.net.handoff import DEFAULT_PLUGIN
from toposerve.dra_driver.net.handoff.cni import PLUGIN_TYPE

__all__ = ["DEFAULT_PLUGIN", "RECORD", "InstallError", "chained", "data_dir", "install",
           "plugin_entry", "unchained", "uninstall"]


class InstallError(RuntimeError):
    """The plugin cannot be installed; the message names the file and the fix."""


# what an install changed, in the driver's folder (``data_dir``)
RECORD = "cni-install.json"


def data_dir(kubelet_dir: Path) -> Path:
    """The NIC driver's folder under the node's kubelet root."""
    return kubelet_dir / "plugins/net.toposerve.io"


def plugin_entry(kubelet_dir: Path) -> dict[str, str]:
    """The chain entry: the driver's folders under the node's kubelet root."""
    data = data_dir(kubelet_dir)
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


def _sha(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _read_record(record: Path) -> dict[str, Any]:
    try:
        doc = json.loads(record.read_bytes())
    except FileNotFoundError:
        return {}
    except ValueError as err:
        raise InstallError(f"{record} is not JSON ({err}): remove it (what the last install "
                           "changed is then forgotten) and run again") from None
    return doc if isinstance(doc, dict) else {}


def _write_record(record: Path | None, doc: Mapping[str, Any]) -> None:
    if record is not None:
        write_atomic(record, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())


def _executable(plugin: Path) -> bytes:
    """The bytes of the toposerve-nic binary at ``plugin``."""
    try:
        body = plugin.read_bytes()
    except OSError as err:
        raise InstallError(f"{plugin}: cannot read the toposerve-nic binary ({err.strerror}): "
                           "build it with `make nic-cni` and give its path") from None
    if not body.startswith((b"\x7fELF", b"#!")):  # an empty file would install and never run
        raise InstallError(f"{plugin}: not an executable (no ELF or #! header), so not the "
                           "toposerve-nic binary: build it with `make nic-cni` and give its "
                           "path")
    return body


def _folder(path: Path) -> None:
    """``NotADirectoryError`` (its filename ``path``) when a file is where
    ``path`` or a parent of it would be made."""
    there = path
    while not there.exists() and there != there.parent:
        there = there.parent
    if not there.is_dir():
        why = "not a directory" if there == path else f"{there} is not a directory"
        raise NotADirectoryError(errno.ENOTDIR, why, str(path))


def _chain(path: Path, entry: Mapping[str, Any]
           ) -> tuple[Path, bytes, dict[str, Any] | None]:
    """The conflist at ``path``: its path, its bytes, and it with ``entry``
    chained in (None: it is there already)."""
    try:
        before = path.read_bytes()
    except FileNotFoundError:
        raise InstallError(f"{path}: no such conflist yet (the pod network writes it when it "
                           "starts; this is retried), or fix netDriver.cni.chainInto") from None
    try:
        doc = json.loads(before)
    except ValueError as err:
        raise InstallError(f"{path} is not JSON ({err}): fix the file or "
                           "netDriver.cni.chainInto") from None
    if not isinstance(doc, dict):
        raise InstallError(f"{path}: not a JSON object: fix netDriver.cni.chainInto")
    try:
        return path, before, chained(doc, entry)
    except InstallError as err:
        raise InstallError(f"{path}: {err}") from None


def install(bin_dir: Path, plugin: Path, conf_dir: Path | None = None,
            chain_into: str | None = None, entry: Mapping[str, Any] | None = None,
            record: Path | None = None) -> list[str]:
    """Copy the executable ``plugin`` (the Go forwarder) into
    ``bin_dir``; chain ``entry`` into ``conf_dir/chain_into`` when given.
    Each change is noted in ``record`` (when given) before it is made, so
    ``uninstall`` can undo it. Every input is read and checked before
    anything is written. Returns what changed (file paths)."""
    changed = []
    exe = bin_dir / PLUGIN_TYPE
    body = _executable(plugin)
    for folder in (bin_dir, *([record.parent] if record is not None else [])):
        _folder(folder)
    conflist = None
    if chain_into is not None:
        assert conf_dir is not None and entry is not None
        conflist = _chain(conf_dir / chain_into, entry)
    done = _read_record(record) if record is not None else {}
    if not exe.exists() or exe.read_bytes() != body:
        if done.get("binary", {}).get("path") != str(exe):
            # the first install that writes it says whether it was there before
            done["binary"] = {"path": str(exe), "created": not exe.exists()}
            _write_record(record, done)
        write_atomic(exe, body, mode=0o755)
        changed.append(str(exe))
    if conflist is None:
        return changed
    assert entry is not None
    path, before, new = conflist
    if new is not None:
        body = (json.dumps(new, indent=2) + "\n").encode()
        done["conflist"] = {"path": str(path), "before": base64.b64encode(before).decode(),
                            "written": _sha(body), "entry": dict(entry)}
        _write_record(record, done)
        write_atomic(path, body, mode=path.stat().st_mode & 0o777)
        changed.append(str(path))
    return changed


def unchained(conflist: Mapping[str, Any], entry: Mapping[str, Any]) -> dict[str, Any] | None:
    """``conflist`` without the plugins equal to ``entry``; None when there
    is none (an operator's own, differently configured entry is kept)."""
    plugins = conflist.get("plugins")
    if not isinstance(plugins, list) or dict(entry) not in plugins:
        return None
    return {**conflist, "plugins": [p for p in plugins if p != dict(entry)]}


def uninstall(record: Path) -> list[str]:
    """Undo what the installs noted in ``record``: the conflist's bytes from
    before when it is still what was written (else our entry alone taken out
    of it, if there), the executable removed if an install made it; then the
    record. Nothing recorded: nothing to do. Returns what changed (paths)."""
    done = _read_record(record)
    changed = []
    conf = done.get("conflist")
    if conf:
        path = Path(conf["path"])
        try:
            now = path.read_bytes()
        except FileNotFoundError:
            now = None
        if now is not None and _sha(now) == conf["written"]:
            write_atomic(path, base64.b64decode(conf["before"]), mode=path.stat().st_mode & 0o777)
            changed.append(str(path))
        elif now is not None:
            try:
                doc = json.loads(now)
            except ValueError:
                doc = None  # not ours to fix
            out = unchained(doc, conf["entry"]) if isinstance(doc, dict) else None
            if out is not None:
                write_atomic(path, (json.dumps(out, indent=2) + "\n").encode(),
                             mode=path.stat().st_mode & 0o777)
                changed.append(str(path))
    binary = done.get("binary")
    if binary and binary.get("created") and Path(binary["path"]).exists():
        Path(binary["path"]).unlink()
        changed.append(binary["path"])
    record.unlink(missing_ok=True)
    return changed
