"""The stages a generation request goes through, over its exchange:
**admit** (flow control may hold or refuse it), **schedule** (a profile
ranks the endpoints), **relay** (the proxy forwards it and streams the
answer back), **settle** (what flow control charged is squared with what
the answer cost). A split request runs admit and schedule once a half, in
``toposerve.router.disaggregation.split``, which the director hands it to.
The wiring that builds the parts lives in ``toposerve.router.http.app``."""

from __future__ import annotations

import time

from aiohttp import web

from toposerve.router.admission.flow_control import Admission
from toposerve.router.admission.usage import output_tokens
from toposerve.router.disaggregation.pairing import Disaggregation
from toposerve.router.disaggregation.split import Splitter
from toposerve.router.exchange import Asked, Exchange, Route
from toposerve.router.ha.replication import Replication
from toposerve.router.metrics import RouterMetrics
from toposerve.router.relay.proxy import Proxy, StreamTap
from toposerve.router.scheduling.profile import Decision, Scheduler
from toposerve.wire.errors import ApiError


class Director:
    def __init__(self, metrics: RouterMetrics, admission: Admission, scheduler: Scheduler,
                 replication: Replication | None) -> None:
        self.metrics, self.admission, self.scheduler = metrics, admission, scheduler
        self.replication = replication
        self._proxy: Proxy | None = None
        self.split: Splitter | None = None

    def bind(self, proxy: Proxy, pd: Disaggregation | None) -> None:
        """The proxy exists once the router runs (it holds the event loop's
        client session)."""
        self._proxy = proxy
        if pd is not None:
            self.split = Splitter(pd, proxy, self.metrics, self.route)

    @property
    def proxy(self) -> Proxy:
        assert self._proxy is not None, "the director is bound when the router starts"
        return self._proxy

    # --- the stages ------------------------------------------------------------
    async def admit(self, ex: Asked, scheduler: Scheduler) -> None:
        """Returns when flow control lets the request go to ``scheduler``'s
        endpoints; raises its 429/503. The charge is kept on the exchange,
        to be settled when the request ends."""
        ctx = ex.ctx
        assert ctx is not None
        c = self.admission.classify(ex.client_headers, ex.tenant, ctx.session,
                                    ctx.token_estimate, ex.max_tokens, ex.body_size)
        c.follow_up = bool(ex.charges)  # a split request's second half
        ex.charges.append(c)
        await self.admission.admit(c, lambda: scheduler.candidates(ctx))

    def schedule(self, ex: Asked, scheduler: Scheduler) -> Decision:
        """The endpoints ranked for the request; 503 when none serves it."""
        assert ex.ctx is not None
        t0 = time.perf_counter()
        d = scheduler.schedule(ex.ctx)
        self.metrics.scheduling.observe(time.perf_counter() - t0)
        if self.replication is not None:
            self.replication.tap(d, scheduler)  # the other routers learn where it went
        if not d.ranked:
            raise ApiError(503, "no ready endpoint serves this request")
        self.metrics.decided(d.reason)
        if (p := d.cycle.prefix) is not None and p.blocks:
            self.metrics.prefix_match.observe(p.matched.get(d.ranked[0].url, 0) / p.blocks)
        return d

    async def relay(self, ex: Exchange, tap: StreamTap | None = None) -> web.StreamResponse:
        return await self.proxy.relay(ex, tap)

    def settle(self, ex: Asked, refused: bool) -> None:
        """The request ended, answered, refused or abandoned by its client:
        its charges are settled with the output a handler read from the
        answer's usage, else what the proxy counted; none when it was
        ``refused`` with nothing relayed."""
        if not ex.charges:
            return
        output = ex.output_tokens
        if output is None and ex.answered is not None:
            output = output_tokens(ex.answered)
        if output is None and refused:
            output = 0
        self.admission.settle_all(ex.charges, output)

    # --- the stages in order -------------------------------------------------------
    async def route(self, ex: Exchange, scheduler: Scheduler) -> Decision:
        """Admit, then schedule, on one stage's scheduler."""
        await self.admit(ex, scheduler)
        return self.schedule(ex, scheduler)

    async def whole(self, ex: Exchange) -> Route:
        """The route of a request served by one endpoint."""
        d = await self.route(ex, self.scheduler)
        return Route(d.ranked, ex.body, d.work())

    async def generate(self, ex: Exchange) -> web.StreamResponse:
        """A chat or completions request, whole or split, to its answer."""
        if self.split is not None and self.split.splits(ex):
            return await self.split.serve(ex)
        ex.route = await self.whole(ex)
        return await self.relay(ex)
