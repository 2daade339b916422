"""A model server restarted behind the router holds none of what was sent
to it before: the approximate prefix index forgets that endpoint's blocks
once the server answers as a new process (its process start time changed),
and keeps them for a server that was only out of reach for a while."""

from __future__ import annotations

import os
import signal

from harness.procs import Proc, Procs
from harness.waiting import wait_for
from tests.router.test_prefix_routing import chat, turn_messages

APPROX = {"scrape": {"intervalSeconds": 0.05, "timeoutSeconds": 0.3,
                     "healthIntervalSeconds": 0.2}}


def approx_blocks(router: Proc, endpoint: str) -> float:
    return router.metric("toposerve_router_endpoint_prefix_blocks", endpoint=endpoint,
                         index="approx")


def healthy(router: Proc, endpoint: str) -> bool:
    return router.metric("toposerve_router_endpoint_healthy", endpoint=endpoint) == 1.0


def test_a_restarted_server_loses_its_approximate_blocks(procs: Procs) -> None:
    sim = procs.sim()
    router = procs.router(APPROX, endpoints=[sim.url])
    where, _ = chat(router, turn_messages(0, 2))
    assert approx_blocks(router, where) > 0
    port = int(sim.url.rsplit(":", 1)[1])
    sim.stop()
    wait_for("the router sees the server gone", lambda: not healthy(router, where), timeout=10)
    procs.sim(port=port)  # a new process on the same address
    wait_for("the server back", lambda: healthy(router, where), timeout=20)
    wait_for("its blocks forgotten", lambda: approx_blocks(router, where) == 0, timeout=5)
    assert "endpoint restarted" in router.log.read_text()


def test_a_server_only_out_of_reach_keeps_them(procs: Procs) -> None:
    sim = procs.sim()
    router = procs.router(APPROX, endpoints=[sim.url])
    where, _ = chat(router, turn_messages(1, 2))
    held = approx_blocks(router, where)
    assert held > 0
    os.kill(sim.popen.pid, signal.SIGSTOP)  # its scrapes time out: unhealthy, same process
    try:
        wait_for("the router sees it out of reach", lambda: not healthy(router, where),
                 timeout=10)
    finally:
        os.kill(sim.popen.pid, signal.SIGCONT)
    wait_for("the server back", lambda: healthy(router, where), timeout=20)
    assert approx_blocks(router, where) == held
    assert "endpoint restarted" not in router.log.read_text()
