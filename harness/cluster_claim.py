"""A test run's claim on a named local cluster.

Test sessions on one machine each bring up a cluster of a fixed name and
remove one of that name left over from an interrupted run. Two live runs
with the same name (one without ``TOPOSERVE_TEST_CLUSTER`` set, say) would
then delete each other's cluster mid-run, which shows up as 401s and
vanished nodes far from the cause. So a run records itself as the holder of
the name, and a second live run is refused with what to do instead.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from toposerve.localcluster.cluster import Progress, down, running_clusters

HOLDERS = Path.home() / ".toposerve" / "cluster-holders"


class ClusterInUse(RuntimeError):
    pass


def _identity(pid: int) -> str:
    """The pid with its start time, so a reused pid is not taken for the holder."""
    return f"{pid} {psutil.Process(pid).create_time():.2f}"


def live_holder(record: str) -> int | None:
    """The pid of a holder record ("pid start-time") if that process still runs."""
    try:
        pid = int(record.split()[0])
        return pid if _identity(pid) == record.strip() else None
    except (ValueError, IndexError, psutil.Error):
        return None


def _take(path: Path) -> None:
    """Writes this process's record; only one of two racing runs wins."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise ClusterInUse(f"another run claimed {path.stem!r} just now") from None
    with os.fdopen(fd, "w") as f:
        f.write(_identity(os.getpid()))


@contextmanager
def claimed(name: str, progress: Progress | None = None) -> Iterator[None]:
    """Holds the cluster ``name`` for this process while the block runs: refuses
    when another live process holds it, removes a leftover cluster of that
    name, and on exit tears the cluster down and lets the name go. The block
    brings the cluster up."""
    say: Progress = progress or (lambda m: print(m, file=sys.stderr))
    HOLDERS.mkdir(parents=True, exist_ok=True)
    path = HOLDERS / name
    if path.exists():
        holder = live_holder(path.read_text())
        if holder is not None and holder != os.getpid():
            raise ClusterInUse(
                f"local cluster {name!r} is in use by another test run (pid {holder}); "
                "set TOPOSERVE_TEST_CLUSTER to a name of your own")
        path.unlink(missing_ok=True)  # its holder is gone
    _take(path)
    try:
        if name in running_clusters():
            down(name, progress=say)  # left over from an interrupted run
        yield
    finally:
        try:
            if name in running_clusters():
                down(name, progress=say)
        finally:
            path.unlink(missing_ok=True)
