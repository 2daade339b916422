"""What a device-health test of the router watches, whoever taints the
device (a test writing the slice, the GPU driver after a fake NVML XID on
the real node): traffic that records which endpoint served each request
and when it was sent, the router's view of tainted endpoints, the Events
it wrote on a pod, and the whole round of an XID under the GPU driver's
fake NVML library and the GPU's reset, wherever the driver runs."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from harness.fake_nvml import inject_xid, set_lost
from harness.procs import MODEL, Proc
from harness.waiting import wait_for
from toposerve.dra_driver.gpu.driver import TAINT_GPU_LOST, TAINT_XID
from toposerve.kubeapi import JsonApi

TAINTED = "toposerve_router_endpoint_device_tainted"


@dataclass(frozen=True)
class Sent:
    at: float  # monotonic time the request was sent
    endpoint: str  # as X-Toposerve-Endpoint names it ("?" without an answer)
    status: int


@dataclass
class Traffic:
    """``clients`` threads sending short chat requests to ``router`` until
    stopped, each recorded."""

    router: Proc
    clients: int = 4
    max_tokens: int = 3
    sent: list[Sent] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Traffic:
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                         for i in range(self.clients)]
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)

    def _run(self, client: int) -> None:
        with httpx.Client(base_url=self.router.url, timeout=30) as c:
            i = 0
            while not self._stop.is_set():
                at = time.monotonic()
                try:
                    r = c.post("/v1/chat/completions", json={
                        "model": MODEL, "max_tokens": self.max_tokens,
                        "messages": [{"role": "user", "content": f"client {client} turn {i}"}]})
                    self.sent.append(Sent(at, r.headers.get("x-toposerve-endpoint", "?"),
                                          r.status_code))
                except httpx.HTTPError:
                    self.sent.append(Sent(at, "?", 0))
                i += 1

    def served(self, endpoint: str, after: float = 0.0) -> int:
        """Requests sent after ``after`` that ``endpoint`` served."""
        return sum(1 for s in list(self.sent) if s.at > after and s.endpoint == endpoint)


def tainted(router: Proc) -> dict[str, set[tuple[str, str, str]]]:
    """Endpoint -> its taints (device, key, effect), as the router reports them."""
    out: dict[str, set[tuple[str, str, str]]] = {}
    for s in router.samples():
        if s.name == TAINTED and s.value == 1:
            out.setdefault(s.labels["endpoint"], set()).add(
                (s.labels["device"], s.labels["key"], s.labels["effect"]))
    return out


def wait_tainted(router: Proc, endpoint: str, out: bool, timeout: float = 10) -> float:
    """Polls the router until ``endpoint`` is (``out``) or is no longer out
    of rotation for a device taint; the monotonic time the answer saying so
    came (it was so by then: a request sent later is routed so)."""
    deadline = time.monotonic() + timeout
    while True:
        seen = (endpoint in tainted(router)) == out
        now = time.monotonic()
        if seen:
            return now
        if now > deadline:
            raise AssertionError(f"{endpoint} {'never left' if out else 'never came back to'} "
                                 "rotation")
        time.sleep(0.02)


def pod_events(rest: JsonApi, namespace: str, pod: str, reason: str) -> list[dict[str, Any]]:
    """The Events on ``pod`` of ``reason``."""
    items: list[dict[str, Any]] = rest.request(
        "GET", f"/api/v1/namespaces/{namespace}/events",
        [("fieldSelector", f"involvedObject.name={pod},reason={reason}")])["items"]
    return items


@dataclass(frozen=True)
class Victim:
    """A model pod whose GPU the test breaks: its endpoint, its device as
    the router names it (driver/pool/device) and the GPU's index in the
    fake NVML scenario."""

    namespace: str
    pod: str
    endpoint: str
    device: str
    gpu: int


def xid_round(traffic: Traffic, rest: JsonApi, scenario: Path, victim: Victim,
              within_s: float = 2.0) -> float:
    """While ``traffic`` flows through its router: a critical XID under the
    victim's GPU takes its endpoint out of rotation within ``within_s`` (no
    request sent after goes there; a DeviceTainted Event on the pod); the
    GPU reset (lost, then answering again), it comes back and serves (a
    DeviceTaintsCleared Event). Seconds from the XID to out of rotation."""
    router, ep = traffic.router, victim.endpoint
    wait_for("traffic on it", lambda: traffic.served(ep) > 0, timeout=20)
    sent = time.monotonic()
    inject_xid(scenario, victim.gpu, 79)
    out = wait_tainted(router, ep, out=True)
    assert out - sent < within_s, f"out of rotation {out - sent:.2f} s after the XID"
    # the driver's unhealthy taint and the XID's come in one write or two
    wait_for("the XID's taint", lambda: (victim.device, TAINT_XID, "NoSchedule") in
             tainted(router).get(ep, ()))
    wait_for("traffic after the XID", lambda: len(traffic.sent) > 40 + sum(
        1 for s in traffic.sent if s.at <= out), timeout=20)
    assert traffic.served(ep, out) == 0, [
        line for line in router.log.read_text().splitlines() if "rotation" in line]
    warnings = pod_events(rest, victim.namespace, victim.pod, "DeviceTainted")
    assert warnings and all(e["type"] == "Warning" for e in warnings), warnings
    set_lost(scenario, [victim.gpu])  # the GPU reset
    wait_for("the GPU lost", lambda: any(
        t[1] == TAINT_GPU_LOST for t in tainted(router).get(ep, ())), timeout=20)
    set_lost(scenario, [])
    back = wait_tainted(router, ep, out=False, timeout=20)
    wait_for("traffic on it again", lambda: traffic.served(ep, back) > 0, timeout=20)
    cleared = pod_events(rest, victim.namespace, victim.pod, "DeviceTaintsCleared")
    assert cleared and all(e["type"] == "Normal" for e in cleared), cleared
    return out - sent
