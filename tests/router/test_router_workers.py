"""``server.workers`` (``toposerve router --workers N``) without Redis: N
router processes on one port share in-flight counts, sessions and routing
decisions through their parent's local bus. Real processes: the router
parent and its workers, simulated model servers; each request on a
connection of its own, so the kernel spreads them over the workers."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml

from harness.procs import Proc, Procs
from harness.waiting import wait_for
from tests.router.sharing import Load, Running, decisions, turn
from toposerve.localcluster.ports import free_port

CAP = 4  # requests an endpoint takes (flow control's concurrency detector)


def _workers(router: Proc) -> list[psutil.Process]:
    return psutil.Process(router.popen.pid).children()


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def test_workers_share_sessions_and_decisions(procs: Procs) -> None:
    """Two workers, three endpoints: every later turn of 12 sessions goes
    where its first went, whichever worker takes it, and both workers
    serve."""
    sims = [procs.sim(time_scale=0.02) for _ in range(3)]
    router = procs.router({"server": {"workers": 2}}, endpoints=[s.url for s in sims])
    workers = _workers(router)
    assert len(workers) == 2
    before = [_cpu(w) for w in workers]
    first = {s: turn(router.url, s, 0) for s in range(12)}
    assert len(set(first.values())) > 1, first  # spread: a later turn has a choice
    moved = [(s, n) for n in (1, 2) for s in range(12) if turn(router.url, s, n) != first[s]]
    assert moved == []
    used = [_cpu(w) - b for w, b in zip(workers, before, strict=True)]
    assert all(u > 0.05 for u in used), used  # the kernel gave both some of the connections
    # what one worker decided the other applied (whichever answers /metrics)
    assert decisions(router, "received") > 0


def test_workers_do_not_each_fill_an_endpoint(procs: Procs) -> None:
    """One endpoint that takes CAP requests, two workers, 12 clients 30 ms
    apart: the endpoint runs CAP at a time, give or take the over-commit
    (docs/router-ha.md: the two acting on the same freed slot within a
    report's lag), never the 2 x CAP two workers alone would let through."""
    sim = procs.sim(time_scale=1.0, decode_s_per_token=0.01)
    router = procs.router({
        "server": {"workers": 2},
        "flowControl": {"enabled": True,
                        "saturation": {"detector": "concurrency", "maxConcurrency": CAP}}},
        endpoints=[sim.url])
    running = Running(sim)
    watch = threading.Thread(target=running.run)
    watch.start()
    load = Load([router.url], clients=12, max_tokens=30, ramp_s=0.03)
    try:
        load.start()
        time.sleep(4)
    finally:
        load.end()
        running.stop.set()
        watch.join(5)
    print(f"running at the endpoint: mean {running.mean:.2f}, peak {running.peak} (cap {CAP}); "
          f"answered {sum(load.ok.values())}")
    assert not load.failed, load.failed
    assert sum(load.ok.values()) > 20
    assert CAP - 0.5 <= running.mean <= CAP + 1, running.mean  # busy, at the cap
    assert running.peak < 2 * CAP


def test_a_dead_worker_is_started_again_and_sigterm_ends_all(procs: Procs) -> None:
    sim = procs.sim(time_scale=0.02)
    router = procs.router({"server": {"workers": 2}}, endpoints=[sim.url])
    workers = _workers(router)
    workers[0].kill()
    wait_for("a new worker", lambda: len(_workers(router)) == 2
             and workers[0].pid not in {w.pid for w in _workers(router)}, timeout=30)
    for s in range(6):  # served throughout, whichever worker takes each
        turn(router.url, s, 0)
    left = _workers(router)
    router.popen.send_signal(signal.SIGTERM)
    assert router.popen.wait(30) == 0
    _, alive = psutil.wait_procs(left, timeout=10)
    assert not alive


def test_every_scrape_counts_every_workers_requests(procs: Procs) -> None:
    """Whichever worker a scrape reaches answers for both: 20 requests, on
    connections of their own so both workers take some, are 20 on each of
    8 scrapes; a worker killed and started again, its counts stay (the
    totals never fall back) and the gauges are the live workers'."""
    sim = procs.sim(time_scale=0.02)
    router = procs.router({"server": {"workers": 2}}, endpoints=[sim.url])
    workers = _workers(router)
    chats = {"name": "toposerve_router_requests_total", "path": "/v1/chat/completions"}

    def scrapes() -> list[float]:
        return [router.metric(**chats) for _ in range(8)]

    for s in range(20):  # the kernel hashes each connection to a worker: all
        turn(router.url, s, 0)  # 20 to one is a chance of one in half a million
    assert scrapes() == [20.0] * 8
    workers[0].kill()
    wait_for("a new worker", lambda: len(_workers(router)) == 2
             and workers[0].pid not in {w.pid for w in _workers(router)}, timeout=30)
    for s in range(4):
        turn(router.url, s, 1)
    assert scrapes() == [24.0] * 8
    # one sample a gauge, of the live workers (the dead one's gone with it)
    leader = [s for s in router.samples() if s.name == "toposerve_router_leader"]
    assert [(s.labels, s.value) for s in leader] == [({}, 1.0)]


def _refusal(tmp_path: Path, *argv: str, doc: dict[str, object] | None = None) -> str:
    args = [sys.executable, "-m", "toposerve.main", "router", *argv]
    if doc is not None:
        path = tmp_path / "router.yaml"
        path.write_text(yaml.safe_dump({"apiVersion": "toposerve.io/v1", "kind": "RouterConfig",
                                        "discovery": {"static": [{"url": "http://127.0.0.1:1"}]},
                                        **doc}))
        args += ["--config", str(path)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    return lines[0]


def test_bad_worker_counts_are_one_line_errors(tmp_path: Path) -> None:
    port = str(free_port())
    ep = ["--endpoint", "http://127.0.0.1:1", "--port", port]
    assert "--workers: '0' is not a number from 1 to 64" in _refusal(tmp_path, *ep,
                                                                     "--workers", "0")
    assert "--workers: 'two'" in _refusal(tmp_path, *ep, "--workers", "two")
    line = _refusal(tmp_path, "--workers", "2", doc={
        "responses": {"backend": "redis", "redisUrl": "redis://127.0.0.1:1/0"},
        "ha": {"enabled": True, "mode": "hot-standby"}})
    assert "server.workers (2) needs ha.mode: active-active" in line
    line = _refusal(tmp_path, doc={"server": {"workers": 65}})
    assert "server.workers" in line and "64" in line
    line = _refusal(tmp_path, "--mode", "endpoint-picker", "--workers", "2", doc={})
    assert "the endpoint picker runs in one process" in line


@pytest.mark.unit
def test_the_local_bus_relays_and_keeps_snapshots(tmp_path: Path) -> None:
    """The hub relays each message to every subscriber (its sender's own
    subscription too), keeps a blob for its TTL, and cuts off a frame over
    its limit without stopping."""
    import asyncio

    from toposerve.router.ha.local_bus import Hub, LocalBus

    async def go() -> None:
        path = str(tmp_path / "bus.sock")
        hub = Hub(path, max_frame=1000)
        await hub.start()
        a, b = LocalBus(path, 1000), LocalBus(path, 1000)
        try:
            async with a.subscribe() as sa, b.subscribe() as sb:
                await asyncio.sleep(0.05)  # the hub has read both subscriptions
                await a.publish([b"one", b"two"])
                assert [await sb.next(2), await sb.next(2)] == [b"one", b"two"]
                assert await sa.next(2) == b"one"
                assert await sb.next(0.05) is None
                await b.put("snap", b"blob", 60)
                assert await a.get("snap") == b"blob"
                assert await a.get("other") is None
                with pytest.raises((ConnectionError, EOFError)):
                    await a.publish([b"x" * 2000])  # over the limit: the hub drops the link
                    await a.get("snap")
                assert await a.get("snap") == b"blob"  # a new connection: the hub went on
        finally:
            await a.close()
            await b.close()
            await hub.close()

    asyncio.run(go())
