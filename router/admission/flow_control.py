"""Admission and flow control on llm-d's headers.

``x-llm-d-inference-objective`` names an objective, which has a priority
(negative = sheddable); ``x-llm-d-inference-fairness-id`` names the flow (the
tenant); ``x-llm-d-slo-ttft-ms`` bounds how long a request may wait here.
When every endpoint that could serve a request is saturated, a sheddable
request gets 429 at once. With flow control on, the others wait in the
router: highest priority first, round-robin between the flows of one
priority (so one busy tenant cannot starve the rest), until an endpoint has
room; one that waits past its time gets 429 (503 if no endpoint is left).
With flow control off they are sent anyway, as before.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from multidict import CIMultiDictProxy

from router.config import AdmissionConfig
from router.metrics import RouterMetrics
from router.pool.endpoints import Endpoint
from router.state import RouterState
from wire.errors import ApiError

OBJECTIVE_HEADER = "x-llm-d-inference-objective"
FAIRNESS_HEADER = "x-llm-d-inference-fairness-id"
SLO_TTFT_HEADER = "x-llm-d-slo-ttft-ms"
DEFAULT_FLOW = "default"


@dataclass
class Ticket:
    priority: int
    flow: str
    candidates: Callable[[], list[Endpoint]]
    ready: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


@dataclass
class Classified:
    priority: int
    flow: str
    max_wait_s: float


class Admission:
    def __init__(self, cfg: AdmissionConfig, state: RouterState,
                 metrics: RouterMetrics) -> None:
        self.cfg, self.state, self.metrics = cfg, state, metrics
        self.priorities = {o.name: o.priority for o in cfg.objectives}
        # priority -> flow -> waiting tickets; flows rotate for fairness
        self._bands: dict[int, OrderedDict[str, deque[Ticket]]] = {}
        self.queued = 0

    def classify(self, headers: CIMultiDictProxy[str]) -> Classified:
        objective = headers.get(OBJECTIVE_HEADER)
        priority = self.priorities.get(objective, 0) if objective else 0
        wait = self.cfg.flow_control.queue_ttl_s
        slo = headers.get(SLO_TTFT_HEADER)
        if slo is not None:
            try:
                wait = min(wait, max(0.0, float(slo)) / 1000)
            except ValueError:
                raise ApiError(400, f"{SLO_TTFT_HEADER} must be a number of milliseconds, "
                                    f"not {slo!r}", SLO_TTFT_HEADER) from None
        return Classified(priority, headers.get(FAIRNESS_HEADER) or DEFAULT_FLOW, wait)

    def _room(self, eps: list[Endpoint]) -> bool:
        now = time.monotonic()
        return any(not self.state.saturated(e, now) for e in eps)

    def _ahead(self, priority: int) -> bool:
        return any(p >= priority and flows for p, flows in self._bands.items())

    async def admit(self, c: Classified, candidates: Callable[[], list[Endpoint]]) -> None:
        """Returns when the request may go; raises 429/503 when it may not."""
        fc = self.cfg.flow_control
        if c.priority >= 0 and not fc.enabled:
            return  # nothing to decide: it goes now, saturated or not
        eps = candidates()
        if not eps:
            return  # the scheduler answers 503
        if self._room(eps) and not self._ahead(c.priority):
            self.metrics.admission.labels("admitted").inc()
            return
        if c.priority < 0:
            self.metrics.admission.labels("shed").inc()
            raise ApiError(429, "all endpoints are saturated and this request's objective is "
                                "sheddable (negative priority); retry later")
        if not fc.enabled:
            self.metrics.admission.labels("admitted").inc()
            return
        if self.queued >= fc.max_queued:
            self.metrics.admission.labels("queue-full").inc()
            raise ApiError(429, f"the router's queue is full ({fc.max_queued} requests, "
                                "admission.flowControl.maxQueued); retry later")
        ticket = Ticket(c.priority, c.flow, candidates)
        self._push(ticket)
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(asyncio.shield(ticket.ready), c.max_wait_s)
        except TimeoutError:
            self._remove(ticket)
            if not candidates():
                raise ApiError(503, "no ready endpoint serves this request") from None
            self.metrics.admission.labels("expired").inc()
            raise ApiError(429, f"no endpoint had room within {c.max_wait_s:g} s "
                                "(admission.flowControl.queueTTLSeconds or "
                                f"{SLO_TTFT_HEADER}); retry later") from None
        except asyncio.CancelledError:
            self._remove(ticket)  # the client went away while waiting
            raise
        finally:
            self.metrics.queue_wait.observe(time.monotonic() - t0)
        self.metrics.admission.labels("queued").inc()

    def _push(self, t: Ticket) -> None:
        flows = self._bands.setdefault(t.priority, OrderedDict())
        flows.setdefault(t.flow, deque()).append(t)
        self.queued += 1
        self.metrics.queued.set(self.queued)

    def _remove(self, t: Ticket) -> None:
        flows = self._bands.get(t.priority, OrderedDict())
        q = flows.get(t.flow)
        if q is not None and t in q:
            q.remove(t)
            self.queued -= 1
            self.metrics.queued.set(self.queued)
            if not q:
                del flows[t.flow]

    def release(self, limit: int) -> int:
        """Let up to ``limit`` waiting requests go, in priority then flow order,
        each only when one of its endpoints has room. Returns how many went."""
        gone = 0
        for priority in sorted(self._bands, reverse=True):
            flows = self._bands[priority]
            stuck: set[str] = set()
            while gone < limit and len(stuck) < len(flows):
                flow, q = next(iter(flows.items()))
                flows.move_to_end(flow)  # the next flow of this priority goes next
                if flow in stuck:
                    continue
                if not self._room(q[0].candidates()):
                    stuck.add(flow)
                    continue
                t = q.popleft()
                self.queued -= 1
                if not q:
                    del flows[flow]
                if not t.ready.done():
                    t.ready.set_result(None)
                    gone += 1
            if gone >= limit:
                break
        self.metrics.queued.set(self.queued)
        return gone

    def request_done(self) -> None:
        """An answer finished: a slot may have opened."""
        if self.queued:
            self.release(1)

    async def run(self, interval_s: float) -> None:
        """After each scrape interval, let go as many as the endpoints have room for."""
        while True:
            await asyncio.sleep(interval_s)
            if self.queued:
                room = sum(max(0, self.state.config.saturation.queue_threshold
                               - int(e.load.waiting))
                           for e in self.state.pool.routable() if not self.state.saturated(e))
                self.release(max(1, room))
