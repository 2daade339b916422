"""Removing every trace of a real node: processes (kubelet, containerd, the
shims, the containers' own), mounts, network namespaces, cgroups and state
directories. Safe to run at any time, also after a crash or a failed start,
and a second time."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from toposerve.localcluster.processes import commands_under
from toposerve.localcluster.realnode import nics
from toposerve.localcluster.realnode.paths import Layout

MNT_DETACH = 2
Progress = Callable[[str], None]


class TeardownError(RuntimeError):
    pass


def alive(pid: int) -> bool:
    """Running and not a zombie (a zombie's cmdline is empty)."""
    try:
        return bool(Path(f"/proc/{pid}/cmdline").read_bytes())
    except OSError:
        return False


def our_processes(layout: Layout) -> dict[int, str]:
    """PID -> program of the kubelet, containerd, shims and CNI plugin runs:
    each names one of our directories on its command line."""
    found: dict[int, str] = {}
    for root in (layout.run, layout.home):
        found.update(commands_under(root))
    return found


def signal_and_wait(pids: Iterable[int], grace_s: float) -> list[int]:
    """SIGTERM, then SIGKILL what is left after ``grace_s``; reaps our own
    children. Returns the PIDs that had to be killed."""
    pids = [p for p in pids if alive(p)]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        _reap(pids)
        time.sleep(0.05)
    killed = [p for p in pids if alive(p)]
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any(alive(p) for p in killed) and time.monotonic() < deadline:
        _reap(killed)
        time.sleep(0.05)
    _reap(pids)
    return killed


def _reap(pids: Iterable[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def container_states(runc_root: Path) -> dict[Path, dict[str, Any]]:
    """runc's state file of every container under our root (the shim keeps
    one root per containerd namespace: ``<root>/k8s.io/<id>/state.json``)."""
    out: dict[Path, dict[str, Any]] = {}
    for state in sorted(runc_root.glob("*/*/state.json")):
        try:
            out[state.parent] = json.loads(state.read_text())
        except (OSError, ValueError):
            out[state.parent] = {}
    return out


def delete_containers(runc: Path, runc_root: Path) -> list[str]:
    """Kill and delete every container runc knows under our root (their
    processes and cgroups go with them); returns their IDs."""
    states = container_states(runc_root)
    for cdir in states:
        subprocess.run([str(runc), "--root", str(cdir.parent), "delete", "--force", cdir.name],
                       capture_output=True, timeout=30, check=False)
    for st in states.values():
        remove_cgroups(sorted({Path(p) for p in (st.get("cgroup_paths") or {}).values()}))
    return [c.name for c in states]


def remove_cgroups(dirs: Iterable[Path]) -> None:
    """Kill what is still in each cgroup, then remove it (children first)."""
    for d in dirs:
        if not d.is_dir():
            continue
        for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            _kill_and_rmdir(sub)
        _kill_and_rmdir(d)


def _kill_and_rmdir(d: Path) -> None:
    with contextlib.suppress(OSError):
        for pid in (d / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    deadline = time.monotonic() + 5
    while True:
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return  # reported by the caller's check of what is left
            time.sleep(0.05)


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for esc, ch in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(esc, ch)
    return field


def mounts_under(roots: Iterable[Path], mountinfo: str | None = None) -> list[Path]:
    """Mount points at or below any of ``roots``, deepest first."""
    text = mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text()
    prefixes = [str(r).rstrip("/") for r in roots]
    found = set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 5:
            continue
        point = _unescape(parts[4])
        if any(point == p or point.startswith(p + "/") for p in prefixes):
            found.add(Path(point))
    return sorted(found, key=lambda p: (-len(p.parts), str(p)))


def unmount_all(roots: Iterable[Path]) -> list[Path]:
    """Lazily unmount everything below ``roots`` (stacked mounts too);
    returns what could not be unmounted."""
    libc = ctypes.CDLL(None, use_errno=True)
    roots = list(roots)
    for _ in range(8):  # a path can carry several stacked mounts
        points = mounts_under(roots)
        if not points:
            return []
        for point in points:
            libc.umount2(str(point).encode(), MNT_DETACH)
    return mounts_under(roots)


def remove_trees(paths: Iterable[Path]) -> None:
    """Delete our state directories, but never through a mount point that is
    still there: that could reach a host directory a pod had mounted."""
    paths = list(paths)
    left = mounts_under(paths)
    if left:
        raise TeardownError(f"still mounted, not deleting: {', '.join(map(str, left[:5]))}")
    for p in paths:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    stuck = [str(p) for p in paths if p.exists()]
    if stuck:
        raise TeardownError(f"could not delete {', '.join(stuck)}")


def clean_host(layout: Layout, runc: Path, progress: Progress) -> None:
    """Everything after the kubelet is gone: containerd, the containers,
    the shims, mounts, cgroups, the NRI socket, the state directories."""
    procs = our_processes(layout)
    daemons = [p for p, name in procs.items() if name in ("kubelet", "containerd")]
    if signal_and_wait(daemons, grace_s=10):
        progress("kubelet/containerd did not stop on SIGTERM: killed")
    ids = delete_containers(runc, layout.runc_root)
    if ids:
        progress(f"deleted {len(ids)} containers")
    remove_cgroups(layout.runtime_cgroups())
    rest = list(our_processes(layout))  # the shims, and a CNI call caught mid-way
    signal_and_wait(rest, grace_s=3)
    left_procs = [p for p in our_processes(layout) if alive(p)]
    if left_procs:
        raise TeardownError(f"processes still running: {left_procs}")
    left = unmount_all(layout.state_roots())
    if left:
        raise TeardownError(f"could not unmount {', '.join(map(str, left[:5]))}")
    if layout.nri_socket.is_socket():
        layout.nri_socket.unlink()
        with contextlib.suppress(OSError):
            layout.nri_socket.parent.rmdir()
    nics.remove()  # the NIC stand-ins, after the pods' namespaces (and the NICs in them)
    remove_trees(layout.state_roots())


DAEMONS = ("kubelet", "containerd", "containerd-shim-runc-v2")


def leftovers(layout: Layout, mountinfo: str | None = None) -> list[str]:
    """What a clean machine must not have: a kubelet, containerd or shim
    process anywhere, a mount or network namespace under our paths, a state
    directory, the NRI socket, containerd's cgroups. Empty after every teardown."""
    found = [f"process {pid} {name}" for pid, name in sorted(_programs().items())
             if name in DAEMONS]
    found += [f"process {pid} {name}" for pid, name in sorted(our_processes(layout).items())
              if name not in DAEMONS]
    text = mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text()
    found += [f"mount {p}" for p in mounts_under(layout.state_roots(), text)]
    found += [f"netns {line.split()[4]}" for line in text.splitlines()
              if " - nsfs " in line and "/cni-" in line.split()[4]]
    found += [f"path {p}" for p in (*layout.state_roots(), layout.nri_socket,
                                    nics.FABRIC_NETNS) if p.exists()]
    found += [f"cgroup {p}" for p in layout.runtime_cgroups()]
    return found


def _programs() -> dict[int, str]:
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv0 = (entry / "cmdline").read_bytes().split(b"\0")[0]
            except OSError:
                continue
            if argv0:
                out[int(entry.name)] = Path(argv0.decode(errors="replace")).name
    return out
