"""A real router process in front of a model server that answers whatever
hypothesis draws: any status, any content type, JSON of any shape, raw
bytes, event streams cut anywhere or without separators. Whatever the
upstream sends, the router's answer is never a 500 (its own fault), the
answer ends, and the router keeps serving: a malformed upstream answer is
the upstream's fault (a 502) or passes through as it came."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.procs import MODEL, Proc, Procs
from tests.fuzz.strategies import FUZZ, json_values
from toposerve.localcluster.ports import free_port

ROUTES = {
    "/v1/chat/completions": {"model": MODEL, "max_tokens": 1,
                             "messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"model": MODEL, "prompt": "hi", "max_tokens": 1},
    "/v1/responses": {"model": MODEL, "input": "hi", "max_output_tokens": 1},
}


class Upstream:
    """A model server in a thread of this process whose next generation
    answer is ``answer``: (status, content type, body pieces)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.answer: tuple[int, str, list[bytes]] = (200, "application/json", [b"{}"])
        self._loop = asyncio.new_event_loop()
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self._thread.start()
        assert started.wait(10)

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        status, ctype, pieces = self.answer
        out = web.StreamResponse(status=status, headers={"Content-Type": ctype})
        await out.prepare(request)
        for piece in pieces:
            await out.write(piece)
        await out.write_eof()
        return out

    def _run(self, started: threading.Event) -> None:
        async def models(request: web.Request) -> web.Response:
            return web.json_response({"object": "list", "data": [{"id": MODEL}]})

        async def ok(request: web.Request) -> web.Response:
            return web.Response(text="")

        app = web.Application()
        for path in ROUTES:
            app.router.add_post(path, self._generate)
        app.router.add_get("/v1/models", models)
        app.router.add_get("/health", ok)
        app.router.add_get("/metrics", ok)
        runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        started.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Upstream, Proc]]:
    upstream = Upstream()
    procs = Procs(tmp_path_factory.mktemp("fuzz-upstream"))
    try:
        # one attempt: a 5xx from the upstream is then the router's answer to judge
        router = procs.router({"server": {"maxAttempts": 1, "maxAnswerBytes": 65536}},
                              endpoints=[upstream.url])
        yield upstream, router
    finally:
        procs.close()
        upstream.close()


def _json(doc: Any) -> bytes:
    # the standard library's encoder: json_values draws integers past 64 bits
    return json.dumps(doc).encode()


def _event(doc: Any) -> bytes:
    return b"data: " + _json(doc) + b"\n\n"


@st.composite
def answers(draw: st.DrawFn) -> tuple[int, str, list[bytes]]:
    status = draw(st.sampled_from([200, 200, 200, 201, 400, 404, 422, 500, 503]))
    kind = draw(st.sampled_from(["json", "bytes", "events", "cut", "completed"]))
    if kind == "json":
        return status, "application/json", [_json(draw(json_values))]
    if kind == "bytes":
        return status, draw(st.sampled_from(["application/json", "text/event-stream",
                                             "text/plain"])), [draw(st.binary(max_size=300))]
    if kind == "completed":  # a Responses terminal event of any shape
        doc = {"type": "response.completed", "response": draw(json_values)}
        return status, "text/event-stream", [b"event: response.completed\n" + _event(doc)]
    events = [_event(v) for v in draw(st.lists(json_values, max_size=5))]
    body = b"".join(events)
    if kind == "cut":  # split anywhere, or never separated
        at = draw(st.integers(min_value=0, max_value=len(body)))
        body = body[:at] + (b"" if draw(st.booleans()) else b"x" * 70_000)
    pieces = [body[i:i + 97] for i in range(0, len(body), 97)] or [b""]
    return status, "text/event-stream", pieces


@settings(FUZZ, max_examples=150)
@given(answers(), st.sampled_from(sorted(ROUTES)), st.booleans())
def test_whatever_the_upstream_answers_is_never_our_500(stack: tuple[Upstream, Proc],
                                                        answer: tuple[int, str, list[bytes]],
                                                        route: str, stream: bool) -> None:
    upstream, router = stack
    upstream.answer = answer
    with httpx.Client(base_url=router.url, timeout=20) as c:
        r = c.post(route, json={**ROUTES[route], "stream": stream})
        assert r.status_code != 500, (answer, route, r.text[:300])
        assert c.get("/health").status_code == 200
