"""The plugin's only state: a versioned checkpoint file of prepared claims.

Each claim is recorded as *started* before any side effect and *completed*
after the last one, so a crash in between is visible on restart and can be
undone. The file carries a checksum and the node's boot id (prepared state
does not survive a reboot) and is replaced atomically: temp file, fsync,
rename, fsync of the directory. A file that fails its checks is reported
(``CorruptCheckpoint``) and left in place, never silently replaced.
"""

from __future__ import annotations

import hashlib
import json
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from toposerve.dra_driver.kubeletplugin.files import write_atomic

VERSION = 1
BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")


class CorruptCheckpoint(RuntimeError):
    """The checkpoint cannot be trusted; the message names the file and the fix."""


class ClaimState(StrEnum):
    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"
    UNPREPARE_STARTED = "UnprepareStarted"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class PreparedDevice(_Model):
    """One device of a claim, as the kubelet is told about it."""

    requests: list[str]
    pool: str
    device: str
    cdi_device_ids: list[str] = Field(default_factory=list, alias="cdiDeviceIds")
    share_id: str | None = Field(default=None, alias="shareId")


class ClaimEntry(_Model):
    namespace: str
    name: str
    state: ClaimState
    devices: list[PreparedDevice] = Field(default_factory=list)


class CheckpointData(_Model):
    boot_id: str = Field(alias="bootId")
    claims: dict[str, ClaimEntry] = Field(default_factory=dict)


def read_boot_id(path: Path = BOOT_ID_FILE) -> str:
    return path.read_text().strip()


def _canonical(data: CheckpointData) -> bytes:
    doc = data.model_dump(mode="json", by_alias=True)
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def checksum(data: CheckpointData) -> str:
    return "sha256:" + hashlib.sha256(_canonical(data)).hexdigest()


class Checkpoint:
    """Reads and writes one checkpoint file; callers serialize access."""

    def __init__(self, path: Path, boot_id: str) -> None:
        self.path = path
        self.boot_id = boot_id

    def _corrupt(self, why: str) -> CorruptCheckpoint:
        return CorruptCheckpoint(
            f"checkpoint {self.path} is corrupt ({why}); it was left in place. Claims it lists "
            "may still hold devices: inspect it, then move it aside to start from nothing")

    def load(self) -> tuple[CheckpointData, bool]:
        """The recorded state, and whether it was written in an earlier boot
        (its claims are then no longer prepared). A missing file is empty."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return CheckpointData(boot_id=self.boot_id), False
        try:
            doc: Any = json.loads(raw)
        except ValueError as err:
            raise self._corrupt(f"not JSON: {err}") from None
        if not isinstance(doc, dict) or doc.get("version") != VERSION:
            version = doc.get("version") if isinstance(doc, dict) else None
            raise self._corrupt(f"version {version!r}, this driver reads {VERSION}")
        try:
            data = CheckpointData.model_validate(doc.get("data"))
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise self._corrupt(f"data.{where}: {first['msg']}") from None
        if doc.get("checksum") != checksum(data):
            raise self._corrupt("checksum mismatch")
        return data, data.boot_id != self.boot_id

    def save(self, data: CheckpointData) -> None:
        data = data.model_copy(update={"boot_id": self.boot_id})
        body = json.dumps({"version": VERSION, "checksum": checksum(data),
                           "data": data.model_dump(mode="json", by_alias=True)},
                          indent=1, sort_keys=True).encode()
        write_atomic(self.path, body)

    def remove_temp_files(self) -> int:
        """Temp files of a write that a crash interrupted (the checkpoint
        itself is intact: the rename never happened)."""
        stale = list(self.path.parent.glob(".checkpoint-*.tmp"))
        for p in stale:
            p.unlink(missing_ok=True)
        return len(stale)
