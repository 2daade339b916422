"""Crash mid-move, 100 trials: a forked mover (ADD, then DEL) is killed by a
timer at a random moment of its work; then the next call (an ADD, a DEL or
a startup repair, chosen at random) must leave the NIC exactly once in a
known place and state: in the pod configured, or on the host as it was.
No trial may lose it."""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.handoff_netns import NetEnv, Nic, net_env
from tests.dra.test_handoff import CONFIG
from toposerve.dra_driver.net.handoff.links import Link

TRIALS = 100
SANDBOX = "sb-crash"


@pytest.fixture
def env(tmp_path: Path) -> Iterator[NetEnv]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (run the tests as root)")
    with net_env(tmp_path, nics=1) as e:
        yield e


def _add_then_del(env: NetEnv) -> None:
    mover = env.mover()
    with env.journal.lock():
        mover.attach(SANDBOX, env.pod, "nic0", CONFIG)
    with env.journal.lock():
        mover.detach_sandbox(SANDBOX)


def _fork_run(env: NetEnv, kill_after_s: float | None) -> int:
    """Runs ``_add_then_del`` in a child; a timer's SIGALRM (its default
    action ends the process on the spot, as a SIGKILL would) cuts it short.
    Returns the child's wait status."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            if kill_after_s is not None:
                signal.signal(signal.SIGALRM, signal.SIG_DFL)
                signal.setitimer(signal.ITIMER_REAL, kill_after_s)
            _add_then_del(env)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


def _placed(env: NetEnv, nic: Nic) -> tuple[str, Link]:
    found = env.where(nic)
    assert len(found) == 1, f"the NIC is in {len(found)} places: {found}"
    return found[0]


def _on_host_as_it_was(env: NetEnv, nic: Nic, where: str, link: Link) -> bool:
    return where == env.host and (link.name, link.mtu, link.up, link.addresses) == (
        nic.host_name, nic.mtu, False, frozenset())


def _in_pod_configured(env: NetEnv, where: str, link: Link) -> bool:
    own = {a for a in link.addresses if not a.ip.is_link_local}
    return where == env.pod and (link.name, link.mtu, link.up, own) == (
        CONFIG.interface_name, CONFIG.mtu, True, set(CONFIG.addresses))


def test_a_mover_killed_at_random_never_loses_the_nic(env: NetEnv) -> None:
    nic = env.nics[0]
    started = time.monotonic()
    assert os.WIFEXITED(status := _fork_run(env, None)) and os.WEXITSTATUS(status) == 0
    full_s = time.monotonic() - started  # one uncut run, fork included
    rnd = random.Random(18)
    mover = env.mover()  # the next caller: one for all trials (opening namespaces is slow)
    killed, outcomes = 0, {"add": 0, "del": 0, "repair": 0}
    for trial in range(TRIALS):
        status = _fork_run(env, rnd.uniform(0.0005, full_s))
        killed += os.WIFSIGNALED(status)
        where, link = _placed(env, nic)  # never lost, never twice, even before repair
        action = rnd.choice(list(outcomes))
        outcomes[action] += 1
        with env.journal.lock():
            if action == "add":
                mover.attach(SANDBOX, env.pod, "nic0", CONFIG)
            elif action == "del":
                mover.repair(keep=lambda e: e.sandbox == SANDBOX)
                mover.detach_sandbox(SANDBOX)
            else:
                mover.repair()
        where, link = _placed(env, nic)
        if action == "add":
            assert _in_pod_configured(env, where, link), (trial, where, link)
        elif action == "del":
            assert _on_host_as_it_was(env, nic, where, link), (trial, where, link)
        else:  # an attached NIC of a live pod stays; anything half-done goes back
            entry = env.journal.read("nic0")
            assert _in_pod_configured(env, where, link) if entry else \
                _on_host_as_it_was(env, nic, where, link), (trial, where, link, entry)
        with env.journal.lock():  # back to the start for the next trial
            mover.detach_sandbox(SANDBOX)
        assert _on_host_as_it_was(env, nic, *_placed(env, nic))
        assert env.journal.entries() == []
    print(f"{TRIALS} trials, {killed} killed mid-run, next call {outcomes}, "
          f"uncut run {full_s * 1000:.0f} ms")
    mover.close()
    assert killed >= TRIALS // 2, "the timer should cut most runs short"
