"""Forwarding one request upstream: try the ranked endpoints in order until
one answers; relay a stream chunk by chunk as it arrives; end a stream that
breaks after its first byte with an SSE error event, never silently."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import aiohttp
import structlog
from aiohttp import web

from router.admission.tenants import KEY_CHECKED
from router.admission.usage import ANSWERED, Answered
from router.metrics import RouterMetrics
from router.pool.endpoints import Endpoint, Work
from wire.errors import error_response, sse_error

log = structlog.get_logger("router.http.proxy")

# hop-by-hop (RFC 9110 7.6.1) and length headers are the proxy's own
# business; the router answered the client's Expect itself
_DROP = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive",
                   "accept-encoding", "te", "trailer", "upgrade", "proxy-connection",
                   "proxy-authorization", "expect"})
_RETRY_STATUSES = {500, 502, 503, 504}


@dataclass
class Upstream:
    """A non-streamed answer, for callers that post-process it."""

    endpoint: Endpoint
    status: int
    body: bytes
    content_type: str


def forward_headers(request: web.Request) -> dict[str, str]:
    """The client's headers for the upstream, with the client's X-Request-Id
    or a new one (every upstream call of the request carries the same)."""
    # and what the client's Connection header names as hop-by-hop too
    conn = request.headers.get("Connection")
    drop = _DROP if conn is None else _DROP | {t.strip().lower() for t in conn.split(",")}
    if request.get(KEY_CHECKED):
        drop = drop | {"authorization"}
    out = {k: v for k, v in request.headers.items() if k.lower() not in drop}
    out["X-Request-Id"] = request.headers.get("X-Request-Id") or request_id()
    return out


def request_id() -> str:
    """32 random hex digits, as uuid4().hex gives, for a fifth of its cost
    (no system call): an id for logs, not a secret."""
    return f"{random.getrandbits(128):032x}"


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
        self._asking: set[asyncio.Task[object]] = set()  # waiting for an upstream's headers
        self._answering: set[aiohttp.ClientResponse] = set()
        self.cut_reason: str | None = None

    def cut(self, reason: str) -> None:
        """End every request still in flight (the router is stopping): each
        tells its client ``reason``, a stream in an SSE error event, and its
        upstream connection is closed, which aborts the generation there."""
        self.cut_reason = reason
        for task in list(self._asking):
            task.cancel()
        for resp in list(self._answering):
            resp.close()

    def refusal(self, why: str) -> web.Response:
        """The answer when no endpoint answered: ``why`` is the last failure."""
        if self.cut_reason is not None:
            return error_response(503, self.cut_reason)
        return error_response(502, f"no endpoint could take the request ({why})")

    def _broke(self, ep: Endpoint, err: Exception) -> tuple[int, str]:
        if self.cut_reason is not None:
            return 503, self.cut_reason
        self.metrics.midstream.inc()
        return 502, f"upstream {ep.name} broke while answering ({type(err).__name__})"

    async def _open(self, ranked: list[Endpoint], path: str, body: bytes,
                    headers: dict[str, str], work: Work
                    ) -> tuple[Endpoint, aiohttp.ClientResponse] | tuple[None, str]:
        last_error = "no endpoint"
        task = asyncio.current_task()
        assert task is not None
        for ep in ranked[:self.max_attempts]:
            if self.cut_reason is not None:
                return None, self.cut_reason
            prefill = work.prefill(ep)
            ep.begin(work.tokens, prefill)
            self._asking.add(task)
            try:
                resp = await self.session.post(ep.url + path, data=body, headers=headers,
                                               timeout=self.timeout)
            except asyncio.CancelledError:
                ep.end(work.tokens, prefill)
                if self.cut_reason is None:
                    raise
                task.uncancel()  # our own cancel, answered below
                return None, self.cut_reason
            except (aiohttp.ClientError, TimeoutError) as err:
                ep.end(work.tokens, prefill)
                last_error = f"{ep.name}: {type(err).__name__}"
                self.metrics.retries.inc()
                continue
            finally:
                self._asking.discard(task)
            if resp.status in _RETRY_STATUSES:
                resp.release()
                ep.end(work.tokens, prefill)
                last_error = f"{ep.name}: HTTP {resp.status}"
                self.metrics.retries.inc()
                continue
            self._answering.add(resp)
            if resp.status < 400 and work.answered is not None:
                work.answered(ep)  # where the prompt is cached now, not where it was meant to go
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
            return self._broke(ep, err)[1]
        finally:
            self._answering.discard(resp)
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
            return self.refusal(str(resp_or_err))
        assert isinstance(resp_or_err, aiohttp.ClientResponse)
        resp = resp_or_err
        out_headers = {"X-Request-Id": headers["X-Request-Id"], "X-Toposerve-Endpoint": ep.name,
                       **(extra_headers or {})}
        prefill_pending = work.prefill(ep)
        ctype = resp.headers.get("Content-Type", "application/json")
        seen = request[ANSWERED] = Answered()  # flow control settles on what went by
        try:
            if not ctype.startswith("text/event-stream"):
                try:
                    data = await resp.read()
                except (aiohttp.ClientError, TimeoutError) as err:
                    return error_response(*self._broke(ep, err))
                seen.saw(data)
                self.metrics.ttfb.labels(path).observe(time.monotonic() - started)
                ep.first_byte(prefill_pending)
                prefill_pending = 0
                return web.Response(status=resp.status, body=data, content_type=None,
                                    headers={**out_headers, "Content-Type": ctype})
            out = web.StreamResponse(status=resp.status, headers={
                **out_headers, "Content-Type": ctype, "Cache-Control": "no-cache"})
            await out.prepare(request)
            content, write = resp.content, out.write
            try:
                chunk = await content.readany()  # b"": the body ended
                if chunk:
                    self.metrics.ttfb.labels(path).observe(time.monotonic() - started)
                    ep.first_byte(prefill_pending)
                    prefill_pending = 0
                if tap is None:
                    # the hot loop of every stream: one read and one write an
                    # event, nothing else (readany returns b"" at the end)
                    while chunk:
                        await write(chunk)
                        seen.saw(chunk)
                        chunk = await content.readany()
                else:
                    while chunk:
                        if events := await tap.feed(ep, chunk):
                            await write(events)
                        seen.saw(chunk)
                        chunk = await content.readany()
                    if rest := tap.tail():
                        await write(rest)
            except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError,
                    TimeoutError) as err:
                status, why = self._broke(ep, err)
                log.warning("stream broke", endpoint=ep.name, error=type(err).__name__,
                            reason=why)
                await out.write(sse_error(status, why))
            await out.write_eof()
            return out
        except (ConnectionResetError, asyncio.CancelledError):
            raise  # the client went away; the finally below frees the upstream
        finally:
            self._answering.discard(resp)
            resp.release()
            ep.end(work.tokens, prefill_pending)
            self.on_done()
