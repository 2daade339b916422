"""Forwarding one request upstream: try the ranked endpoints in order until
one answers; relay a stream chunk by chunk as it arrives; end a stream that
breaks after its first byte with an SSE error event, never silently."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import aiohttp
import structlog
from aiohttp import web

from router.endpoints import Endpoint
from router.errors import error_response, sse_error
from router.metrics import RouterMetrics
from router.scheduling.context import RequestContext

log = structlog.get_logger("router.proxy")

# hop-by-hop and length headers are the proxy's own business
_DROP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive",
         "accept-encoding"}
_RETRY_STATUSES = {500, 502, 503, 504}


@dataclass
class Work:
    """How much a request weighs on an endpoint: its prompt tokens, and how
    many of them that endpoint must prefill (it may hold the rest)."""

    tokens: int
    uncached: dict[str, int]

    def prefill(self, ep: Endpoint) -> int:
        return self.uncached.get(ep.url, self.tokens)


@dataclass
class Upstream:
    """A non-streamed answer, for callers that post-process it."""

    endpoint: Endpoint
    status: int
    body: bytes
    content_type: str


def work(ctx: RequestContext) -> Work:
    """The request's weight per endpoint, from what the prefix scorers found."""
    return Work(ctx.token_estimate, ctx.extra.get("uncached", {}))


def no_prefill(ctx: RequestContext, decode: list[Endpoint]) -> Work:
    """A decode endpoint's weight: the request's tokens, none of them to prefill."""
    return Work(ctx.token_estimate, dict.fromkeys((e.url for e in decode), 0))


def forward_headers(request: web.Request) -> dict[str, str]:
    """The client's headers for the upstream, with the client's X-Request-Id
    or a new one (every upstream call of the request carries the same)."""
    out = {k: v for k, v in request.headers.items() if k.lower() not in _DROP}
    out["X-Request-Id"] = request.headers.get("X-Request-Id") or uuid.uuid4().hex
    return out


class StreamTap(Protocol):
    """Sees a relayed event stream and may change it on the way."""

    async def feed(self, ep: Endpoint, chunk: bytes) -> bytes: ...

    def tail(self) -> bytes: ...


class Proxy:
    def __init__(self, session: aiohttp.ClientSession, metrics: RouterMetrics,
                 max_attempts: int, timeout: aiohttp.ClientTimeout,
                 on_done: Callable[[], None]) -> None:
        self.session, self.metrics = session, metrics
        self.max_attempts, self.timeout = max_attempts, timeout
        self.on_done = on_done  # an endpoint may have room again

    async def _open(self, ranked: list[Endpoint], path: str, body: bytes,
                    headers: dict[str, str], work: Work
                    ) -> tuple[Endpoint, aiohttp.ClientResponse] | tuple[None, str]:
        last_error = "no endpoint"
        for ep in ranked[:self.max_attempts]:
            prefill = work.prefill(ep)
            ep.begin(work.tokens, prefill)
            try:
                resp = await self.session.post(ep.url + path, data=body, headers=headers,
                                               timeout=self.timeout)
            except (aiohttp.ClientError, TimeoutError) as err:
                ep.end(work.tokens, prefill)
                last_error = f"{ep.name}: {type(err).__name__}"
                self.metrics.retries.inc()
                continue
            if resp.status in _RETRY_STATUSES:
                resp.release()
                ep.end(work.tokens, prefill)
                last_error = f"{ep.name}: HTTP {resp.status}"
                self.metrics.retries.inc()
                continue
            return ep, resp
        return None, last_error

    async def fetch(self, ranked: list[Endpoint], path: str, body: bytes,
                    headers: dict[str, str], work: Work) -> Upstream | str:
        """The whole answer of the first endpoint that gives one; else why not."""
        ep, resp_or_err = await self._open(ranked, path, body, headers, work)
        if ep is None:
            return str(resp_or_err)
        assert isinstance(resp_or_err, aiohttp.ClientResponse)
        resp = resp_or_err
        try:
            data = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as err:
            return f"{ep.name}: broke while answering ({type(err).__name__})"
        finally:
            resp.release()
            ep.end(work.tokens, work.prefill(ep))
            self.on_done()
        return Upstream(ep, resp.status, data, resp.headers.get("Content-Type",
                                                                "application/json"))

    async def relay(self, request: web.Request, ranked: list[Endpoint], path: str,
                    body: bytes, headers: dict[str, str], work: Work, started: float,
                    tap: StreamTap | None = None, extra_headers: dict[str, str] | None = None
                    ) -> web.StreamResponse:
        ep, resp_or_err = await self._open(ranked, path, body, headers, work)
        if ep is None:
            return error_response(502, f"no endpoint could take the request ({resp_or_err})")
        assert isinstance(resp_or_err, aiohttp.ClientResponse)
        resp = resp_or_err
        out_headers = {"X-Request-Id": headers["X-Request-Id"], "X-Toposerve-Endpoint": ep.name,
                       **(extra_headers or {})}
        prefill_pending = work.prefill(ep)
        ctype = resp.headers.get("Content-Type", "application/json")
        try:
            if not ctype.startswith("text/event-stream"):
                try:
                    data = await resp.read()
                except (aiohttp.ClientError, TimeoutError) as err:
                    self.metrics.midstream.inc()
                    return error_response(502, f"{ep.name} broke while answering "
                                               f"({type(err).__name__})")
                self.metrics.ttfb.labels(path).observe(time.monotonic() - started)
                ep.first_byte(prefill_pending)
                prefill_pending = 0
                return web.Response(status=resp.status, body=data, content_type=None,
                                    headers={**out_headers, "Content-Type": ctype})
            out = web.StreamResponse(status=resp.status, headers={
                **out_headers, "Content-Type": ctype, "Cache-Control": "no-cache"})
            await out.prepare(request)
            first = True
            try:
                async for chunk in resp.content.iter_any():
                    if first:
                        self.metrics.ttfb.labels(path).observe(time.monotonic() - started)
                        ep.first_byte(prefill_pending)
                        prefill_pending = 0
                        first = False
                    if tap is not None:
                        chunk = await tap.feed(ep, chunk)
                    if chunk:
                        await out.write(chunk)
                if tap is not None and (rest := tap.tail()):
                    await out.write(rest)
            except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError,
                    TimeoutError) as err:
                self.metrics.midstream.inc()
                log.warning("stream broke", endpoint=ep.name, error=type(err).__name__)
                await out.write(sse_error(502, f"upstream {ep.name} failed mid-stream"))
            await out.write_eof()
            return out
        except (ConnectionResetError, asyncio.CancelledError):
            raise  # the client went away; the finally below frees the upstream
        finally:
            resp.release()
            ep.end(work.tokens, prefill_pending)
            self.on_done()
