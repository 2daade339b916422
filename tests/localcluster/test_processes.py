"""end_process: SIGTERM, SIGKILL only for a child that outlives its grace,
and the exit code either way. commands_under: a cluster's processes, not
another's whose directory its own is a prefix of."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from toposerve.localcluster.processes import commands_under, end_process


def _child(setup: str = "pass") -> subprocess.Popen[str]:
    """A child that says "ready" once ``setup`` has run, then reads its
    stdin to the end and exits 0."""
    code = f"import signal, sys; {setup}; print('ready', flush=True); sys.stdin.read()"
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def test_a_child_that_stops_on_sigterm_is_not_killed() -> None:
    with _child() as proc:
        started = time.monotonic()
        assert end_process(proc, 30) == -signal.SIGTERM
        assert time.monotonic() - started < 10  # did not sit out the grace


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace() -> None:
    with _child("signal.signal(signal.SIGTERM, signal.SIG_IGN)") as proc:
        started = time.monotonic()
        assert end_process(proc, 0.5) == -signal.SIGKILL
        assert time.monotonic() - started >= 0.5


def test_a_child_that_has_exited_keeps_its_exit_code() -> None:
    with _child() as proc:
        assert proc.stdin is not None
        proc.stdin.close()  # end of input: it exits 0
        proc.wait(30)
        assert end_process(proc, 30) == 0


def test_processes_under_a_directory_are_not_those_of_a_longer_name(tmp_path: Path) -> None:
    # `cluster down --name toposerve` must not find (and kill) toposerve-test's
    longer = tmp_path / "clusters" / "toposerve-test"
    code = "import sys; print('ready', flush=True); sys.stdin.read()"
    procs = [subprocess.Popen([sys.executable, "-c", code, arg], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
             for arg in (f"--kubeconfig={longer}/kubeconfig.yaml", str(longer))]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        pids = {p.pid for p in procs}
        assert pids <= set(commands_under(longer))
        assert pids <= set(commands_under(Path(f"{longer}/")))
        assert not pids & set(commands_under(tmp_path / "clusters" / "toposerve"))
    finally:
        for proc in procs:
            end_process(proc, 5)
