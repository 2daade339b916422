"""What the tests of router processes sharing one view (active-active
replicas, workers of one pod) do to them: session turns, a load held at
a concurrency, and a watch on what a model server runs at once."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field

import httpx

from harness.procs import MODEL, Proc


def turn(url: str, session: int, n: int, max_tokens: int = 5) -> str:
    """Turn ``n`` of a session, on a connection of its own (workers behind
    one port: any of them may take it); the endpoint that answered."""
    system = f"session {session} " + "context words " * 200
    msgs = [{"role": "system", "content": system}]
    msgs += [{"role": "user", "content": f"turn {t} of {session}"} for t in range(n + 1)]
    r = httpx.post(url + "/v1/chat/completions", timeout=60,
                   headers={"x-session-id": f"s{session}"},
                   json={"model": MODEL, "max_tokens": max_tokens, "messages": msgs})
    assert r.status_code == 200, r.text
    return r.headers["X-Toposerve-Endpoint"]


def peer_inflight(router: Proc) -> float:
    return router.metric("toposerve_router_endpoint_peer_inflight")


def decisions(router: Proc, outcome: str) -> float:
    return sum(s.value for s in router.samples()
               if s.name == "toposerve_router_replicated_decisions_total"
               and s.labels.get("outcome") == outcome)


@dataclass
class Running:
    """Samples a model server's running requests (its own gauge) until
    stopped: the most it ran at once, and the mean once ``settle_s`` has
    passed (the clients all started)."""

    sim: Proc
    every_s: float = 0.01
    settle_s: float = 1.0
    peak: float = 0.0
    samples: list[float] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def mean(self) -> float:
        return sum(self.samples) / len(self.samples) if self.samples else 0.0

    def run(self) -> None:
        settled = time.monotonic() + self.settle_s
        with httpx.Client(timeout=2) as c:
            while not self.stop.wait(self.every_s):
                try:
                    text = c.get(self.sim.url + "/metrics").text
                except httpx.HTTPError:
                    continue
                for line in text.splitlines():
                    if line.startswith("vllm:num_requests_running"):
                        n = float(line.rsplit(" ", 1)[1])
                        self.peak = max(self.peak, n)
                        if time.monotonic() > settled:
                            self.samples.append(n)


@dataclass
class Load:
    """``clients`` threads, each sending one request after another to the
    routers in turn (a round-robin front), started ``ramp_s`` apart; what
    came back, by router. A request refused a connection (a router gone)
    is not counted: it never started."""

    routers: list[str]
    clients: int
    max_tokens: int = 40
    ramp_s: float = 0.0
    ok: dict[str, int] = field(default_factory=dict)
    failed: dict[str, list[str]] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _client(self, k: int) -> None:
        for i in itertools.count(k):
            if self.stop.is_set():
                return
            url = self.routers[i % len(self.routers)]
            try:
                r = httpx.post(url + "/v1/chat/completions", timeout=60, json={
                    "model": MODEL, "max_tokens": self.max_tokens,
                    "messages": [{"role": "user", "content": f"client {k} request {i}"}]})
                why = None if r.status_code == 200 else f"{r.status_code} {r.text[:100]}"
            except httpx.ConnectError:  # it never reached a router: a client retries
                time.sleep(0.02)
                continue
            except httpx.HTTPError as err:
                why = repr(err)
            with self._lock:
                if why is None:
                    self.ok[url] = self.ok.get(url, 0) + 1
                else:
                    self.failed.setdefault(url, []).append(why)

    def start(self) -> None:
        for k in range(self.clients):
            t = threading.Thread(target=self._client, args=(k,))
            t.start()
            self._threads.append(t)
            time.sleep(self.ramp_s)

    def end(self) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(90)
