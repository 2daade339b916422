"""end_process: SIGTERM, SIGKILL only for a child that outlives its grace,
and the exit code either way."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from toposerve.localcluster.processes import end_process


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
