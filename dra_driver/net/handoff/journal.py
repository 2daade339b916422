"""The mover's journal: one fsynced file per NIC that is in a pod or on its
way, written *before* each step, so that after a crash the next ADD, DEL or
startup repair knows where the interface may be and what it must look like
back on the host (its name, MTU and MAC), and can finish or undo the move.

Keyed by the host interface name: a NIC is in at most one pod at a time.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from toposerve.dra_driver.kubeletplugin.files import remove_temp_files, write_atomic
from toposerve.dra_driver.net.config import NetConfig, check_ifname

VERSION = 1
DEFAULT_JOURNAL_DIR = Path("/var/lib/kubelet/plugins/net.toposerve.io/journal")


class Step(StrEnum):
    ATTACHING = "Attaching"  # about to move into the pod, or part-way configured there
    ATTACHED = "Attached"    # in the pod, configured
    DETACHING = "Detaching"  # about to leave the pod, or part-way restored on the host


class Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    hostIfName: str
    podIfName: str
    mac: str              # to find the link whatever its name (the kernel may rename it)
    hostMtu: int          # to restore on the way back
    sandbox: str          # the CNI container ID (the pod sandbox)
    netns: str            # the sandbox's network namespace path
    config: NetConfig     # what the link must look like in the pod
    step: Step


class CorruptJournal(RuntimeError):
    """A journal file cannot be read; names the file and the fix."""


class Journal:
    def __init__(self, folder: Path = DEFAULT_JOURNAL_DIR) -> None:
        self.folder = folder

    def path(self, host_ifname: str) -> Path:
        return self.folder / f"{check_ifname(host_ifname)}.json"

    def write(self, entry: Entry) -> None:
        body = json.dumps({"version": VERSION, "entry": entry.model_dump(mode="json")},
                          sort_keys=True).encode()
        write_atomic(self.path(entry.hostIfName), body)

    def remove(self, host_ifname: str) -> None:
        self.path(host_ifname).unlink(missing_ok=True)
        with contextlib.suppress(FileNotFoundError):
            fd = os.open(self.folder, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def read(self, host_ifname: str) -> Entry | None:
        return self._load(self.path(host_ifname))

    def entries(self) -> list[Entry]:
        if not self.folder.is_dir():
            return []
        remove_temp_files(self.folder)  # a crash mid-write: the old entry stands
        found = [self._load(p) for p in sorted(self.folder.glob("*.json"))]
        return [e for e in found if e is not None]

    def _load(self, path: Path) -> Entry | None:
        try:
            doc = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except ValueError as err:
            raise CorruptJournal(f"journal {path} is not JSON ({err}); find the interface "
                                 "by hand (ip link), then remove the file") from None
        try:
            if doc.get("version") != VERSION:
                raise ValueError(f"version {doc.get('version')!r}, this reads {VERSION}")
            return Entry.model_validate(doc["entry"])
        except (ValueError, KeyError, AttributeError, ValidationError) as err:
            raise CorruptJournal(f"journal {path} is unreadable ({err}); find the interface "
                                 "by hand (ip link), then remove the file") from None

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """One mover at a time on this node: concurrent ADDs and DELs (and a
        startup repair) would otherwise race over the same files and links."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / ".lock", "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
