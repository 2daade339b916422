"""Hand-off records: what the driver's ``prepare`` tells the hand-off (the
CNI plugin, another process) about a claim's NICs, one JSON file a claim
under the state folder.

``prepare`` writes the record after validating the claim's config,
``unprepare`` removes it; the hand-off's ADD reads the records of the pod
it is setting up (``records_for_pod``) and moves those NICs into the pod's
network namespace. Files are replaced atomically, so a reader never sees
half a record. A file that fails its checks raises ``CorruptRecord``
naming it: it is never silently skipped or replaced.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from toposerve.dra_driver.kubeletplugin import validation
from toposerve.dra_driver.kubeletplugin.files import remove_temp_files, write_atomic
from toposerve.dra_driver.kubeletplugin.opaque import problems
from toposerve.dra_driver.net.config import NetConfig

VERSION = 1
DEFAULT_STATE_DIR = Path("/var/lib/kubelet/plugins/net.toposerve.io/handoff")


class CorruptRecord(RuntimeError):
    """A record file cannot be read; the message names the file and the fix."""


class NicHandoff(BaseModel):
    """One allocated NIC of one claim."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    device: str = Field(description="the DRA device name")
    hostIfName: str = Field(description="the interface's name on the host: to find it, "
                                        "and to name it back")
    pciAddress: str | None = None
    config: NetConfig = Field(default_factory=NetConfig)
    rdmaDevice: str | None = None


class ClaimRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    claimUid: str
    claim: str = Field(description="namespace/name")
    podUids: list[str] = Field(description="the claim's status.reservedFor pods at prepare")
    nics: list[NicHandoff]


def record_path(state_dir: Path, claim_uid: str) -> Path:
    """Raises ``validation.InvalidName`` for anything but a Kubernetes UID:
    it could name a path outside the folder."""
    return state_dir / f"{validation.uid(claim_uid)}.json"


def write_record(state_dir: Path, rec: ClaimRecord) -> None:
    """Create or replace the claim's record, atomically."""
    body = json.dumps({"version": VERSION, "record": rec.model_dump(mode="json")},
                      indent=1, sort_keys=True).encode()
    write_atomic(record_path(state_dir, rec.claimUid), body, mode=0o644)


def remove_record(state_dir: Path, claim_uid: str) -> None:
    """Remove the claim's record; nothing to do when there is none."""
    record_path(state_dir, claim_uid).unlink(missing_ok=True)


def _load(path: Path) -> ClaimRecord | None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:  # removed since the folder was listed
        return None

    def corrupt(why: str) -> CorruptRecord:
        return CorruptRecord(f"hand-off record {path} is unreadable ({why}); inspect it, then "
                             "remove it (the driver rewrites it when the claim is prepared "
                             "again)")
    try:
        doc: Any = json.loads(raw)
    except ValueError as err:
        raise corrupt(f"not JSON: {err}") from None
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        version = doc.get("version") if isinstance(doc, dict) else None
        raise corrupt(f"version {version!r}, this reads {VERSION}")
    try:
        rec = ClaimRecord.model_validate(doc.get("record"))
    except ValidationError as err:
        raise corrupt(problems(err)) from None
    if path.name != f"{rec.claimUid}.json":
        raise corrupt(f"it holds claim {rec.claimUid}")
    return rec


def read_record(state_dir: Path, claim_uid: str) -> ClaimRecord | None:
    """The claim's record; None when there is none."""
    return _load(record_path(state_dir, claim_uid))


def all_records(state_dir: Path) -> list[ClaimRecord]:
    """Every record under the folder, by claim UID."""
    if not state_dir.is_dir():
        return []
    out = [_load(p) for p in sorted(state_dir.glob("*.json"))]
    return [r for r in out if r is not None]


def records_for_pod(state_dir: Path, pod_uid: str) -> list[ClaimRecord]:
    """The records of the claims reserved for this pod."""
    return [r for r in all_records(state_dir) if pod_uid in r.podUids]


def remove_stale(state_dir: Path, keep: set[str]) -> list[str]:
    """Remove records of claims not in ``keep`` (prepared claims) and temp
    files of interrupted writes: the leftovers of a crash. Returns the claim
    UIDs removed."""
    stale = sorted(r.claimUid for r in all_records(state_dir) if r.claimUid not in keep)
    for uid in stale:
        remove_record(state_dir, uid)
    remove_temp_files(state_dir)
    return stale
