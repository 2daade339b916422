"""Replacing a file atomically: a reader (the kubelet, a container runtime,
a CNI plugin in another process) sees the old content or the new, never
half a file, and the new content survives a crash once this returns."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, body: bytes, *, mode: int = 0o600) -> None:
    """Temp file beside ``path`` (a dot name ending in ``.tmp``, so a scan
    for ``*.json`` never sees it), fsync, rename, fsync of the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dirfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dirfd)  # the rename itself must survive a power cut
    finally:
        os.close(dirfd)


def remove_temp_files(folder: Path) -> int:
    """Temp files of writes a crash interrupted (the files themselves are
    intact: the rename never happened)."""
    if not folder.is_dir():
        return 0
    stale = list(folder.glob(".*.tmp"))
    for p in stale:
        p.unlink(missing_ok=True)
    return len(stale)
