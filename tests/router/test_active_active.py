"""Active-active router replicas (``ha.mode: active-active``): every
replica serves, no Lease. Real router processes, a real redis-server and
simulated model servers; the test is the round-robin front. Sessions hold
and the learnt view converges across replicas, two replicas do not each
fill an endpoint, a replica killed under load loses only the requests in
flight on it, and Redis lost and back: each routes on its own meanwhile,
then catches up on what the other decided."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness import redis_proc
from harness.procs import MODEL, Proc, Procs
from harness.waiting import wait_for
from tests.router.sharing import Load, Running, decisions, peer_inflight, turn
from toposerve.localcluster.processes import end_process

CAP = 4
PEER_TIMEOUT_S = 1.0
RATE, SECONDS = 4.0, 3.0  # a tenant's requests a second, and how long it is sent twice that


def _replica(procs: Procs, redis_url: str, group: str, endpoints: list[str],
             **extra: object) -> Proc:
    return procs.router({
        "responses": {"backend": "redis", "redisUrl": redis_url},
        "server": {"drainTimeoutSeconds": 10},
        "ha": {"enabled": True, "mode": "active-active", "lease": {"name": group},
               "inflight": {"peerTimeoutSeconds": PEER_TIMEOUT_S}},
        **extra}, endpoints=endpoints)


def _pair(procs: Procs, redis_url: str, endpoints: list[str], **extra: object
          ) -> list[Proc]:
    group = f"aa-{uuid.uuid4().hex[:6]}"
    return [_replica(procs, redis_url, group, endpoints, **extra) for _ in range(2)]


def _approx_blocks(router: Proc) -> float:
    return sum(s.value for s in router.samples()
               if s.name == "toposerve_router_prefix_index_blocks"
               and s.labels.get("index") == "approx")


def _snapshots(router: Proc, outcome: str) -> float:
    return sum(s.value for s in router.samples()
               if s.name == "toposerve_router_replication_snapshots_total"
               and s.labels.get("outcome") == outcome)


def _logged(router: Proc, msg: str) -> list[dict[str, object]]:
    """Its log's lines whose message begins with ``msg``."""
    out = []
    for line in router.log.read_text().splitlines():
        if line.startswith("{") and f'"msg": "{msg}' in line:
            out.append(json.loads(line))
    return out


@pytest.fixture
def sims(procs: Procs) -> list[Proc]:
    return [procs.sim(time_scale=0.02) for _ in range(3)]


def test_every_replica_serves_and_sessions_hold_across_them(
        procs: Procs, redis_url: str, sims: list[Proc]) -> None:
    """Both replicas ready at once; each session's first turn goes through
    one replica, its later turns through the other, and every turn lands
    where the first did. The prefix indexes the two learn (from their own
    and the other's decisions) come out the same."""
    a, b = _pair(procs, redis_url, [s.url for s in sims])
    assert httpx.get(a.url + "/ready").status_code == 200
    assert httpx.get(b.url + "/ready").status_code == 200
    replicas = (a, b)
    first = {s: turn(replicas[s % 2].url, s, 0) for s in range(12)}
    assert len(set(first.values())) > 1, first
    moved = [(s, n) for n in (1, 2) for s in range(12)
             if turn(replicas[(s + n) % 2].url, s, n) != first[s]]
    assert moved == []
    wait_for("the same approximate index on both",
             lambda: _approx_blocks(a) == _approx_blocks(b) > 0, timeout=10)
    assert decisions(a, "received") > 0 and decisions(b, "received") > 0


def test_a_replica_of_workers_shares_with_the_others_through_redis(
        procs: Procs, redis_url: str, sims: list[Proc]) -> None:
    """A replica of two workers (each a replica to the others, over Redis)
    beside a replica of one: a session's turns land where its first did,
    through whichever replica and worker."""
    group = f"aa-{uuid.uuid4().hex[:6]}"
    urls = [s.url for s in sims]
    two = _replica(procs, redis_url, group, urls, server={"workers": 2})
    one = _replica(procs, redis_url, group, urls)
    first = {s: turn(two.url, s, 0) for s in range(10)}
    assert len(set(first.values())) > 1, first
    moved = [(s, n) for n in (1, 2) for s in range(10)
             if turn((one, two)[n % 2].url, s, n) != first[s]]
    assert moved == []


def test_two_replicas_do_not_each_fill_an_endpoint(procs: Procs, redis_url: str) -> None:
    """One endpoint that takes CAP requests, two replicas behind a round
    robin, 12 clients 30 ms apart: as for workers (test_router_workers.py),
    the endpoint runs CAP at a time give or take the over-commit, never the
    2 x CAP two replicas alone would let through."""
    sim = procs.sim(time_scale=1.0, decode_s_per_token=0.01)
    a, b = _pair(procs, redis_url, [sim.url], flowControl={
        "enabled": True, "saturation": {"detector": "concurrency", "maxConcurrency": CAP}})
    running = Running(sim)
    watch = threading.Thread(target=running.run)
    watch.start()
    load = Load([a.url, b.url], clients=12, max_tokens=30, ramp_s=0.03)
    try:
        load.start()
        time.sleep(4)
        seen = max(peer_inflight(a), peer_inflight(b))
    finally:
        load.end()
        running.stop.set()
        watch.join(5)
    print(f"running at the endpoint: mean {running.mean:.2f}, peak {running.peak} "
          f"(cap {CAP}); answered {load.ok}")
    assert not load.failed, load.failed
    assert min(load.ok.values()) > 10  # both served
    assert seen > 0  # each saw the other's requests
    assert CAP - 0.5 <= running.mean <= CAP + 1, running.mean  # busy, at the cap
    assert running.peak < 2 * CAP


def test_a_replica_killed_under_load_loses_only_its_own_requests(
        procs: Procs, redis_url: str) -> None:
    """Eight clients alternate between the replicas. SIGKILL one: only
    requests in flight on it fail (at most one a client); the other
    serves on, and within peerTimeoutSeconds stops counting the dead
    one's requests on the endpoints."""
    sims = [procs.sim(time_scale=1.0, decode_s_per_token=0.01) for _ in range(3)]
    a, b = _pair(procs, redis_url, [s.url for s in sims])
    load = Load([a.url, b.url], clients=8, max_tokens=20)
    try:
        load.start()
        wait_for("load on both", lambda: min(load.ok.get(r.url, 0) for r in (a, b)) >= 10,
                 timeout=30)
        wait_for("b sees a's requests", lambda: peer_inflight(b) > 0, interval=0.02)
        a.kill()
        killed_at, served = time.monotonic(), load.ok.get(b.url, 0)
        # the dead one's requests stop weighing on b's view within the timeout
        wait_for("a forgotten", lambda: peer_inflight(b) == 0, timeout=10, interval=0.05)
        forgotten_after = time.monotonic() - killed_at
        wait_for("b serves on", lambda: load.ok.get(b.url, 0) >= served + 30, timeout=30)
    finally:
        load.end()
    lost = load.failed.get(a.url, [])
    print(f"lost {len(lost)} (in flight on the killed replica), b answered "
          f"{load.ok.get(b.url, 0)}; b forgot a's requests {forgotten_after:.2f} s after")
    assert load.failed.get(b.url, []) == []
    assert len(lost) <= load.clients, lost
    assert forgotten_after < PEER_TIMEOUT_S + 2


@pytest.fixture
def restartable_redis(redis_server: tuple[str, subprocess.Popen[bytes]]
                      ) -> Iterator[tuple[str, list[subprocess.Popen[bytes]]]]:
    """The fixture's redis-server, and the ones a test starts again in its
    place (ended after)."""
    url, first = redis_server
    started: list[subprocess.Popen[bytes]] = [first]
    try:
        yield url, started
    finally:
        for p in started[1:]:
            end_process(p, 10)



def test_redis_lost_and_back(procs: Procs, sims: list[Proc],
                             restartable_redis: tuple[str, list[subprocess.Popen[bytes]]]
                             ) -> None:
    """Redis killed: both replicas go on serving on their own views (a
    session stays where it started on the replica that placed it). Redis
    back, no restart: each catches up on what the other decided meanwhile
    (sessions first placed by one during the outage continue through the
    other where they started), and they share in-flight counts again."""
    url, servers = restartable_redis
    a, b = _pair(procs, url, [s.url for s in sims])
    turn(a.url, 0, 0)  # both working, sharing
    servers[0].send_signal(signal.SIGKILL)
    servers[0].wait(10)
    wait_for("a sees redis gone", lambda: _logged(a, "background loop error"), timeout=10)
    # each alone: sessions placed meanwhile, by a (100-105) and by b (200-205)
    during_a = {s: turn(a.url, s, 0) for s in range(100, 106)}
    during_b = {s: turn(b.url, s, 0) for s in range(200, 206)}
    assert all(turn(a.url, s, 1) == during_a[s] for s in during_a)  # a's own view holds
    loaded = (_snapshots(a, "loaded"), _snapshots(b, "loaded"))
    servers.append(redis_proc.start_again(url))
    wait_for("each caught up on the other",
             lambda: _snapshots(a, "loaded") > loaded[0] and _snapshots(b, "loaded") > loaded[1],
             timeout=30)
    caught = [e for r in (a, b) for e in _logged(r, "caught up on a peer's decisions")]
    print(f"caught up: {[(e['peer'], e['applied']) for e in caught]}")
    moved = [s for s in during_a if turn(b.url, s, 2) != during_a[s]]
    moved += [s for s in during_b if turn(a.url, s, 1) != during_b[s]]
    assert moved == []
    # in-flight counts shared again: a's requests show on b
    load = Load([a.url], clients=4, max_tokens=200)
    try:
        load.start()
        wait_for("a's requests on b's view", lambda: peer_inflight(b) > 0, timeout=10)
    finally:
        load.end()


def test_a_tenants_rate_holds_across_the_replicas(procs: Procs, redis_url: str,
                                                  tmp_path: Path) -> None:
    """A tenant's requestsPerSecond is one rate for the replicas together:
    each charges its own bucket what the others' requests took (their load
    reports carry it), not the N times the rate N replicas alone allow."""
    keys = tmp_path / "keys.yaml"
    keys.write_text(json.dumps({"apiVersion": "toposerve.io/v1", "kind": "APIKeys",
                                "tenants": {"team-a": ["sk-a"]}}))
    sim = procs.sim()
    a, b = _pair(procs, redis_url, [sim.url], flowControl={"tenants": {
        "keys": {"file": str(keys)},
        "tenants": [{"name": "team-a", "requestsPerSecond": RATE}]}})
    statuses: dict[str, list[int]] = {a.url: [], b.url: []}
    started = time.monotonic()
    i = 0
    while time.monotonic() - started < SECONDS:  # one replica, then the other
        url = (a.url, b.url)[i % 2]
        statuses[url].append(httpx.post(url + "/v1/completions", timeout=10, json={
            "model": MODEL, "prompt": "hi", "max_tokens": 1},
            headers={"Authorization": "Bearer sk-a"}).status_code)
        i += 1
        time.sleep(0.05)
    took = time.monotonic() - started
    admitted = sum(s.count(200) for s in statuses.values())
    print(f"team-a at {RATE:g}/s through two replicas for {took:.1f}s: {admitted} of "
          f"{i} admitted ({ {u[-5:]: s.count(200) for u, s in statuses.items()} })")
    assert {c for s in statuses.values() for c in s} <= {200, 429}
    # one burst on each (RATE each), then RATE a second between them; two
    # replicas alone would admit twice that
    assert admitted <= 2 * RATE + RATE * took + 2, admitted
    assert all(s.count(200) > 0 and s.count(429) > 0 for s in statuses.values()), statuses
