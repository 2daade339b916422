"""A body of many tiny JSON values cannot hold the router's event loop:
one that may hold more than a few thousand values is parsed and counted
in the router's body worker (a process of its own) before the loop parses
it, and one of more than server.maxJsonValues is refused. Against a real
router process over a real simulator."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp
import orjson
import psutil

from harness.bodies import encoded, reading_router
from harness.procs import MODEL, Procs
from harness.waiting import wait_for
from tests.router.hangup import connect
from tests.router.test_router_app import stack
from toposerve.router.http.bodies import INLINE_VALUES, few_values
from toposerve.wire.openai import ChatRequest, CompletionRequest, Message, ResponsesRequest

CHAT = "/v1/chat/completions"


async def _post(url: str, path: str, doc: dict[str, Any] | bytes) -> tuple[int, Any]:
    body = doc if isinstance(doc, bytes) else orjson.dumps(doc)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s, \
            s.post(url + path, data=body, headers={"Content-Type": "application/json"}) as r:
        return r.status, await r.json()


def _ask(url: str, path: str, doc: dict[str, Any]) -> tuple[int, Any]:
    return asyncio.run(_post(url, path, doc))


def test_values_past_max_json_values_are_refused_commas_in_strings_are_not_values(
        procs: Procs) -> None:
    """600,000 values anywhere in a body get 413 naming server.maxJsonValues
    (before, one message's 600,000 content parts, or an unknown field of
    600,000 numbers, were parsed and validated on the event loop and
    served); 600,000 messages still get maxListItems' 413, an unknown
    model its 404 first. A body whose commas are in its strings holds few
    values and is served, as is a prompt of 100,000 token ids."""
    sim = procs.sim(max_model_len=2**20)
    router = procs.router(endpoints=[sim.url])
    for doc, where in (
            ({"model": MODEL, "max_tokens": 2,
              "messages": [{"role": "user", "content": [{}] * 600_000}]}, None),
            ({"model": MODEL, "max_tokens": 2, "prompt": "hi", "junk": [1] * 600_000}, None),
            ({"model": MODEL, "input": "hi", "junk": [[]] * 600_000}, None)):
        path = CHAT if "messages" in doc else (
            "/v1/completions" if "prompt" in doc else "/v1/responses")
        status, answer = _ask(router.url, path, doc)
        assert status == 413, (path, answer)
        assert "server.maxJsonValues" in answer["error"]["message"]
        assert answer["error"]["param"] == where
    status, answer = _ask(router.url, CHAT, {"model": MODEL, "messages": [{}] * 600_000})
    assert status == 413 and "server.maxListItems" in answer["error"]["message"]
    status, answer = _ask(router.url, CHAT, {"model": "no-such-model",
                                             "messages": [{}] * 600_000})
    assert status == 404 and answer["error"]["param"] == "model"
    status, answer = _ask(router.url, CHAT, {"model": MODEL, "max_tokens": 2, "messages": [
        {"role": "user", "content": "," * 600_000}]})
    assert status == 200, answer
    status, answer = _ask(router.url, "/v1/completions", {
        "model": MODEL, "max_tokens": 2, "prompt": list(range(100, 100_100))})
    assert status == 200, answer
    # an invalid body the worker read is refused as the loop would refuse it
    status, answer = _ask(router.url, CHAT, {"model": MODEL, "messages": [
        {"role": "user", "content": [1] * 20_000}]})
    assert status == 400 and answer["error"]["param"] == "messages.0.content.str", answer


@contextmanager
def _health_latency(url: str) -> Iterator[list[float]]:
    """/health's latency in seconds, asked every 10 ms from a thread of its
    own while the block runs."""
    out: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        while not stop.wait(0.01):
            t0 = time.perf_counter()
            with connect(url, 30) as s:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                while s.recv(65536):
                    pass
            out.append(time.perf_counter() - t0)

    th = threading.Thread(target=probe, daemon=True)
    th.start()
    try:
        yield out
    finally:
        stop.set()
        th.join()


def test_wide_bodies_in_flight_do_not_hold_the_event_loop(procs: Procs) -> None:
    """Four clients send, three times each, bodies of 1.3 million empty
    lists (3.9 MB; refused for maxListItems): /health keeps answering in
    well under the time one such body takes to parse. Before, the router
    parsed each on its event loop and /health waited for every parse. The
    bound is relative (half a parse, timed here, on the same machine), so
    a loaded machine slows both sides alike."""
    sim = procs.sim()
    router = procs.router(endpoints=[sim.url])
    wide = orjson.dumps({"model": MODEL, "messages": [[]] * 1_300_000})
    parse_s = min(_timed(lambda: orjson.loads(wide)) for _ in range(3))

    async def client() -> list[int]:
        return [(await _post(router.url, CHAT, wide))[0] for _ in range(3)]

    async def attack() -> list[list[int]]:
        return await asyncio.gather(*(client() for _ in range(4)))

    with _health_latency(router.url) as latency:
        statuses = asyncio.run(attack())
    assert statuses == [[413] * 3] * 4
    assert latency and max(latency) < parse_s / 2, (
        f"/health took {1000 * max(latency):.0f} ms with wide bodies in flight; one "
        f"body's parse takes {1000 * parse_s:.0f} ms here")
    assert len(latency) >= 10, latency  # the probe ran through the attack


def _timed(f: Any) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def _worker(router_pid: int) -> psutil.Process | None:
    for child in psutil.Process(router_pid).children():
        if "toposerve.router.http.bodies" in child.cmdline():
            return child
    return None


def test_a_body_worker_that_dies_is_started_again(procs: Procs) -> None:
    """The worker starts with the first body that needs it; killed, the
    next such body starts another (or gets 503 if it was in the dying
    one), and the router stops it when it stops."""
    sim = procs.sim()
    router = procs.router(endpoints=[sim.url])
    wide = {"model": MODEL, "messages": [{}] * 20_000}
    assert _worker(router.popen.pid) is None  # not before a body needs it
    assert _ask(router.url, CHAT, wide)[0] == 413
    first = _worker(router.popen.pid)
    assert first is not None
    first.kill()
    first.wait(10)
    statuses = {_ask(router.url, CHAT, wide)[0] for _ in range(2)}
    assert statuses <= {413, 503} and 413 in statuses, statuses
    second = _worker(router.popen.pid)
    assert second is not None and second.pid != first.pid
    router.stop()
    wait_for("the worker stopped with the router", lambda: not second.is_running()
             or second.status() == psutil.STATUS_ZOMBIE)


# each route's model and the list its wide bodies are wide in
READ: dict[str, tuple[type[Any], str]] = {
    CHAT: (ChatRequest, "messages"), "/v1/completions": (CompletionRequest, "prompt"),
    "/v1/responses": (ResponsesRequest, "input")}


def test_a_body_the_worker_validated_is_not_validated_again() -> None:
    """Valid bodies of every shape as wide as the router serves
    (harness.bodies: many messages, one message's parts, token ids, a
    prompt batch, Responses items) are read by the body worker, which
    validates them; the event loop then parses them and validates nothing:
    the model's wide list is the document's own (validating it again made
    a copy, and cost an 8,192-message chat 21 ms of the loop, a batch of
    one-token prompts 30 ms). A body too small for the worker is validated
    on the loop. In this process: a router's handlers, its real worker."""
    router = reading_router()
    read = router.handlers.read_json

    async def go() -> None:
        try:
            for name, (path, body) in encoded(router.cfg.server).items():
                model, wide = READ[path]
                assert not few_values(body, INLINE_VALUES), name  # the worker reads it
                _, doc, parsed = await read(body, model, "default")
                assert getattr(parsed, wide) is doc[wide], name
                assert parsed.model == MODEL
            _, doc, parsed = await read(orjson.dumps({"model": MODEL, "messages": [
                {"role": "user", "content": "hi"}]}), ChatRequest, "default")
            assert isinstance(parsed.messages[0], Message)
        finally:
            await router.handlers.bodies.close()
    asyncio.run(asyncio.wait_for(go(), 60))


def test_many_tiny_items_are_refused_before_the_body_is_validated() -> None:
    """A body of many tiny messages costs validation some microseconds an
    item: an unknown model is a 404 and too many items a 413 naming
    server.maxListItems, both before it (before, 600,000 items held the event
    loop over a second and then got a validation error). In this process
    (a router and simulators on loopback ports), but not a unit test: the
    wide bodies start the router's body worker, a process."""
    async def go() -> None:
        async with stack([{}], {"server": {"maxListItems": 1000}}) as s:
            wide: list[dict[str, Any]] = [{}] * 600_000
            r = await s.client.post("/v1/chat/completions",
                                    json={"model": "no-such-model", "messages": wide})
            assert r.status == 404
            r = await s.client.post("/v1/chat/completions", json={"model": MODEL,
                                                                  "messages": wide})
            assert r.status == 413
            err = (await r.json())["error"]
            assert "server.maxListItems" in err["message"] and err["param"] == "messages"
            r = await s.client.post("/v1/responses", json={"model": MODEL, "input": wide})
            assert r.status == 413 and (await r.json())["error"]["param"] == "input"
            ok = [{"role": "user", "content": "hi"}] * 1000  # at the bound
            r = await s.client.post("/v1/chat/completions", json={
                "model": MODEL, "messages": ok, "max_tokens": 2})
            assert r.status == 200, await r.text()
    asyncio.run(asyncio.wait_for(go(), 60))
