"""The router's HTTP app in this process, in front of simulators in this
process (real aiohttp servers on loopback ports, no subprocess): what a
request leaves behind in the router's state, and what a failure inside a
handler looks like to the client, the metrics and the log."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import structlog
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from toposerve.router.config import RouterConfig
from toposerve.router.http.app import ROUTER, Router, build_app
from toposerve.router.http.handlers import session_key
from toposerve.router.request import RequestContext
from toposerve.router.scheduling.profile import Decision
from toposerve.simulator.config import SimConfig
from toposerve.simulator.server import build_app as build_sim

pytestmark = pytest.mark.unit  # no cluster, no subprocess: `make unit`

MODEL = "toposerve/sim-model"
LONG = "a system prompt long enough to fill several prefix blocks. " * 100


@dataclass
class Stack:
    client: TestClient[web.Request, web.Application]
    router: Router
    sims: list[str]  # their URLs, in the order given
    logs: list[MutableMapping[str, Any]]  # what the router and the simulators logged


async def _wait(what: str, check: Callable[[], bool], timeout: float = 10) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


@asynccontextmanager
async def stack(sims: list[dict[str, Any]], config: dict[str, Any]) -> AsyncIterator[Stack]:
    """Simulators with the given settings, and a router over them whose
    static endpoints are the simulators, each with its ``role``."""
    servers = []
    for s in sims:
        settings = {k: v for k, v in s.items() if k != "role"}
        server = TestServer(build_sim(SimConfig(time_scale=0.01, **settings)), host="127.0.0.1")
        await server.start_server()
        servers.append(server)
    urls = [str(s.make_url("")).rstrip("/") for s in servers]
    doc = {"apiVersion": "toposerve.io/v1", "kind": "RouterConfig",
           "scrape": {"intervalSeconds": 0.05},
           "discovery": {"static": [{"url": u, "role": s.get("role")}
                                    for u, s in zip(urls, sims, strict=True)]}, **config}
    app = build_app(RouterConfig.model_validate(doc))
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    router = app[ROUTER]
    # captured, not printed: a test before this one may have pointed the
    # logger at its own (now closed) stderr
    with structlog.testing.capture_logs() as logs:
        try:
            await _wait("every endpoint healthy",
                        lambda: all(ep.healthy for ep in router.state.pool))
            yield Stack(client, router, urls, logs)
        finally:
            await client.close()
            for server in servers:
                await server.close()


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


def completion(prompt: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 2, **extra}


def test_prefix_is_remembered_where_the_answer_came_from() -> None:
    """The first-ranked endpoint fails; failover answers from the next. The
    prefix index and the session table name the one that answered."""
    async def go() -> None:
        async with stack([{"error_rate": 1.0}, {}], {"profile": {"scorers": [
                {"type": "prefix-approx", "weight": 1}, {"type": "session", "weight": 1}]}}
                ) as s:
            bad, good = s.sims
            # the bad endpoint seems to hold the prompt, so it is ranked first
            blocks = RequestContext(model=None, prompt=LONG.encode()).byte_blocks(1024)
            s.router.state.approx.add(bad, blocks)
            r = await s.client.post("/v1/completions", json=completion(LONG),
                                    headers={"x-session-id": "s1"})
            assert r.status == 200, await r.text()
            assert r.headers["X-Toposerve-Endpoint"] == good.removeprefix("http://")
            assert s.router.state.approx.match(blocks, [good])[good] == len(blocks)
            assert s.router.state.sessions[session_key("s1")] == good

    run(go)


def _split_config(scorer: str) -> dict[str, Any]:
    return {"disaggregation": {"enabled": True, "decode": {
        "scorers": [{"type": scorer, "weight": 1}]}}}


def test_decode_profile_with_prefix_scorers_ranks_decode_endpoints() -> None:
    """A decode profile may score by prefix too: it ranks the decode
    endpoints by what they hold, not the prefill stage's endpoints."""
    async def go() -> None:
        for scorer in ("prefix-approx", "prefill-cost"):
            async with stack([{"role": "prefill"}, {"role": "prefill"}, {"role": "decode"},
                              {"role": "decode"}], _split_config(scorer)) as s:
                prefill, decode = s.sims[:2], s.sims[2:]
                for i in range(4):
                    r = await s.client.post("/v1/completions", json=completion(LONG + str(i)))
                    assert r.status == 200, (scorer, await r.text())
                    assert "http://" + r.headers["X-Toposerve-Prefill-Endpoint"] in prefill
                    assert "http://" + r.headers["X-Toposerve-Endpoint"] in decode, scorer

    run(go)


def test_unexpected_error_is_an_openai_500_counted_and_logged_once() -> None:
    async def go() -> None:
        async with stack([{}], {}) as s:
            def broken(ctx: RequestContext) -> Decision:
                raise RuntimeError("a bug in a scorer")

            s.router.scheduler.schedule = broken  # type: ignore[method-assign]
            before = len(s.logs)
            r = await s.client.post("/v1/completions", json=completion("hi"))
            assert r.status == 500
            body = await r.json()
            assert body["error"]["type"] == "InternalServerError"
            assert body["error"]["code"] == 500
            assert "RuntimeError" in body["error"]["message"]
            errors = [e for e in s.logs[before:] if e["log_level"] == "error"]
            assert len(errors) == 1 and errors[0].get("exc_info"), s.logs[before:]
            text = (await (await s.client.get("/metrics")).read()).decode()
            assert 'toposerve_router_requests_total{code="500",path="/v1/completions"} 1.0' in text

    run(go)
