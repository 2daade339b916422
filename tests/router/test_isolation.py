"""A tenant sees only its own stored responses, on either replica of a
pair sharing one Redis: another tenant's `GET /v1/responses/{id}` and
`previous_response_id` answer 404 as if the id did not exist.

The tenant is what the tenants middleware puts in `request["tenant"]`;
here a test-only middleware sets it from a header, so the store's side is
tested whatever the key source."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from harness.procs import MODEL, Procs
from router.config import RouterConfig
from router.http.server import build_app
from tests.router.test_redis_store import redis_url  # noqa: F401  (the fixture)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def tenant_header(request: web.Request, handler: Handler) -> web.StreamResponse:
    request["tenant"] = request.headers.get("x-test-tenant", "")
    return await handler(request)


def replica(sim: str, redis: str) -> web.Application:
    app = build_app(RouterConfig.model_validate({
        "apiVersion": "toposerve.io/v1", "kind": "RouterConfig",
        "discovery": {"static": [{"url": sim}]}, "scrape": {"intervalSeconds": 0.05},
        "responses": {"backend": "redis", "redisUrl": redis}}))
    app.middlewares.append(tenant_header)
    return app


async def pair(sim: str, redis: str) -> None:
    a = TestClient(TestServer(replica(sim, redis)))
    b = TestClient(TestServer(replica(sim, redis)))
    await a.start_server()
    await b.start_server()
    try:
        for c in (a, b):
            for _ in range(200):
                if (await c.get("/ready")).status == 200:
                    break
                await asyncio.sleep(0.05)
        r = await a.post("/v1/responses", headers={"x-test-tenant": "red"},
                         json={"model": MODEL, "input": "hello", "max_output_tokens": 2})
        assert r.status == 200, await r.text()
        rid = (await r.json())["id"]
        for c in (a, b):
            assert (await c.get(f"/v1/responses/{rid}", headers={"x-test-tenant": "red"})
                    ).status == 200
            other = await c.get(f"/v1/responses/{rid}", headers={"x-test-tenant": "blue"})
            assert other.status == 404
            assert "not found" in (await other.json())["error"]["message"]
            assert (await c.get(f"/v1/responses/{rid}")).status == 404  # nor the keyless
            chain = await c.post("/v1/responses", headers={"x-test-tenant": "blue"}, json={
                "model": MODEL, "input": "more", "previous_response_id": rid,
                "max_output_tokens": 2})
            assert chain.status == 404
            own = await c.post("/v1/responses", headers={"x-test-tenant": "red"}, json={
                "model": MODEL, "input": "more", "previous_response_id": rid,
                "max_output_tokens": 2})
            assert own.status == 200, await own.text()
    finally:
        await a.close()
        await b.close()


def test_other_tenants_responses_are_404_on_either_replica(procs: Procs,
                                                          redis_url: str) -> None:  # noqa: F811
    asyncio.run(pair(procs.sim().url, redis_url))
