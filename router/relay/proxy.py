"""Forwarding one request upstream: try the ranked endpoints in order until
one answers; relay a stream chunk by chunk as it arrives (the relay's own
client, ``toposerve.router.relay.upstream``; aiohttp's for ``fetch``); end a stream
that breaks after its first byte with an SSE error event, never silently."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol, TypeVar

import aiohttp
import structlog
from aiohttp import web

from toposerve.router.admission.budget import Budget, Hold
from toposerve.router.admission.usage import Answered
from toposerve.router.exchange import Exchange
from toposerve.router.metrics import RouterMetrics
from toposerve.router.pool.endpoints import Endpoint, Work
from toposerve.router.relay.upstream import Answer, UpstreamError, Upstreams
from toposerve.wire.errors import error_response, sse_error

log = structlog.get_logger("router.relay.proxy")

# hop-by-hop (RFC 9110 7.6.1) and length headers are the proxy's own
# business; the router answered the client's Expect itself, and the body
# goes on decoded (aiohttp undoes a Content-Encoding as it reads)
_DROP = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive",
                   "accept-encoding", "te", "trailer", "upgrade", "proxy-connection",
                   "proxy-authorization", "expect", "content-encoding"})
_RETRY_STATUSES = {500, 502, 503, 504}


class _Response(Protocol):
    """What failover needs of an answer: aiohttp's, or the relay's own."""

    @property
    def status(self) -> int: ...

    def release(self) -> None: ...

    def close(self) -> None: ...


A = TypeVar("A", bound=_Response)


@dataclass
class Upstream:
    """A non-streamed answer, for callers that post-process it."""

    endpoint: Endpoint
    status: int
    body: bytes
    content_type: str


def forward_headers(request: web.Request, key_checked: bool) -> dict[str, str]:
    """The client's headers for the upstream, with the client's X-Request-Id
    or a new one (every upstream call of the request carries the same); a
    key the router checked is its own credential, not sent on."""
    # and what the client's Connection header names as hop-by-hop too
    conn = request.headers.get("Connection")
    drop = _DROP if conn is None else _DROP | {t.strip().lower() for t in conn.split(",")}
    if key_checked:
        drop = drop | {"authorization"}
    out = {k: v for k, v in request.headers.items() if k.lower() not in drop}
    out["X-Request-Id"] = request.headers.get("X-Request-Id") or request_id()
    return out


def broke(ep: Endpoint, err: Exception) -> str:
    """What a client is told of an upstream that broke while answering."""
    why = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    return f"upstream {ep.name} broke while answering ({why})"


def request_id() -> str:
    """32 random hex digits, as uuid4().hex gives, for a fifth of its cost
    (no system call): an id for logs, not a secret."""
    return f"{random.getrandbits(128):032x}"


class Sent(NamedTuple):
    """A request on its way to the endpoint that answered: when it was sent,
    the prefill tokens the endpoint then had to do, its own included, and
    the other requests' part of them."""

    at: float
    ahead: int
    backlog: int


class _Buffered(web.StreamResponse):
    """A streamed answer whose headers go out with its first event, in one
    write (as web.Response sends its headers with the body)."""

    _send_headers_immediately = False


class StreamTap(Protocol):
    """Sees a relayed event stream and may change it on the way."""

    async def feed(self, ep: Endpoint, chunk: bytes) -> bytes: ...

    def tail(self) -> bytes: ...


class Proxy:
    def __init__(self, session: aiohttp.ClientSession, metrics: RouterMetrics,
                 max_attempts: int, timeout: aiohttp.ClientTimeout,
                 on_done: Callable[[], None], budget: Budget, client_timeout_s: float,
                 max_answer_bytes: int) -> None:
        self.session, self.metrics = session, metrics
        self.max_attempts, self.timeout = max_attempts, timeout
        self.budget, self.client_timeout_s = budget, client_timeout_s
        # an answer over the whole byte budget could never be held
        self.max_answer_bytes = min(max_answer_bytes, budget.cfg.max_inflight_bytes)
        self.on_done = on_done  # an endpoint may have room again
        self._asking: set[asyncio.Task[object]] = set()  # waiting for an upstream's headers
        self._answering: set[_Response] = set()
        self.upstreams = Upstreams(timeout.sock_connect, timeout.sock_read)
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

    def close(self) -> None:
        """Close the relay's kept-alive connections (the router stopped)."""
        self.upstreams.close()

    def refusal(self, why: str) -> web.Response:
        """The answer when no endpoint answered: ``why`` is the last failure."""
        if self.cut_reason is not None:
            return error_response(503, self.cut_reason)
        return error_response(502, f"no endpoint could take the request ({why})")

    def _broke(self, ep: Endpoint, err: Exception) -> tuple[int, str]:
        if self.cut_reason is not None:
            return 503, self.cut_reason
        self.metrics.midstream.inc()
        return 502, broke(ep, err)

    async def _open(self, ranked: list[Endpoint], work: Work,
                    post: Callable[[Endpoint], Awaitable[A]]
                    ) -> tuple[Endpoint, A, Sent] | tuple[None, str, None]:
        """``post`` to each endpoint in turn until one answers with other
        than a 5xx; the answer and when it was sent, else why none did."""
        last_error = "no endpoint"
        task = asyncio.current_task()
        assert task is not None
        for ep in ranked[:self.max_attempts]:
            if self.cut_reason is not None:
                return None, self.cut_reason, None
            prefill = work.prefill(ep)
            sent = Sent(time.monotonic(), ep.prefill_tokens + prefill, ep.prefill_tokens)
            ep.begin(work.tokens, prefill)
            self._asking.add(task)
            try:
                resp = await post(ep)
            except asyncio.CancelledError:
                ep.end(work.tokens, prefill)
                if self.cut_reason is None:
                    raise
                task.uncancel()  # our own cancel, answered below
                return None, self.cut_reason, None
            except (aiohttp.ClientError, OSError, TimeoutError) as err:
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
            return ep, resp, sent
        return None, last_error, None

    async def fetch(self, ranked: list[Endpoint], path: str, body: bytes,
                    headers: dict[str, str], work: Work, hold: Hold) -> Upstream | str:
        """The whole answer of the first endpoint that gives one, its bytes
        held in ``hold``; else why not."""
        ep, resp_or_err, _ = await self._open(ranked, work, lambda ep: self.session.post(
            ep.url + path, data=body, headers=headers, timeout=self.timeout))
        if ep is None:
            return str(resp_or_err)
        assert isinstance(resp_or_err, aiohttp.ClientResponse)
        resp = resp_or_err
        try:
            data = await self._whole(resp, hold)
        except (aiohttp.ClientError, TimeoutError, UpstreamError) as err:
            return self._broke(ep, err)[1]
        finally:
            self._answering.discard(resp)
            resp.release()
            ep.end(work.tokens, work.prefill(ep))
            self.on_done()
        return Upstream(ep, resp.status, data, resp.headers.get("Content-Type",
                                                                "application/json"))

    async def _whole(self, resp: aiohttp.ClientResponse, hold: Hold) -> bytes:
        """aiohttp's answer, read whole within server.maxAnswerBytes and
        the in-flight byte budget."""
        chunks: list[bytes] = []
        size = 0
        async for piece in resp.content.iter_any():
            size += len(piece)
            if size > self.max_answer_bytes:
                raise UpstreamError(f"answer over {self.max_answer_bytes} bytes "
                                    "(server.maxAnswerBytes)")
            self.budget.take(hold, len(piece), "answer bytes")
            chunks.append(piece)
        return b"".join(chunks)

    async def _sent(self, request: web.Request, write: Awaitable[None]) -> None:
        """A write to the client, which must take some of its answer within
        server.clientTimeoutSeconds: one that reads nothing is cut off, so
        its slot, its bytes and its upstream are freed."""
        try:
            async with asyncio.timeout(self.client_timeout_s):
                await write
        except TimeoutError:
            if request.transport is not None:
                request.transport.abort()
            self.metrics.stalled_clients.inc()
            raise ConnectionResetError(
                f"the client read nothing for {self.client_timeout_s:g} s "
                "(server.clientTimeoutSeconds)") from None

    async def relay(self, ex: Exchange, tap: StreamTap | None = None,
                    on_status: Callable[[int], None] | None = None) -> web.StreamResponse:
        """Relays the answer to ``ex``'s route to its client, recording on
        it who answered and what went by. ``on_status`` hears the
        upstream's status before any of its body reaches the client, so what
        it counts is there when the client is done."""
        route, request, path, started = ex.route, ex.request, ex.path, ex.started
        assert route is not None
        work = route.work
        ep, up_or_err, sent = await self._open(route.ranked, work, lambda ep: self.upstreams.post(
            ep.url, path, ex.headers, route.body))
        if ep is None or sent is None:
            return self.refusal(str(up_or_err))
        assert isinstance(up_or_err, Answer)
        up = up_or_err
        ex.endpoint = ep
        if on_status is not None:
            on_status(up.status)
        out_headers = {"X-Request-Id": ex.request_id, "X-Toposerve-Endpoint": ep.name,
                       **route.headers}
        prefill_pending = work.prefill(ep)
        ctype = up.headers.get("content-type", "application/json")
        ttfb = self.metrics.ttfb_of(path)
        try:
            if not ctype.startswith("text/event-stream"):
                try:
                    data = await up.read(self.max_answer_bytes, lambda n: self.budget.take(
                        ex.hold, n, "answer bytes"))
                except (UpstreamError, TimeoutError) as err:
                    return error_response(*self._broke(ep, err))
                ex.answered = Answered()  # flow control settles on what went by
                ex.answered.saw(data)
                ttfb.observe(time.monotonic() - started)
                ep.first_byte(prefill_pending)
                prefill_pending = 0
                return web.Response(status=up.status, body=data, content_type=None,
                                    headers={**out_headers, "Content-Type": ctype})
            # the headers wait for the first event only when it came with them
            out = (_Buffered if up.buffered else web.StreamResponse)(status=up.status, headers={
                **out_headers, "Content-Type": ctype, "Cache-Control": "no-cache"})
            await out.prepare(request)
            try:
                chunk = await up.chunk()  # b"": the body ended
                if chunk:
                    now = time.monotonic()
                    ttfb.observe(now - started)
                    ep.learn_prefill(now - sent.at, sent.ahead, sent.backlog)
                    ep.first_byte(prefill_pending)
                    prefill_pending = 0
                # flow control settles on what went by
                seen = ex.answered = Answered()
                if tap is None:
                    if chunk and request.transport is not None:
                        if (left := up.rest()) is not None:
                            # the whole answer came: headers, body and its end in one write
                            seen.saw(chunk)
                            if left:
                                seen.saw(left)
                            await self._sent(request, out.write_eof(chunk + left))
                            return out
                        # the headers go out with the first event
                        await self._sent(request, out.write(chunk))
                        seen.saw(chunk)
                        # the rest from the upstream's socket callback to the
                        # client's transport: no await an event
                        writer = request.writer
                        await up.pipe(request.transport,
                                      out.headers.get("Transfer-Encoding") == "chunked",
                                      lambda: self._sent(request, writer.drain()), seen.saw)
                else:
                    # what is counted is what the tap sends on: an event
                    # that never ends is scanned by the tap alone (counting
                    # it too was half the router's CPU under an upstream
                    # that sent one, fast and unended)
                    while chunk:
                        if events := await tap.feed(ep, chunk):
                            await self._sent(request, out.write(events))
                            seen.saw(events)
                        chunk = await up.chunk()
                    if rest := tap.tail():
                        await self._sent(request, out.write(rest))
                        seen.saw(rest)
            except (UpstreamError, TimeoutError) as err:
                status, why = self._broke(ep, err)
                log.warning("stream broke", endpoint=ep.name, error=type(err).__name__,
                            reason=why)
                await self._sent(request, out.write(sse_error(status, why)))
            await self._sent(request, out.write_eof())
            return out
        except (ConnectionResetError, asyncio.CancelledError):
            raise  # the client went away; the finally below frees the upstream
        finally:
            self._answering.discard(up)
            up.release()
            ep.end(work.tokens, prefill_pending)
            self.on_done()
