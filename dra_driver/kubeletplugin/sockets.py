"""Where the plugin's unix sockets and lock file live, and listening on them.

Defaults are the kubelet's: registration sockets in
``/var/lib/kubelet/plugins_registry``, the DRA service socket in
``/var/lib/kubelet/plugins/<driver>``. In rolling-update mode two plugin pods
run side by side, so both socket names carry the pod UID; a registration
path that would not fit AF_UNIX's 108 bytes falls back to hashed names,
preferring ones that still show the driver name.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import os
import socket
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

KUBELET_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
KUBELET_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")
UNIX_PATH_MAX = 108
UID_HASH_BYTES = 8  # enough for node-local uniqueness of two overlapping pods
DRIVER_UID_HASH_BYTES = 16


def _b64_sha256(data: str, n: int) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data.encode()).digest()[:n]).decode().rstrip("=")


def registration_socket_name(registry_dir: Path, driver: str, pod_uid: str | None) -> str:
    """``<driver>-reg.sock``; with a pod UID the first of
    ``<driver>-<uid>-reg.sock``, ``<driver>-<hash(uid)>-reg.sock`` and
    ``dra-<hash(driver, uid)>-reg.sock`` whose full path fits."""
    if not pod_uid:
        return f"{driver}-reg.sock"
    candidates = [
        f"{driver}-{pod_uid}-reg.sock",
        f"{driver}-{_b64_sha256(pod_uid, UID_HASH_BYTES)}-reg.sock",
        f"dra-{_b64_sha256(driver + chr(0) + pod_uid, DRIVER_UID_HASH_BYTES)}-reg.sock",
    ]
    for name in candidates:
        if len(str(registry_dir / name)) <= UNIX_PATH_MAX:
            return name
    return candidates[-1]


@dataclass(frozen=True)
class PluginPaths:
    driver: str
    registry_dir: Path = KUBELET_REGISTRY_DIR
    plugin_dir: Path | None = None  # default: KUBELET_PLUGINS_DIR / driver
    pod_uid: str | None = None      # rolling-update mode when set

    @property
    def data_dir(self) -> Path:
        return self.plugin_dir or KUBELET_PLUGINS_DIR / self.driver

    @property
    def registration_socket(self) -> Path:
        return self.registry_dir / registration_socket_name(self.registry_dir, self.driver,
                                                            self.pod_uid)

    @property
    def dra_socket(self) -> Path:
        # The directory is the driver's own, so only rolling updates need the UID.
        return self.data_dir / (f"dra-{self.pod_uid}.sock" if self.pod_uid else "dra.sock")

    @property
    def lock_file(self) -> Path:
        """Serializes prepare/unprepare across every plugin process of this driver."""
        return self.data_dir / "serialize.lock"

    @property
    def checkpoint(self) -> Path:
        return self.data_dir / "checkpoint.json"

    def check(self) -> None:
        for sock in (self.registration_socket, self.dra_socket):
            if len(str(sock)) > UNIX_PATH_MAX:
                raise PathError(errno.ENAMETOOLONG, f"longer than the {UNIX_PATH_MAX} bytes "
                                "a unix socket's path may have", str(sock))


class PathError(OSError):
    """A folder or socket of the plugin cannot be had; ``filename`` is the
    path, ``strerror`` why (a caller knows which of its options names it)."""


def make_folder(path: Path) -> None:
    """``path`` and its parents, as ``mkdir -p``; ``PathError`` if not."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError as err:  # mkdir's word for a file where a folder goes
        raise PathError(errno.ENOTDIR, "not a directory", err.filename) from None
    except OSError as err:  # under a file, no permission
        raise PathError(err.errno, err.strerror, err.filename or str(path)) from None


def remove_stale_socket(path: Path) -> bool:
    """Remove a socket left by an earlier process (listening would fail).
    Anything that is not a socket is left alone and reported."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(st.st_mode):
        raise PathError(errno.EEXIST, "exists and is not a socket; not removing it", str(path))
    path.unlink()
    return True


def bind_error(path: Path) -> str:
    """Why a unix socket cannot listen at ``path``: gRPC says only that it
    could not, so a plain bind is tried for the reason."""
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.bind(str(path))
        except OSError as err:
            return err.strerror or str(err)
    path.unlink(missing_ok=True)
    return "gRPC cannot listen there"


def unix_address(path: Path) -> str:
    return f"unix://{os.fspath(path)}"


# gRPC's C core binds and dials at most this long a unix path, shorter than
# AF_UNIX allows (the kubelet, in Go, dials up to 108 bytes).
GRPC_PATH_MAX = 105


@contextlib.contextmanager
def grpc_target(path: Path) -> Iterator[str]:
    """A ``unix://`` target for ``path``, valid inside the ``with``. A path
    too long for gRPC goes through ``/proc/self/fd/<dir fd>/<name>``: the
    kernel resolves it, so the socket is still exactly at ``path``."""
    if len(str(path)) <= GRPC_PATH_MAX:
        yield unix_address(path)
        return
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"unix:///proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)
