"""Finding and ending the processes a local cluster started: every one of
them runs from, or names, the cluster's own directory; and ending one child
we started ourselves (``end_process``)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any


def commands_under(path: Path) -> dict[int, str]:
    """PID -> program name of every process whose command line mentions
    ``path`` or a file under it: not a path it is only a prefix of, since
    the cluster ``toposerve``'s directory is a prefix of ``toposerve-test``'s."""
    needle = re.compile(re.escape(str(path).rstrip("/").encode()) + rb"(?:/|\0|$)")
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle.search(cmdline):
            found[int(entry.name)] = Path(cmdline.split(b"\0")[0].decode()).name
    return found


def processes_under(path: Path) -> list[int]:
    """PIDs whose command line mentions ``path``."""
    return list(commands_under(path))


def end_processes(path: Path, grace_s: float = 10.0) -> list[int]:
    """Wait for processes under ``path`` to exit; SIGKILL what is left after
    ``grace_s``. Returns the PIDs that had to be killed."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not processes_under(path):
            return []
        time.sleep(0.1)
    killed = processes_under(path)
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return killed


def end_process(proc: subprocess.Popen[Any], grace_s: float) -> int:
    """SIGTERM ``proc``, then SIGKILL it if it has not exited after ``grace_s``;
    its exit code (negative: the signal that ended it). One that has already
    exited is only reaped."""
    proc.terminate()  # a no-op once it has exited (Popen checks first)
    try:
        return proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
