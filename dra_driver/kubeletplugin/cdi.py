"""Container Device Interface (spec 1.1.0) files: one transient spec per
prepared claim, written atomically so a container runtime never reads half
a file, and removed on unprepare.

A device id is ``<vendor>/<class>=<claim uid>-<device>``: the claim UID makes
every name new, so a runtime that caches specs can never hit a stale entry.
Both are checked (``validation``) before they name a file or an id, so a
spec file is always directly under the root.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toposerve.dra_driver.kubeletplugin import validation
from toposerve.dra_driver.kubeletplugin.files import write_atomic

CDI_VERSION = "1.1.0"
DEFAULT_CDI_ROOT = Path("/var/run/cdi")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class DeviceNode:
    path: str                     # in the container
    host_path: str | None = None  # on the host, when it differs
    permissions: str = "rw"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "permissions": self.permissions}
        if self.host_path is not None:
            out["hostPath"] = self.host_path
        return out


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    options: tuple[str, ...] = ("ro", "nosuid", "nodev", "bind")

    def to_json(self) -> dict[str, Any]:
        return {"hostPath": self.host_path, "containerPath": self.container_path,
                "options": list(self.options)}


@dataclass(frozen=True)
class ContainerEdits:
    env: Mapping[str, str] = field(default_factory=dict)
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()

    def __post_init__(self) -> None:
        bad = [k for k in self.env if not ENV_NAME.fullmatch(k)]
        if bad:
            raise ValueError(f"not an environment variable name: {', '.join(bad)}")

    def empty(self) -> bool:
        return not (self.env or self.device_nodes or self.mounts)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.env:
            out["env"] = [f"{k}={v}" for k, v in sorted(self.env.items())]
        if self.device_nodes:
            out["deviceNodes"] = [d.to_json() for d in self.device_nodes]
        if self.mounts:
            out["mounts"] = [m.to_json() for m in self.mounts]
        return out


class CdiSpecs:
    """The spec files of one driver under one CDI root.

    ``vendor`` is the driver's CDI vendor (e.g. ``k8s.gpu.toposerve.io``),
    ``cls`` its device class; both name the files, so files of other drivers
    in the same root are never touched.
    """

    def __init__(self, root: Path, vendor: str, cls: str) -> None:
        self.root = root
        self.vendor = vendor
        self.cls = cls

    @property
    def kind(self) -> str:
        return f"{self.vendor}/{self.cls}"

    def _prefix(self) -> str:
        return f"{self.vendor}_{self.cls}-"

    def path(self, claim_uid: str) -> Path:
        """Raises ``validation.InvalidName`` for anything but a Kubernetes UID."""
        return self.root / f"{self._prefix()}{validation.uid(claim_uid)}.json"

    def device_id(self, claim_uid: str, device: str) -> str:
        return f"{self.kind}={validation.uid(claim_uid)}-{validation.label(device, 'device')}"

    def spec(self, claim_uid: str, devices: Mapping[str, ContainerEdits],
             common: ContainerEdits) -> dict[str, Any]:
        # CDI requires at least one edit per device; a device with nothing
        # to inject still names itself in the environment.
        entries = [{"name": f"{claim_uid}-{name}",
                    "containerEdits": (edits if not edits.empty() else ContainerEdits(
                        env={"TOPOSERVE_CDI_DEVICE": name})).to_json()}
                   for name, edits in devices.items()]
        out: dict[str, Any] = {"cdiVersion": CDI_VERSION, "kind": self.kind, "devices": entries}
        if not common.empty():
            # Spec-wide edits apply once to a container that uses any device of the claim.
            out["containerEdits"] = common.to_json()
        return out

    def write(self, claim_uid: str, devices: Mapping[str, ContainerEdits],
              common: ContainerEdits) -> dict[str, str]:
        """Write the claim's spec; returns device name -> CDI device id."""
        ids = {name: self.device_id(claim_uid, name) for name in devices}  # checks the names
        body = json.dumps(self.spec(claim_uid, devices, common), indent=1).encode()
        # The temp file does not end in .json: a runtime scanning the root never sees it.
        write_atomic(self.path(claim_uid), body, mode=0o644)
        return ids

    def remove(self, claim_uid: str) -> bool:
        try:
            self.path(claim_uid).unlink()
        except FileNotFoundError:
            return False
        return True

    def _files(self) -> dict[str, Path]:
        """Claim UID -> its spec file, of the spec files of ours under the root."""
        if not self.root.is_dir():
            return {}
        prefix = self._prefix()
        return {p.name[len(prefix):-len(".json")]: p for p in self.root.iterdir()
                if p.name.startswith(prefix) and p.name.endswith(".json")}

    def claims(self) -> set[str]:
        """UIDs of the claims that have a spec file of ours under the root."""
        return set(self._files())

    def remove_all_but(self, keep: Iterable[str]) -> list[str]:
        """Remove spec files of claims not in ``keep`` and half-written temp
        files: the leftovers of a crash. Returns the claim UIDs removed."""
        files = self._files()
        stale = sorted(files.keys() - set(keep))
        for uid in stale:  # by the listed file: an older driver's name need not be a UID
            files[uid].unlink(missing_ok=True)
        for tmp in self.root.glob(f".{self._prefix()}*.tmp") if self.root.is_dir() else []:
            tmp.unlink(missing_ok=True)
        return stale
