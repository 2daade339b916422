"""One request through the endpoint picker: a proxy's external-processing
stream, from the request's headers to its answer's end. The request is
admitted and scheduled by the router's own stages (the director's admit
and schedule, over the same flow control, profile and indexes as the
standalone router), begun on the picked endpoint as the relay begins it,
and settled when the answer ends however it ends, from what the picker saw
of the answer as the proxy streamed it through. A Responses turn's answer
is stamped and stored on its way (``turns``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote

import grpc
import orjson
import structlog
from aiohttp import web

from toposerve.router.admission.budget import Hold
from toposerve.router.admission.flow_control import Classified
from toposerve.router.admission.usage import Answered
from toposerve.router.epp import protocol
from toposerve.router.epp.reading import ROUTES, Generation, read
from toposerve.router.epp.turns import TurnAnswer
from toposerve.router.http.app import Router
from toposerve.router.pool.endpoints import Endpoint, Work
from toposerve.router.request import RequestContext
from toposerve.router.responses import stored
from toposerve.router.responses.turn import Turn
from toposerve.wire.errors import ApiError, error_body

log = structlog.get_logger("router.epp")
OTHER = "other"  # the metrics' path of a request that is not a generation


@dataclass(slots=True, eq=False)
class Picking:
    """One request as the picker holds it: what was asked (``Asked``, as
    the director's stages read it), what was decided, what came back."""

    started: float  # time.monotonic() when its headers came
    client_headers: dict[str, str] = field(default_factory=dict)
    path: str = OTHER  # a generation route's path, else OTHER
    route: Generation | None = None
    body: bytearray = field(default_factory=bytearray)
    subset: frozenset[str] | None = None  # the proxy's subset hint
    tenant: str = ""
    key_checked: bool = False
    ctx: RequestContext | None = None
    max_tokens: int | None = None
    charges: list[Classified] = field(default_factory=list)
    turn: Turn | None = None  # a Responses turn
    hold: Hold = field(default_factory=Hold)  # the bytes it holds of the router's budget
    # what was decided: the endpoints named, the one it was begun on
    ranked: list[Endpoint] = field(default_factory=list)
    work: Work | None = None
    endpoint: Endpoint | None = None
    prefill: int = 0  # its prefill on ``endpoint`` that no first byte released yet
    sent_at: float = 0.0
    ahead: int = 0  # prefill tokens at the endpoint when sent, its own included
    backlog: int = 0  # of those, other requests'
    # what came back
    status: int = 0  # the answer's, or the picker's own refusal's
    first_byte: bool = False
    answered: Answered | None = None
    output_tokens: int | None = None  # a Responses turn's usage; no other is read
    turn_answer: TurnAnswer | None = None  # a turn's 200 answer, stamped on its way
    held: Any = None  # the answer to its headers, while a whole turn answer is held

    @property
    def body_size(self) -> int:
        return len(self.body)


class _Immediate(Exception):
    """The proxy answers the client itself (a refusal, or what the picker
    answers from the router's own state): ``response`` says how."""

    def __init__(self, status: int, response: Any) -> None:
        super().__init__(status)
        self.status, self.response = status, response


def _refusal(err: ApiError) -> _Immediate:
    body = orjson.dumps(error_body(err.status, err.message, err.param))
    return _Immediate(err.status, protocol.immediate(err.status, body,
                                                   [("content-type", "application/json")]))


def _unauthorized(resp: web.Response) -> _Immediate:
    body = resp.body if isinstance(resp.body, bytes) else b""
    headers = [(k.lower(), v) for k, v in resp.headers.items()
               if k.lower() in ("content-type", "www-authenticate")]
    return _Immediate(resp.status, protocol.immediate(resp.status, body, headers))


class Picker:
    """Envoy's ``ExternalProcessor`` service over the router's parts: each
    ``Process`` call is one request."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.director, self.metrics = router.director, router.metrics

    async def Process(self, requests: Any, context: Any) -> None:
        """One stream, read and written through ``context`` rather than as
        async generators: each message costs the picker a loop wake-up in
        grpc.aio anyway, and the two generator layers added to each."""
        p = Picking(time.monotonic())
        read, write = context.read, context.write
        try:
            while (msg := await read()) is not grpc.aio.EOF:
                try:
                    out = await self._on(p, msg)
                except ApiError as err:
                    immediate: _Immediate | None = _refusal(err)
                except _Immediate as err:
                    immediate = err
                else:
                    immediate = None
                if immediate is not None:  # the proxy answers the client; the stream is over
                    p.status = immediate.status
                    await write(immediate.response)
                    return
                for response in out:
                    await write(response)
        finally:
            self._end(p)

    async def _on(self, p: Picking, msg: Any) -> list[Any]:
        kind = msg.WhichOneof("request")
        if kind == "request_headers":
            return await self._headers(p, msg)
        if kind == "request_body":
            p.body += msg.request_body.body
            limit = self.router.cfg.server.max_body_bytes
            if len(p.body) > limit:
                raise ApiError(413, f"request body over {limit} bytes (server.maxBodyBytes)")
            if not msg.request_body.end_of_stream:
                return []
            return await self._pick(p, body_ends=True)
        if kind == "request_trailers":  # the body ended with trailers, not end_of_stream
            out = [] if p.endpoint is not None else await self._pick(p, body_ends=False)
            return [*out, protocol.trailers(kind)]
        if kind == "response_headers":
            return await self._answer_headers(p, msg)
        if kind == "response_body":
            return await self._answer_body(p, msg.response_body.body,
                                           msg.response_body.end_of_stream)
        # response_trailers: a turn's answer that ended with them, not end_of_stream, ends here
        out = [] if p.turn_answer is None else await self._answer_body(p, b"", True, False)
        return [*out, protocol.trailers(kind)]

    async def _headers(self, p: Picking, msg: Any) -> list[Any]:
        if not protocol.streamed(msg):
            raise ApiError(500, "the endpoint picker needs the request body streamed full "
                                "duplex: set processing_mode.request_body_mode: "
                                "FULL_DUPLEX_STREAMED in the proxy's ext_proc filter")
        p.client_headers = h = protocol.headers_of(msg.request_headers)
        p.subset = protocol.subset_of(msg)
        path, _, query = h.get(":path", "").partition("?")
        if h.get(":method") == "POST" and (route := ROUTES.get(path)) is not None:
            p.route, p.path = route, path
        tenants = self.router.admission.tenants
        who = tenants.identify(h.get("authorization"))
        if isinstance(who, web.Response):
            raise _unauthorized(who)
        p.tenant, p.key_checked = who, tenants.keys is not None
        if (turn_route := stored.route_of(h.get(":method", ""), path)) is not None:
            # a stored turn: the router kept it, no model server did
            answer, rid = turn_route
            body = await answer(self.router.store, unquote(rid), p.tenant, dict(parse_qsl(query)))
            raise _Immediate(200, protocol.immediate(200, body,
                                                     [("content-type", "application/json")]))
        if msg.request_headers.end_of_stream:  # no body (a GET): picked now
            return await self._pick(p, body_ends=None)
        return []

    async def _pick(self, p: Picking, body_ends: bool | None) -> list[Any]:
        """The endpoints for the request and its body handed back (ending
        the stream when ``body_ends``; None: it has none): a generation is
        read, admitted and scheduled as the HTTP edge does it; anything
        else goes where the profile puts a request that asks nothing (no
        prompt, no model), with no charge to settle."""
        r = self.router
        body = bytes(p.body)
        if p.route is not None:
            got = await read(p.route, body, p.client_headers, r.handlers, p.tenant)
            p.ctx, p.max_tokens, body, p.turn = got.ctx, got.max_tokens, got.body, got.turn
            p.ctx.subset = p.subset
            if p.turn is not None:  # the conversation its chain brought in is held
                r.budget.take(p.hold, len(body) + len(p.ctx.prompt), "assembled chain bytes")
            await self.director.admit(p, r.scheduler)
        else:
            p.ctx = RequestContext(model=None, prompt=b"", subset=p.subset)
        d = self.director.schedule(p, r.scheduler)
        p.ranked = d.ranked[:1 + r.cfg.endpoint_picker.fallbacks]
        p.work = d.work()
        self._begin(p, p.ranked[0])
        headers = protocol.picked([e.name for e in p.ranked],
                                  None if body_ends is None else len(body),
                                  ["authorization"] if p.key_checked else [])
        if body_ends is None:
            return [headers]
        return [headers, *protocol.body_pieces("request_body", body, body_ends)]

    def _begin(self, p: Picking, ep: Endpoint) -> None:
        """The request counts on ``ep`` from now (in flight, its prefill),
        as the relay counts one it sends."""
        assert p.work is not None
        prefill = p.work.prefill(ep)
        p.sent_at, p.ahead, p.backlog = time.monotonic(), ep.prefill_tokens + prefill, (
            ep.prefill_tokens)
        ep.begin(p.work.tokens, prefill)
        p.endpoint, p.prefill = ep, prefill

    async def _answer_headers(self, p: Picking, msg: Any) -> list[Any]:
        p.status = protocol.status_of(msg.response_headers)
        p.answered = Answered()  # flow control settles on what goes by
        ep = p.endpoint
        served = protocol.served_of(msg)
        if ep is not None and served is not None and served != ep.name:
            # the proxy went down the list: the load moves to the one that answers
            moved = next((e for e in p.ranked if e.name == served), None)
            if moved is not None:
                assert p.work is not None
                ep.end(p.work.tokens, p.prefill)
                self._begin(p, moved)
                ep = moved
        if ep is None:
            return [protocol.answer_headers(())]
        if p.work is not None and p.work.answered is not None and p.status < 400:
            p.work.answered(ep)  # where the prompt is cached now
        end = msg.response_headers.end_of_stream
        if end:
            self._first_byte(p)
        answer = protocol.answer_headers((("x-toposerve-endpoint", ep.name),))
        if (turn := p.turn) is None or p.status != 200:  # an error answer goes on as it is
            return [answer]
        streamed = protocol.headers_of(msg.response_headers).get(
            "content-type", "").startswith("text/event-stream")
        r = self.router
        p.turn_answer = TurnAnswer(
            turn, streamed,
            lambda served, resp, text: turn.keep(r.store, p, served, served, resp, text),
            self.metrics.responses_unstored.inc, self.director.proxy.max_answer_bytes,
            lambda n: r.budget.adjust(p.hold, n, "answer bytes"))
        if streamed:
            return [answer]
        p.held = answer  # a whole answer: its headers wait for it (it may yet fail)
        return await self._answer_body(p, b"", True) if end else []

    def _first_byte(self, p: Picking) -> None:
        ep = p.endpoint
        if p.first_byte or ep is None:
            return
        p.first_byte = True
        now = time.monotonic()
        self.metrics.ttfb_of(p.path).observe(now - p.started)
        ep.learn_prefill(now - p.sent_at, p.ahead, p.backlog)
        ep.first_byte(p.prefill)
        p.prefill = 0

    async def _answer_body(self, p: Picking, chunk: bytes, end: bool,
                           closes: bool = True) -> list[Any]:
        """The answer's ``chunk`` handed on; ``end``: its body's last, which
        ``closes`` the stream unless trailers follow."""
        if chunk:
            self._first_byte(p)
            if p.answered is not None:
                p.answered.saw(chunk)
        if p.turn_answer is None or p.endpoint is None:
            return protocol.body_pieces("response_body", chunk, end)
        out = await p.turn_answer.feed(p.endpoint, chunk, end)
        if end:
            p.turn_answer = None  # stamped and kept: trailers after it end nothing more
        if out is None or not (out or end):
            return []  # held, or no event completed yet
        pieces = protocol.body_pieces("response_body", out, end and closes)
        if p.held is not None:
            pieces.insert(0, p.held)
            p.held = None
        return pieces

    def _end(self, p: Picking) -> None:
        """The stream ended: the answer is over, refused, or its client (or
        the proxy) went away. The endpoint's count and flow control's
        charge are settled either way."""
        if p.endpoint is not None and p.work is not None:
            p.endpoint.end(p.work.tokens, p.prefill)
            self.router.admission.request_done()  # a slot may have opened
        self.router.budget.give_back(p.hold)
        self.director.settle(p, not 0 < p.status < 400)
        if p.status:
            self.metrics.answered(p.path, p.status, time.monotonic() - p.started)
