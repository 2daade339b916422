"""The flow controller: who goes now, who waits in the router, who is
refused. The order of waiting requests is ``toposerve.router.admission.queues``, the
saturation maths ``toposerve.router.pool.saturation``, tenants and their keys
``toposerve.router.admission.tenants``; this module ties them to requests and to the
event loop.

Headers (llm-d's): ``x-llm-d-inference-objective`` names an objective, whose
priority is the band (negative = sheddable); ``x-llm-d-inference-fairness-id``
names the flow when no API keys are configured (with keys, the tenant is
the flow); ``x-llm-d-slo-ttft-ms`` bounds the wait here. Sheddable requests
are refused with a probability that rises with saturation, and always when
the endpoints are full. With ``flowControl.enabled`` the rest wait while
their endpoints are full, up to their TTL (then 429, or 503 if no endpoint
is left), within per-band caps; off, they go to a full endpoint.

Output tokens are charged at ``max_tokens`` (or the expectation) when a
request is admitted, the only figure known then, and settled with the
answer's real count when it ends, however it ends (``settle_all``, from
the router's settle stage): the tenant's token bucket and, for a request
that waited, its flow's and program's attained service get the
difference."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from toposerve.router.admission.queues import BandCaps, FlowQueues, Item, LeastAttained, RoundRobin
from toposerve.router.admission.tenants import Tenants
from toposerve.router.config import FlowControlConfig
from toposerve.router.metrics import RouterMetrics
from toposerve.router.pool.endpoints import Endpoint
from toposerve.router.pool.saturation import (
    free_slots,
    pool_saturation,
    saturated,
    shed_probability,
)
from toposerve.router.state import RouterState
from toposerve.router.supervise import Streak, supervise
from toposerve.wire.errors import ApiError

OBJECTIVE_HEADER = "x-llm-d-inference-objective"
FAIRNESS_HEADER = "x-llm-d-inference-fairness-id"
SLO_TTFT_HEADER = "x-llm-d-slo-ttft-ms"
DEFAULT_FLOW = "default"
# a flow, objective or session id is the client's choice and the router keeps
# it (queues, session tables): bounded, and plain text in logs and metrics
MAX_CLIENT_ID_BYTES = 256
MAX_SESSIONS = 200_000  # sessions whose last turn is remembered (turn priority)

Candidates = Callable[[], list[Endpoint]]


def client_id(headers: Mapping[str, str], *names: str) -> str | None:
    """The first of the headers ``names`` the request carries, an id its
    client chose: at most ``MAX_CLIENT_ID_BYTES`` of printable ASCII, else a
    400 naming the header."""
    for name in names:
        value = headers.get(name)
        if value is None:
            continue
        if len(value) > MAX_CLIENT_ID_BYTES or not (value.isascii() and value.isprintable()):
            raise ApiError(400, f"{name} must be at most {MAX_CLIENT_ID_BYTES} printable "
                                "ASCII characters", name)
        return value
    return None


@dataclass
class Classified:
    """What admission needs to know of one request."""

    priority: int
    flow: str
    max_wait_s: float
    tenant: str = ""
    session: str | None = None
    tokens: int = 0  # prompt tokens (an estimate)
    output_tokens: int = 0  # max_tokens, or the configured expectation
    size_bytes: int = 0
    # a split request's later admission (its decode half): the tenant's limits
    # took the request at its first, so they neither check nor charge it again
    follow_up: bool = False
    # what was charged, to settle when the answer ends
    rate_charged: bool = False  # the tenant's buckets took it
    item: Item[Ticket] | None = None  # it waited, and its flow was charged when it went


@dataclass
class Ticket:
    candidates: Candidates
    ready: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


class Admission:
    def __init__(self, cfg: FlowControlConfig, state: RouterState, metrics: RouterMetrics,
                 tenants: Tenants | None = None, clock: Callable[[], float] = time.monotonic,
                 chance: Callable[[], float] = random.random) -> None:
        self.cfg, self.state, self.metrics = cfg, state, metrics
        self.tenants = tenants or Tenants(cfg)
        self.clock, self.chance = clock, chance
        self.priorities = {o.name: o.priority for o in cfg.objectives}
        caps = {b.priority: BandCaps(b.max_requests, b.max_bytes) for b in cfg.bands}
        default_caps = BandCaps(1000, 256 * 2**20)
        fairness = LeastAttained if cfg.fairness.policy == "least-attained" else RoundRobin
        self.queues: FlowQueues[Ticket] = FlowQueues(
            lambda p: caps.get(p, default_caps), cfg.max_queued, cfg.ordering, fairness,
            cfg.fairness.program_aware)
        self._granted = 0  # let go from the queue, not yet sent on
        self._last_turn: OrderedDict[str, float] = OrderedDict()  # session -> when it went
        self._count_keys()

    @property
    def queued(self) -> int:
        return len(self.queues)

    # --- classification -------------------------------------------------------
    def classify(self, headers: Mapping[str, str], tenant: str = "", session: str | None = None,
                 tokens: int = 0, max_tokens: int | None = None,
                 size_bytes: int = 0) -> Classified:
        name = client_id(headers, OBJECTIVE_HEADER) or self.tenants.objective(tenant) or (
            self.cfg.default_objective)
        priority = self.tenants.cap(tenant, self.priorities.get(name, 0) if name else 0)
        wait = self.cfg.queue_ttl_s
        slo = headers.get(SLO_TTFT_HEADER)
        if slo is not None:
            try:
                wait = min(wait, max(0.0, float(slo)) / 1000)
            except ValueError:
                raise ApiError(400, f"{SLO_TTFT_HEADER} must be a number of milliseconds, "
                                    f"not {slo!r}", SLO_TTFT_HEADER) from None
        # with keys the tenant is the flow: a client cannot queue in another's
        flow = tenant or client_id(headers, FAIRNESS_HEADER) or DEFAULT_FLOW
        out = self.cfg.fairness.expected_output_tokens if max_tokens is None else max_tokens
        return Classified(priority, flow, wait, tenant, session, tokens, out, size_bytes)

    def _cost(self, c: Classified) -> float:
        f = self.cfg.fairness
        return f.input_token_weight * c.tokens + f.output_token_weight * c.output_tokens

    def _warm(self, c: Classified, now: float) -> bool:
        tp = self.cfg.turn_priority
        if not tp.enabled or c.session is None:
            return False
        last = self._last_turn.get(c.session)
        return last is not None and now - last <= tp.warm_s

    def _went(self, c: Classified, now: float) -> None:
        if c.session is not None and self.cfg.turn_priority.enabled:
            self._last_turn[c.session] = now
            self._last_turn.move_to_end(c.session)
            while len(self._last_turn) > MAX_SESSIONS:
                self._last_turn.popitem(last=False)

    def _count(self, c: Classified, outcome: str) -> None:
        # the band is one of the configured objectives' priorities (or 0):
        # no client can widen the label's values
        self.metrics.admission.labels(outcome, str(c.priority)).inc()
        if c.tenant:
            self.metrics.tenant_requests.labels(self.tenants.metric_label(c.tenant),
                                                outcome).inc()

    # --- the decision -----------------------------------------------------------
    def _has_room(self, eps: list[Endpoint]) -> bool:
        now = self.clock()
        if self.cfg.saturation.detector == "concurrency":
            # requests let go but not yet begun hold a slot already
            return free_slots(eps, self.state.config, now) > self._granted
        return any(not saturated(e, self.state.config, now) for e in eps)

    async def admit(self, c: Classified, candidates: Candidates) -> None:
        """Returns when the request may go; raises 429/503 when it may not."""
        now = self.clock()
        charge = bool(c.tenant) and not c.follow_up
        if charge and (why := self.tenants.over_limit(c.tenant, c.tokens + c.output_tokens,
                                                      now)):
            self._count(c, "rate-limited")
            raise ApiError(429, f"{why}; retry later")
        c.rate_charged = charge
        if c.priority >= 0 and not self.cfg.enabled:
            self._went(c, now)
            return  # nothing to decide: it goes now, full or not
        eps = candidates()
        if not eps:
            return  # the scheduler answers 503
        sat = pool_saturation(eps, self.state.config, now)
        self.metrics.saturation.set(sat)
        fs = self.cfg.saturation
        if c.priority < 0 and self.chance() < shed_probability(sat, fs.shed_start, fs.shed_all):
            self._count(c, "shed")
            raise ApiError(429, f"the endpoints are {100 * sat:.0f}% saturated and this "
                                "request's objective is sheddable (negative priority); "
                                "retry later")
        if not self.cfg.enabled or (self._has_room(eps) and not self.queues.ahead(c.priority)):
            self._count(c, "admitted")
            self._went(c, now)
            return
        if why := self.queues.full(c.priority, c.size_bytes):
            self._count(c, "queue-full")
            raise ApiError(429, f"{why}; retry later")
        await self._wait(c, candidates, now)

    async def _wait(self, c: Classified, candidates: Candidates, now: float) -> None:
        ticket = Ticket(candidates)
        item = Item(ticket, c.priority, c.flow, now, now + c.max_wait_s, c.size_bytes,
                    self._cost(c), c.session or "", self._warm(c, now))
        self.queues.push(item)
        self.metrics.queued.set(self.queued)
        try:
            await asyncio.wait_for(asyncio.shield(ticket.ready), c.max_wait_s)
        except TimeoutError:
            if not ticket.ready.done():
                self.queues.remove(item)
                self.metrics.queued.set(self.queued)
                if not candidates():
                    raise ApiError(503, "no ready endpoint serves this request") from None
                self._count(c, "expired")
                raise ApiError(429, f"no endpoint had room within {c.max_wait_s:g} s "
                                    "(flowControl.queueTTLSeconds or "
                                    f"{SLO_TTFT_HEADER}); retry later") from None
        except asyncio.CancelledError:
            if not self.queues.remove(item):  # let go, but the client went away
                self._granted -= 1
            self.metrics.queued.set(self.queued)
            raise
        finally:
            self.metrics.queue_wait.observe(self.clock() - now)
        self._granted -= 1
        c.item = item
        self._count(c, "queued")
        self._went(c, self.clock())

    # --- settling what was charged --------------------------------------------------
    def settle(self, c: Classified, output: int | None) -> None:
        """The request ``c`` ended having produced ``output`` tokens: its
        charges get the difference from the estimate (``None``: not known,
        the estimate stands). A follow-up admission's charge to its flow is
        given back whole, so a request is charged once."""
        if c.follow_up:  # its flow took a whole request's cost; the first admission pays
            if c.item is not None:
                self.queues.settle(c.item, -self._cost(c))
            c.item = None
            return
        if output is None:
            return
        tokens = output - c.output_tokens
        if c.rate_charged:
            self.tenants.settle(c.tenant, tokens, self.clock())
        if c.item is not None:
            self.queues.settle(c.item, self.cfg.fairness.output_token_weight * tokens)
        c.rate_charged, c.item = False, None  # settled once

    def settle_all(self, charges: list[Classified], output: int | None) -> None:
        """Settles every charge of one request that has ended (a split one
        was admitted twice: prefill, decode)."""
        for c in charges:
            self.settle(c, output)

    # --- letting waiting requests go ---------------------------------------------
    def release(self, limit: int) -> int:
        """Let up to ``limit`` waiting requests go, in the queues' order, each
        only when one of its endpoints has room. Returns how many went."""
        gone = 0
        while gone < limit:
            item = self.queues.pop(lambda i: self._has_room(i.payload.candidates()))
            if item is None:
                break
            if not item.payload.ready.done():
                item.payload.ready.set_result(None)
                self._granted += 1
                gone += 1
        self.metrics.queued.set(self.queued)
        return gone

    def request_done(self) -> None:
        """An answer finished: a slot may have opened."""
        if self.queued:
            self.release(1)

    async def run(self, interval_s: float) -> None:
        """Keeps the API keys current and, after each scrape interval, lets go
        as many waiting requests as the endpoints have room for. The two are
        supervised apart: a key source that fails stops no release."""
        source = self.tenants.source
        keys = asyncio.create_task(source.run()) if source is not None else None
        try:
            await supervise(Streak("flow-release"), lambda: self._release_every(interval_s))
        finally:
            if keys is not None:
                keys.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await keys

    def _count_keys(self) -> None:
        source = self.tenants.source
        if self.tenants.keys is not None:
            self.metrics.api_keys.set(len(self.tenants.keys))
        self.metrics.api_keys_loaded.set(0 if source is not None and not source.loaded else 1)

    async def _release_every(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self._count_keys()
            if self.queued:
                room = free_slots(self.state.pool.routable(), self.state.config)
                self.release(max(1, room - self._granted))
