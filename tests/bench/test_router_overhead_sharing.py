"""``bench.router_overhead --sharing``'s baseline really shares nothing: two
workers started as it starts them serve every request, and neither hears
a decision of the other's. Real processes: the router parent, its two
workers and simulated model servers."""

from __future__ import annotations

from pathlib import Path

import psutil

from bench.router_overhead import ours_unshared
from harness.procs import Procs
from tests.router.sharing import decisions, turn


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def test_the_unshared_workers_share_no_decision(tmp_path: Path) -> None:
    procs = Procs(tmp_path)
    try:
        sims = [procs.sim(time_scale=0.02) for _ in range(3)]
        router = ours_unshared(procs, sims)
        workers = psutil.Process(router.popen.pid).children()
        assert len(workers) == 2
        before = [_cpu(w) for w in workers]
        for s in range(16):
            for n in range(3):
                turn(router.url, s, n)
        used = [_cpu(w) - b for w, b in zip(workers, before, strict=True)]
        # both took connections (the kernel spreads 48: a few ms each at least)
        assert all(u > 0.01 for u in used), used
        # where two sharing workers apply each other's (test_router_workers), none here
        assert decisions(router, "received") == 0
    finally:
        procs.close()
