"""What reaches an upstream with a request: the client's own end-to-end
headers, never its hop-by-hop ones, and nothing left over from another
client. The router's upstream connections are shared by every client, so a
cookie an upstream sets (a load balancer in front of a model server sets
one for stickiness) must not be sent back with other clients' requests."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from aiohttp import web

from harness.procs import MODEL, Procs
from toposerve.localcluster.ports import free_port
from toposerve.router.pool.scrape import KV_USAGE, RUNNING, WAITING


@dataclass
class Scrape:
    accept_encoding: str | None
    names: set[str]


@pytest.fixture
def upstream() -> Iterator[tuple[str, list[dict[str, str]], list[Scrape]]]:
    """A stand-in for an upstream behind a cookie-setting balancer: answers
    chat completions with a Set-Cookie and records each request's headers
    (lower-cased names), and each /metrics request."""
    seen: list[dict[str, str]] = []
    scrapes: list[Scrape] = []

    async def chat(request: web.Request) -> web.Response:
        seen.append({k.lower(): v for k, v in request.headers.items()})
        resp = web.json_response({
            "id": "x", "object": "chat.completion", "created": 0, "model": MODEL,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "hi"}}]})
        resp.set_cookie("lb", f"client-{len(seen)}")
        return resp

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    async def metrics(request: web.Request) -> web.Response:
        scrapes.append(Scrape(request.headers.get("Accept-Encoding"),
                              set(request.query.getall("name[]", []))))
        return web.Response(text="")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    port = free_port()
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        # by name: aiohttp's default cookie jar ignores cookies of bare IPs
        yield f"http://localhost:{port}", seen, scrapes
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}


def test_an_upstream_cookie_never_reaches_other_clients(
        procs: Procs, upstream: tuple[str, list[dict[str, str]], list[Scrape]]) -> None:
    url, seen, _ = upstream
    router = procs.router(endpoints=[url])
    for _ in range(3):
        r = httpx.post(router.url + "/v1/chat/completions", json=BODY)
        assert r.status_code == 200, r.text
    assert [h.get("cookie") for h in seen] == [None, None, None]
    # a client's own cookie still goes through, as any other header does
    r = httpx.post(router.url + "/v1/chat/completions", json=BODY, headers={"Cookie": "mine=1"})
    assert r.status_code == 200 and seen[-1].get("cookie") == "mine=1"


def test_hop_by_hop_headers_stay_with_the_router(
        procs: Procs, upstream: tuple[str, list[dict[str, str]], list[Scrape]]) -> None:
    url, seen, _ = upstream
    router = procs.router(endpoints=[url])
    r = httpx.post(router.url + "/v1/chat/completions", json=BODY, headers={
        "Connection": "keep-alive, X-Hop", "X-Hop": "1", "TE": "trailers",
        "Proxy-Authorization": "Basic c2VjcmV0", "Expect": "100-continue",
        "Authorization": "Bearer token", "X-Session-Id": "s1", "X-Request-Id": "r1"})
    assert r.status_code == 200, r.text
    got = seen[-1]
    for name in ("x-hop", "te", "proxy-authorization", "expect"):
        assert name not in got, f"{name} was forwarded"
    assert got["authorization"] == "Bearer token" and got["x-session-id"] == "s1"
    assert got["x-request-id"] == "r1"


def test_a_key_the_router_checked_stays_with_the_router(
        procs: Procs, upstream: tuple[str, list[dict[str, str]], list[Scrape]],
        tmp_path: Path) -> None:
    """With API keys configured the client's key is the router's credential:
    the model servers never see a tenant's key."""
    url, seen, _ = upstream
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump({"apiVersion": "toposerve.io/v1", "kind": "APIKeys",
                                    "tenants": {"team-a": ["sk-a"]}}))
    router = procs.router({"flowControl": {"tenants": {"keys": {"file": str(keys)}}}},
                          endpoints=[url])
    r = httpx.post(router.url + "/v1/chat/completions", json=BODY,
                   headers={"Authorization": "Bearer sk-a", "X-Session-Id": "s1"})
    assert r.status_code == 200, r.text
    assert "authorization" not in seen[-1] and seen[-1]["x-session-id"] == "s1"


def test_bodies_come_uncompressed_and_scrapes_name_the_load_series(
        procs: Procs, upstream: tuple[str, list[dict[str, str]], list[Scrape]]) -> None:
    """The router relays bodies as they come, so it must not let aiohttp ask
    for gzip (vLLM's /metrics would come compressed); and it names the
    series it reads, so a prometheus_client server renders only those."""
    url, seen, scrapes = upstream
    router = procs.router(endpoints=[url])
    r = httpx.post(router.url + "/v1/chat/completions", json=BODY,
                   headers={"Accept-Encoding": "gzip"})
    assert r.status_code == 200, r.text
    assert seen[-1]["accept-encoding"] == "identity"
    assert scrapes and all(s.accept_encoding == "identity" for s in scrapes)
    named = scrapes[-1].names
    assert named >= WAITING | RUNNING | KV_USAGE
    assert {"vllm:num_requests_waiting", "vllm:num_requests_running",
            "vllm:kv_cache_usage_perc", "sglang:num_queue_reqs"} <= named
    # the cache config is asked for until it is known (the stand-in has none)
    assert "vllm:cache_config_info" in named
