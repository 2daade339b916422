"""A hot-standby router pair on a real Lease (the session cluster), a
real redis-server and simulated model servers. Traffic goes where a
Service would send it, to the replica whose /ready answers 200. Killing
the leader under load: the standby leads within 2 s, routes as well as
the leader did (it learnt the leader's decisions), and every request
that had not reached the dead replica is served. A rolling update
(SIGTERM) drops nothing at all."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
import pytest
from kubernetes import client

from harness.procs import MODEL, Proc, Procs
from harness.waiting import wait_for
from tests.conftest import Cluster
from toposerve.localcluster.clusters import kubeconfig_path
from toposerve.localcluster.pods import model_pod, wait_running
from toposerve.router.ha.pod_label import ROLE_LABEL

pytestmark = pytest.mark.cluster
CONVERSATIONS = 12
WORKERS = 4


def status(url: str, path: str = "/ready") -> int:
    try:
        return httpx.get(url + path, timeout=0.5).status_code
    except httpx.HTTPError:
        return 0


@dataclass
class Service:
    """What a Service in front of the pair does: send to the ready replica."""

    replicas: list[Proc]
    leader: Proc | None = None
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            ready = [r for r in self.replicas if status(r.url) == 200]
            self.leader = ready[0] if ready else None
            self.stop.wait(0.05)


@dataclass
class Load:
    service: Service
    ok: list[tuple[float, str]] = field(default_factory=list)  # (time, replica)
    lost: list[str] = field(default_factory=list)  # failed after reaching a live replica
    killed_at: float | None = None  # a request sent after this found its replica dead
    stop: threading.Event = field(default_factory=threading.Event)
    turns: dict[int, int] = field(default_factory=dict)

    def worker(self, w: int) -> None:
        with httpx.Client(timeout=30) as c:
            n = w
            while not self.stop.is_set():
                conv = n % CONVERSATIONS
                n += WORKERS
                turn = self.turns.get(conv, 0)
                self.turns[conv] = turn + 1
                system = f"conversation {conv} " + "context words " * 400
                msgs = [{"role": "system", "content": system}]
                for t in range(turn + 1):
                    msgs.append({"role": "user", "content": f"turn {t} of {conv}"})
                while not self.stop.is_set():
                    target = self.service.leader
                    if target is None:
                        time.sleep(0.02)
                        continue
                    sent = time.monotonic()
                    try:
                        r = c.post(target.url + "/v1/chat/completions", json={
                            "model": MODEL, "max_tokens": 2, "messages": msgs})
                    except httpx.ConnectError:
                        time.sleep(0.02)  # never reached a replica: a client retries
                        continue
                    except httpx.HTTPError as err:
                        if self.killed_at is not None and sent > self.killed_at:
                            # a kept-alive connection to the dead replica: it never started
                            time.sleep(0.02)
                            continue
                        self.lost.append(repr(err))
                        break
                    if r.status_code == 200:
                        self.ok.append((time.monotonic(), target.url))
                    else:
                        self.lost.append(f"{r.status_code} {r.text[:200]}")
                    break


def lease_taken(replica: Proc) -> float | None:
    """When the replica took the Lease over (epoch seconds), from its log."""
    for line in replica.log.read_text().splitlines():
        if '"lease taken"' in line:
            stamp = json.loads(line)["timestamp"].replace("Z", "+00:00")
            return datetime.fromisoformat(stamp).timestamp()
    return None


def hit_rate(sims: list[Proc]) -> tuple[float, float]:
    c = [s.counters() for s in sims]
    return (sum(x.get("vllm:prefix_cache_hits_total", 0.0) for x in c),
            sum(x.get("vllm:prefix_cache_queries_total", 0.0) for x in c))


def role_labels(core: Any, replicas: list[Proc]) -> dict[str, str]:
    """Replica URL -> the role label on its pod."""
    out = {}
    for r in replicas:
        pod = core.read_namespaced_pod(r.extra["pod"], "default")
        out[r.url] = (pod.metadata.labels or {}).get(ROLE_LABEL, "")
    return out


def start_pair(cluster: Cluster, procs: Procs, redis_url: str,
               monkeypatch: pytest.MonkeyPatch, endpoints: list[str], duration: int = 1
               ) -> tuple[list[Proc], list[str]]:
    """Two HA router replicas on one new Lease (``duration`` seconds) in
    front of ``endpoints``, each with a pod (kwok's) to label: the replicas
    and the pods' names. The replicas are not waited for."""
    core: Any = client.CoreV1Api(cluster.api)
    lease = f"router-{uuid.uuid4().hex[:6]}"
    # pods for the replicas to label (kwok runs them; the routers run here)
    pods = [f"{lease}-a", f"{lease}-b"]
    for pod in pods:
        core.create_namespaced_pod("default", model_pod(pod, lease, "router"))
    wait_running(core, pods)
    monkeypatch.setenv("POD_NAMESPACE", "default")
    replicas = []
    for ident in pods:
        monkeypatch.setenv("POD_NAME", ident)
        replicas.append(procs.router({
            "responses": {"backend": "redis", "redisUrl": redis_url},
            "server": {"drainTimeoutSeconds": 10},
            "ha": {"enabled": True, "shutdownDelaySeconds": 3.0, "lease": {
                "name": lease, "namespace": "default", "identity": ident,
                "leaseDurationSeconds": duration, "renewDeadlineSeconds": duration * 0.7,
                # reads twice as often as the default: the 2 s bound holds on a loaded machine
                "renewIntervalSeconds": 0.1,
                "kubeconfig": str(kubeconfig_path(cluster.name))}}},
            endpoints=endpoints, wait_ready=False))
        replicas[-1].extra["pod"] = ident
    return replicas, pods


def delete_pods(cluster: Cluster, pods: list[str]) -> None:
    core: Any = client.CoreV1Api(cluster.api)
    for pod in pods:
        with contextlib.suppress(client.exceptions.ApiException):
            core.delete_namespaced_pod(pod, "default", grace_period_seconds=0)


@pytest.fixture
def pair(cluster: Cluster, procs: Procs, redis_url: str,
         monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
         ) -> Iterator[tuple[list[Proc], list[Proc], Service]]:
    """Its parameter (indirect): the lease duration, default 1 s."""
    duration = int(getattr(request, "param", 1))
    sims = [procs.sim(time_scale=0.02) for _ in range(3)]
    replicas, pods = start_pair(cluster, procs, redis_url, monkeypatch,
                                [s.url for s in sims], duration)
    wait_for("one leader, one standby",
             lambda: sorted(status(r.url) for r in replicas) == [200, 503], timeout=20)
    # the standby is warm: ready but for its role
    assert all(status(r.url, "/ready?role=any") == 200 for r in replicas)
    service = Service(replicas)
    poller = threading.Thread(target=service.run)
    poller.start()
    try:
        yield sims, replicas, service
    finally:
        service.stop.set()
        poller.join(5)
        delete_pods(cluster, pods)


def test_a_warm_pair_without_model_servers_has_a_leader(
        cluster: Cluster, procs: Procs, redis_url: str, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    """No model server answers (an endpoint nobody listens on): both
    replicas get warm (they asked it once) and one takes the Lease, so the
    Service, which selects the leader, has a router that answers 503 "no
    endpoint" (an install on an empty cluster: before, neither led)."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{s.getsockname()[1]}"
    core: Any = client.CoreV1Api(cluster.api)
    replicas, pods = start_pair(cluster, procs, redis_url, monkeypatch, [nobody])
    try:
        wait_for("both replicas warm", lambda: all(
            status(r.url, "/ready?role=any") == 200 for r in replicas), timeout=20)
        roles = wait_for("a leader and a standby by their pods' labels", lambda: (
            got if sorted((got := role_labels(core, replicas)).values()) == [
                "leader", "standby"] else {}), timeout=10)
        leader = next(url for url, role in roles.items() if role == "leader")
        assert status(leader) == 503  # a load balancer's check still needs an endpoint
        r = httpx.post(leader + "/v1/chat/completions", timeout=10, json={
            "model": None, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 503 and r.json()["error"]["type"] == "ServiceUnavailable", r.text
    finally:
        delete_pods(cluster, pods)


def run_load(service: Service) -> tuple[Load, list[threading.Thread]]:
    load = Load(service)
    threads = [threading.Thread(target=load.worker, args=(w,)) for w in range(WORKERS)]
    for t in threads:
        t.start()
    return load, threads


def finish(load: Load, threads: list[threading.Thread]) -> None:
    load.stop.set()
    for t in threads:
        t.join(30)


def test_standby_takes_over_warm_when_the_leader_dies(
        cluster: Cluster, pair: tuple[list[Proc], list[Proc], Service]) -> None:
    core: Any = client.CoreV1Api(cluster.api)
    sims, replicas, service = pair
    leader = wait_for("the leader", lambda: service.leader)
    assert leader is not None
    standby = next(r for r in replicas if r is not leader)
    # a Service selecting the leader by its pod's label sees the same
    wait_for("role labels", lambda: role_labels(core, replicas) == {
        leader.url: "leader", standby.url: "standby"})
    load, threads = run_load(service)
    try:
        # every conversation has started (first turns miss everywhere), then a window
        wait_for("warm-up", lambda: len(load.ok) >= 3 * CONVERSATIONS, timeout=30)
        h0, q0 = hit_rate(sims)
        wait_for("traffic before", lambda: len(load.ok) >= 6 * CONVERSATIONS, timeout=30)
        h1, q1 = hit_rate(sims)
        served_before = len(load.ok)
        # what was sent before the kill may have been in flight; what is sent
        # after it finds a dead replica (its process may take a while to reap)
        load.killed_at, killed = time.monotonic(), time.time()
        leader.kill()
        # when it took the Lease, by its own log (this process's threads lag on a busy machine)
        taken = wait_for("the standby leads", lambda: lease_taken(standby), timeout=10)
        assert taken is not None
        took = taken - killed
        wait_for("the standby ready", lambda: status(standby.url) == 200, timeout=10)
        wait_for("a request served by the standby", lambda: any(
            url == standby.url for _, url in load.ok[served_before:]), timeout=10)
        h2, q2 = hit_rate(sims)
        n = len(load.ok)
        wait_for("traffic after", lambda: len(load.ok) >= n + 3 * CONVERSATIONS, timeout=30)
        h3, q3 = hit_rate(sims)
    finally:
        finish(load, threads)
    before, after = (h1 - h0) / (q1 - q0), (h3 - h2) / (q3 - q2)
    print(f"takeover {took:.2f}s; hit rate before {before:.3f}, after {after:.3f}; "
          f"lost in flight {len(load.lost)}")
    assert took < 2.0
    assert after >= before - 0.05, (before, after)
    # only what was in flight on the dead replica may be lost: one per worker at most
    assert len(load.lost) <= WORKERS, load.lost
    assert all("500" not in x and "503" not in x for x in load.lost), load.lost
    assert any(s.labels.get("outcome") == "received" and s.value > 0
               for s in standby.samples()
               if s.name == "toposerve_router_replicated_decisions_total")
    wait_for("the standby's pod labelled leader",
             lambda: role_labels(core, replicas)[standby.url] == "leader")


# a lease of 5 s: taking an expired one would take over 4 s, a released one far less
@pytest.mark.parametrize("pair", [5], indirect=True)
def test_a_rolling_update_drops_nothing(pair: tuple[list[Proc], list[Proc], Service]) -> None:
    _sims, replicas, service = pair
    leader = wait_for("the leader", lambda: service.leader)
    assert leader is not None
    standby = next(r for r in replicas if r is not leader)
    load, threads = run_load(service)
    try:
        wait_for("traffic", lambda: len(load.ok) >= 20, timeout=30)
        stopped = time.monotonic()
        leader.popen.terminate()  # SIGTERM, as the kubelet sends it
        wait_for("the standby leads", lambda: status(standby.url) == 200, timeout=5,
                 interval=0.02)
        took = time.monotonic() - stopped
        n = len(load.ok)
        wait_for("traffic after", lambda: len(load.ok) >= n + 20, timeout=30)
        try:
            code = leader.popen.wait(40)  # delay, drain, exit on a loaded machine
        except subprocess.TimeoutExpired:
            code = None
        assert code == 0, leader.log.read_text()[-3000:]
    finally:
        finish(load, threads)
    print(f"handover {took:.2f}s")
    assert took < 2.5  # the lease was handed back, not left to expire
    assert load.lost == []


def _turn(url: str, session: int, turn: int) -> str:
    """Sends a session's turn; the endpoint that answered."""
    system = f"session {session} " + "context words " * 300
    msgs = [{"role": "system", "content": system}]
    msgs += [{"role": "user", "content": f"turn {t} of {session}"} for t in range(turn + 1)]
    r = httpx.post(url + "/v1/chat/completions", timeout=30,
                   headers={"x-session-id": f"s{session}"},
                   json={"model": MODEL, "max_tokens": 20, "messages": msgs})
    assert r.status_code == 200, r.text
    return r.headers["X-Toposerve-Endpoint"]


def _snapshots(replica: Proc, outcome: str) -> float:
    return sum(s.value for s in replica.samples()
               if s.name == "toposerve_router_replication_snapshots_total"
               and s.labels.get("outcome") == outcome)


def test_a_standby_started_late_gets_the_leaders_state(
        cluster: Cluster, procs: Procs, redis_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The leader routes the first turns of 18 sessions; then standby B
    starts (it asks for a snapshot) and C starts without one (the control).
    B sends the next turns of sessions 0-5 where the leader sent their
    first; C, cold, does not for 12-17. After the leader dies, B, now
    leading, still sends those of sessions 6-11 where their first went."""
    monkeypatch.delenv("POD_NAME", raising=False)  # no pods to label here
    sims = [procs.sim(time_scale=0.05) for _ in range(3)]
    lease = f"router-{uuid.uuid4().hex[:6]}"

    def replica(name: str, snapshot: bool) -> Proc:
        return procs.router({
            "responses": {"backend": "redis", "redisUrl": redis_url},
            "ha": {"enabled": True, "snapshot": {"enabled": snapshot}, "lease": {
                "name": lease, "namespace": "default", "identity": name,
                "renewIntervalSeconds": 0.1,
                "kubeconfig": str(kubeconfig_path(cluster.name))}}},
            endpoints=[s.url for s in sims], wait_ready=False)

    a = replica("a", snapshot=True)
    wait_for("a leads", lambda: status(a.url) == 200, timeout=20)
    first: dict[int, str] = {}

    def start(s: int) -> None:
        first[s] = _turn(a.url, s, 0)

    # at once, so load spreads them: a cold router would not guess where each went
    threads = [threading.Thread(target=start, args=(s,)) for s in range(18)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(first) == 18 and len(set(first.values())) > 1, first
    b, c = replica("b", snapshot=True), replica("c", snapshot=False)
    # at least a's whole one; then perhaps c's own decisions (none), as b catches up on c
    wait_for("b loaded a snapshot", lambda: _snapshots(b, "loaded") >= 1, timeout=20)
    assert _snapshots(a, "written") == 1
    wait_for("warm standbys", lambda: all(status(r.url, "/ready?role=any") == 200
                                          for r in (b, c)), timeout=20)
    assert status(b.url) == 503 and status(c.url) == 503
    warm = sum(_turn(b.url, s, 1) == first[s] for s in range(6))
    cold = sum(_turn(c.url, s, 1) == first[s] for s in range(12, 18))
    c.stop()
    a.kill()
    wait_for("b leads", lambda: status(b.url) == 200, timeout=10)
    after = sum(_turn(b.url, s, 1) == first[s] for s in range(6, 12))
    print(f"next turns on their first turn's endpoint: snapshot {warm}/6, "
          f"after failover {after}/6; without a snapshot {cold}/6")
    assert warm == 6 and after == 6
    assert cold < 6  # the control: without the snapshot the standby is cold
