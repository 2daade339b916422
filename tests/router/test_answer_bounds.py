"""Every byte of an answer the router holds is bounded, and every write to a
client has a deadline: a continuation cannot make the router assemble a
huge chain, an upstream cannot make it buffer a huge answer or an endless
event, and a client that stops reading loses its slot instead of holding
it (in this process: the router and its upstreams are aiohttp servers on
loopback ports)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.router.test_router_app import MODEL, stack

pytestmark = pytest.mark.unit  # no cluster, no subprocess


def _run(go: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(go(), 60))


def test_a_chain_over_max_chain_bytes_is_refused_before_it_is_assembled() -> None:
    async def go() -> None:
        async with stack([{}], {"responses": {"maxChainBytes": 3000}}) as s:
            async def turn(previous: str | None) -> Any:
                doc = {"model": MODEL, "input": "x" * 1600, "max_output_tokens": 2}
                if previous is not None:
                    doc["previous_response_id"] = previous
                return await s.client.post("/v1/responses", json=doc)

            first = await turn(None)
            assert first.status == 200, await first.text()
            second = await turn((await first.json())["id"])  # one turn before it: 1.6 kB
            assert second.status == 200, await second.text()
            third = await turn((await second.json())["id"])  # two: over 3,000 bytes
            assert third.status == 413
            err = (await third.json())["error"]
            assert "responses.maxChainBytes" in err["message"]
            assert err["param"] == "previous_response_id"
            assert s.router.budget.bytes == 0  # nothing held after the refusal
    _run(go)


def test_a_whole_answer_over_max_answer_bytes_is_a_502_naming_the_limit() -> None:
    async def go() -> None:
        async with stack([{"decode_s_per_token": 0.0}],
                         {"server": {"maxAnswerBytes": 4096}}) as s:
            small = await s.client.post("/v1/completions", json={
                "model": MODEL, "prompt": "hi", "max_tokens": 4})
            assert small.status == 200
            big = await s.client.post("/v1/completions", json={
                "model": MODEL, "prompt": "hi", "max_tokens": 5000})
            assert big.status == 502
            assert "server.maxAnswerBytes" in (await big.json())["error"]["message"]
            await asyncio.sleep(0)
            assert s.router.budget.bytes == 0  # what it held came back
    _run(go)


def _stalled_client(port: int, path: str, doc: dict[str, Any]) -> socket.socket:
    """A client that sends a streamed request and never reads its answer."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    body = orjson.dumps(doc)
    sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body))
    return sock


@pytest.mark.parametrize(("path", "doc"), [
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 900_000,
                         "stream": True}),
    ("/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 900_000,
                       "stream": True, "store": False}),
], ids=["piped", "rewritten"])
def test_clients_that_stop_reading_give_their_slots_back(path: str,
                                                         doc: dict[str, Any]) -> None:
    """Two streams whose clients read nothing fill maxInflightRequests: 2;
    after server.clientTimeoutSeconds without progress each is cut off and
    the next client is served (before, they held the slots for good)."""
    async def go() -> None:
        async with stack([{"decode_s_per_token": 0.0, "overhead_s": 0.0}],
                         {"server": {"clientTimeoutSeconds": 1, "maxInflightRequests": 2}}
                         ) as s:
            port = s.client.server.port
            assert port is not None
            stalled = [_stalled_client(port, path, doc) for _ in range(2)]
            try:
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 30
                while s.router.budget.requests < 2:  # both streams under way
                    assert loop.time() < deadline, "the streams never started"
                    await asyncio.sleep(0.05)
                while True:
                    r = await s.client.post("/v1/completions", json={
                        "model": MODEL, "prompt": "hi", "max_tokens": 2})
                    if r.status == 200:
                        break
                    assert r.status == 429, await r.text()
                    assert loop.time() < deadline, "the stalled clients kept their slots"
                    await asyncio.sleep(0.2)
                assert s.router.metrics.stalled_clients._value.get() >= 1
            finally:
                for sock in stalled:
                    sock.close()
    _run(go)


def test_an_event_without_an_end_is_a_stream_error_not_an_endless_buffer() -> None:
    """An upstream that streams a Responses event and never ends it: past
    server.maxAnswerBytes the client gets an SSE error event (before, the
    router buffered it without bound, rescanning it whole on every chunk)."""
    async def endless(request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        await out.write(b"event: response.output_text.delta\ndata: ")
        while True:
            await out.write(b"x" * 8192)

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL}]})

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="")

    async def go() -> None:
        app = web.Application()
        app.router.add_post("/v1/responses", endless)
        app.router.add_get("/v1/models", models)
        app.router.add_get("/health", ok)
        app.router.add_get("/metrics", ok)
        upstream = TestServer(app, host="127.0.0.1")
        await upstream.start_server()
        try:
            url = str(upstream.make_url("")).rstrip("/")
            async with stack([{}], {"server": {"maxAnswerBytes": 65536},
                                    "discovery": {"static": [{"url": url}]}}) as s:
                r = await s.client.post("/v1/responses", json={
                    "model": MODEL, "input": "hi", "stream": True, "store": False})
                assert r.status == 200
                body = await r.read()
                assert b"event: error" in body or b'"error"' in body, body[-300:]
                assert b"server.maxAnswerBytes" in body
                assert len(body) < 65536  # nothing of the unended event went on
                assert s.router.budget.bytes == 0  # what it held came back
        finally:
            await upstream.close()
    _run(go)


async def _upstream(answer: Callable[[web.Request], Awaitable[web.StreamResponse]]
                    ) -> TestServer:
    """A model server on loopback that answers every generation with
    ``answer`` (and lists the model, so the router sends it requests)."""
    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL}]})

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application()
    for path in ("/v1/responses", "/v1/chat/completions", "/v1/completions"):
        app.router.add_post(path, answer)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", ok)
    app.router.add_get("/metrics", ok)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


def test_malformed_upstream_answers_are_the_upstreams_fault() -> None:
    """A 200 whose body is not JSON is a 502 for a Responses turn (was a
    500 and a traceback); a streamed response.completed whose output has
    the wrong shape ends the stream normally, its text stored as empty
    (was a fault after the stream's head: a 500 head and a chunked body)."""
    async def not_json(request: web.Request) -> web.StreamResponse:
        return web.Response(text="<html>oops</html>", content_type="application/json")

    async def odd_completed(request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        event = {"type": "response.completed",
                 "response": {"id": "x", "output": "not a list", "status": "completed"}}
        await out.write(b"event: response.completed\ndata: " + orjson.dumps(event) + b"\n\n")
        await out.write_eof()
        return out

    async def go() -> None:
        for answer, stream in ((not_json, False), (odd_completed, True)):
            upstream = await _upstream(answer)
            try:
                url = str(upstream.make_url("")).rstrip("/")
                async with stack([{}], {"discovery": {"static": [{"url": url}]}}) as s:
                    r = await s.client.post("/v1/responses", json={
                        "model": MODEL, "input": "hi", "stream": stream})
                    if stream:
                        assert r.status == 200
                        body = await r.read()
                        assert b"response.completed" in body, body
                        rid = orjson.loads(body.split(b"data: ", 1)[1])["response"]["id"]
                        kept = await s.client.get(f"/v1/responses/{rid}")
                        assert kept.status == 200  # the turn was stored
                    else:
                        assert r.status == 502
                        assert "not a JSON object" in (await r.json())["error"]["message"]
            finally:
                await upstream.close()
    _run(go)
