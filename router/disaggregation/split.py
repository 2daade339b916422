"""Serving one request split between a prefill and a decode endpoint: the
two protocols of ``toposerve.router.disaggregation.pairing`` played over the proxy, and the
fallback when the hand-over fails (the decode endpoint prefills itself)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import structlog
from aiohttp import web

from toposerve.router.admission.budget import Hold
from toposerve.router.disaggregation.pairing import (
    RESPONSES_PATH,
    Disaggregation,
    decode_body,
    kv_params_of,
    prefill_body,
)
from toposerve.router.exchange import Exchange, Route
from toposerve.router.metrics import RouterMetrics
from toposerve.router.pool.endpoints import Endpoint
from toposerve.router.relay.proxy import Proxy, Upstream
from toposerve.router.request import RequestContext
from toposerve.router.scheduling.profile import Decision, Scheduler
from toposerve.topology.transfer import transfer
from toposerve.wire.errors import ApiError

log = structlog.get_logger("router.disaggregation.split")
PREFILL_HEADER = "X-Toposerve-Prefill-Endpoint"
# admits the request and ranks the endpoints of one stage (the director's
# admit and schedule stages)
Schedule = Callable[[Exchange, Scheduler], Awaitable[Decision]]


class Splitter:
    def __init__(self, pd: Disaggregation, proxy: Proxy, metrics: RouterMetrics,
                 schedule: Schedule) -> None:
        self.pd, self.proxy, self.metrics, self.schedule = pd, proxy, metrics, schedule
        self._background: set[asyncio.Task[Any]] = set()  # held so they are not collected

    def splits(self, ex: Exchange) -> bool:
        """The Responses API is split the NIXL way only: vLLM takes
        kv_transfer_params there, SGLang's bootstrap fields are for its
        chat and completions APIs."""
        assert ex.ctx is not None
        return (self.pd.protocol == "nixl" or ex.path != RESPONSES_PATH) and self.pd.applies(
            ex.ctx)

    async def serve(self, ex: Exchange) -> web.StreamResponse:
        if self.pd.protocol == "sglang":
            return await self._sglang(ex)
        r = await self.hand_over(ex)
        if isinstance(r, web.Response):
            return r
        return await self.relay(ex, r)

    async def relay(self, ex: Exchange, r: Route,
                    on_status: Callable[[int], None] | None = None) -> web.StreamResponse:
        ex.route = r
        return await self.proxy.relay(ex, on_status=on_status)

    async def hand_over(self, c: Exchange) -> Route | web.Response:
        """NIXL: prefill first; its answer says where the decode endpoint
        finds the KV. A prompt the prefill refuses comes back as it is.
        Too little to prefill: the request runs whole on a decode endpoint."""
        assert c.ctx is not None
        if not self.pd.worth_splitting(c.ctx):
            self.metrics.disaggregation.labels("whole").inc()
            d = await self.schedule(c, self.pd.decode)
            return Route(d.ranked, c.body, d.work())
        pre = await self.schedule(c, self.pd.prefill)
        up = await self.proxy.fetch(pre.ranked, c.path, prefill_body(c.doc, c.path), c.headers,
                                    pre.work(), c.hold)
        if isinstance(up, Upstream) and 400 <= up.status < 500:
            # the prompt itself is refused (too long, say): a decode endpoint would refuse it too
            self.metrics.disaggregation.labels("refused").inc()
            return web.Response(status=up.status, body=up.body, content_type=None, headers={
                "Content-Type": up.content_type, "X-Request-Id": c.request_id})
        params = kv_params_of(up.body) if isinstance(up, Upstream) and up.status == 200 else None
        prefill = up.endpoint if isinstance(up, Upstream) else None
        decode = self._decode_for(c.ctx, prefill)
        if params is None or prefill is None:  # no KV to hand over
            return self._local_prefill(c, decode, up)
        self._split(prefill, decode.ranked[0])
        return Route(decode.ranked, decode_body(c.doc, params), decode.no_prefill(), prefill,
                     {PREFILL_HEADER: prefill.name})

    async def _sglang(self, c: Exchange) -> web.StreamResponse:
        """Both halves at once; the decode endpoint waits for the KV itself."""
        assert c.ctx is not None
        pre = await self.schedule(c, self.pd.prefill)
        prefill = pre.ranked[0]
        decode = self._decode_for(c.ctx, prefill)
        boot = self.pd.bootstrap(prefill)

        def answered(status: int) -> None:
            if status != 502:  # 502: the decode endpoint got no KV (below)
                self._split(prefill, decode.ranked[0])

        # the prefill may answer after the request ended: its bytes are held apart
        held = Hold()
        first = asyncio.create_task(self.proxy.fetch(
            [prefill], c.path, orjson.dumps({**c.doc, **boot, "stream": False}), c.headers,
            pre.work(), held))
        first.add_done_callback(lambda _: self.proxy.budget.give_back(held))
        try:
            # one decode attempt: another would wait for the same room in vain
            resp = await self.relay(c, Route(decode.ranked[:1], orjson.dumps({**c.doc, **boot}),
                                             decode.no_prefill(), prefill,
                                             {PREFILL_HEADER: prefill.name}), answered)
        except BaseException:
            first.cancel()  # no answer goes out (the client left): the prefill is for nobody
            raise
        # the prefill's answer says nothing the client needs: never wait for it here
        self._background.add(first)
        first.add_done_callback(self._background.discard)
        if not resp.prepared and resp.status == 502:  # the decode endpoint got no KV
            why = first.result() if first.done() else "prefill still running"
            return await self.relay(c, self._local_prefill(c, decode, why))
        return resp

    def _split(self, prefill: Endpoint, decode: Endpoint) -> None:
        self.metrics.disaggregation.labels("split").inc()
        tier = ("unknown" if prefill.path is None or decode.path is None
                else transfer(prefill.path, prefill.devices, decode.path, decode.devices
                              ).tier.name.lower())
        self.metrics.pd_pairs.labels(tier).inc()

    def _decode_for(self, ctx: RequestContext, prefill: Endpoint | None) -> Decision:
        d = self.pd.pick_decode(ctx, prefill)
        if not d.ranked:
            raise ApiError(503, "no ready decode endpoint serves this request")
        self.metrics.decisions.labels(d.reason).inc()
        return d

    def _local_prefill(self, c: Exchange, decode: Decision, prefill: Upstream | str) -> Route:
        """The split failed before the decode endpoint had its KV: it gets
        the request whole and prefills the prompt itself."""
        log.warning("prefill failed; decoding with a local prefill",
                    request_id=c.request_id,
                    prefill=prefill if isinstance(prefill, str) else f"HTTP {prefill.status}")
        self.metrics.disaggregation.labels("prefill-failed").inc()
        return Route(decode.ranked, c.body, decode.whole())
