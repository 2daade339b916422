"""Which HTTP stack should the router proxy with? The same minimal
pass-through proxy (read the body, POST it upstream, relay the answer as it
streams) on three stacks, in front of the same simulator, measured side by
side: latency added over a direct call, CPU per 195K-token request, and
throughput under concurrency. The third keeps aiohttp's client behind
granian's Rust HTTP server, to tell the server's share from the client's.

    python -m bench.http_stack            # table + bench/results/http_stack.json
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson

from bench.flags import tcp_port
from bench.replay import added_latency, big_prompts
from harness.procs import Proc, Procs
from toposerve.localcluster.ports import free_port
from toposerve.localcluster.results import table, write_json

REPO = Path(__file__).resolve().parents[1]
STACKS = ("aiohttp", "granian+aiohttp-client", "starlette+uvicorn+httpx")
UPSTREAM_ENV = "HTTP_STACK_UPSTREAM"
# per-event cost: at time scale 0.1 a 20 ms token takes 2 ms of wall time, as
# long as the simulator's coalescing window, so each token is its own write
EVENT_SIM: dict[str, Any] = {"time_scale": 0.1, "decode_s_per_token": 0.02}
EVENT_STREAM_TOKENS = 200


def serve_aiohttp(port: int, upstream: str) -> None:
    import uvloop
    from aiohttp import web

    async def handler(request: web.Request) -> web.StreamResponse:
        session: aiohttp.ClientSession = request.app["session"]
        body = await request.read()
        async with session.post(upstream + request.path, data=body,
                                headers={"Content-Type": "application/json"}) as r:
            out = web.StreamResponse(status=r.status, headers={
                "Content-Type": r.headers.get("Content-Type", "application/json")})
            await out.prepare(request)
            async for chunk in r.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out

    async def start(app: web.Application) -> None:
        app["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def stop(app: web.Application) -> None:
        await app["session"].close()

    app = web.Application(client_max_size=512 * 2**20)
    app.router.add_post("/{tail:.*}", handler)
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_get("/health", lambda r: web.Response(text="ok"))  # type: ignore[arg-type,return-value]
    uvloop.install()
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=lambda *_: None)


def serve_starlette(port: int, upstream: str) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, Response, StreamingResponse
    from starlette.routing import Route

    client = httpx.AsyncClient(limits=httpx.Limits(max_connections=None), timeout=None)

    async def handler(request: Request) -> Response:
        body = await request.body()
        req = client.build_request("POST", upstream + request.url.path, content=body,
                                   headers={"Content-Type": "application/json"})
        r = await client.send(req, stream=True)

        async def relay() -> Any:
            try:
                async for chunk in r.aiter_raw():
                    yield chunk
            finally:
                await r.aclose()

        return StreamingResponse(relay(), status_code=r.status_code,
                                 media_type=r.headers.get("content-type"))

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/health", health), Route("/{tail:path}", handler,
                                                           methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools",
                log_level="warning", access_log=False)


class GranianProxy:
    """The pass-through proxy as an RSGI app (granian's native interface)."""

    def __init__(self) -> None:
        self.session: aiohttp.ClientSession | None = None

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        if scope.path == "/health":
            proto.response_str(200, [("content-type", "text/plain")], "ok")
            return
        if self.session is None:  # made on granian's own loop
            self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        body = await proto()
        async with self.session.post(os.environ[UPSTREAM_ENV] + scope.path, data=body,
                                     headers={"Content-Type": "application/json"}) as r:
            out = proto.response_stream(r.status, [
                ("content-type", r.headers.get("Content-Type", "application/json"))])
            async for chunk in r.content.iter_any():
                await out.send_bytes(chunk)


granian_app = GranianProxy()


def serve_granian(port: int, upstream: str) -> None:
    from granian import Granian
    from granian.constants import Interfaces, Loops

    os.environ[UPSTREAM_ENV] = upstream
    Granian("bench.http_stack:granian_app", port=port, interface=Interfaces.RSGI,
            loop=Loops.uvloop, websockets=False, log_enabled=False).serve()


SERVERS = {"aiohttp": serve_aiohttp, "granian+aiohttp-client": serve_granian,
           "starlette+uvicorn+httpx": serve_starlette}


async def streams(url: str, n: int, width: int, max_tokens: int) -> int:
    """``n`` streamed completions of ``max_tokens`` tokens, ``width`` at a
    time; the SSE events received."""
    sem = asyncio.Semaphore(width)
    body = orjson.dumps({"model": "toposerve/sim-model", "prompt": "hello " * 50,
                         "max_tokens": max_tokens, "stream": True})

    async def one(session: aiohttp.ClientSession) -> int:
        async with sem, session.post(url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"}) as r:
            if r.status != 200:
                raise RuntimeError(f"{url}: HTTP {r.status}: {(await r.read())[:200]!r}")
            return len([1 async for line in r.content if line.startswith(b"data: {")])

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        return sum(await asyncio.gather(*(one(s) for _ in range(n))))


async def concurrent(url: str, n: int, width: int) -> float:
    """Requests per second for ``n`` small streamed completions, ``width`` at a time."""
    t0 = time.monotonic()
    await streams(url, n, width, 16)
    return n / (time.monotonic() - t0)


def start_stack(procs: Procs, stack: str, upstream: str) -> Proc:
    port = free_port()
    argv = [sys.executable, "-m", "bench.http_stack", "serve", "--stack", stack, "--port",
            str(port), "--upstream", upstream]
    return procs.command(argv, stack.split("+")[0], f"http://127.0.0.1:{port}", ("/health",))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.http_stack", description=__doc__)
    sub = ap.add_subparsers(dest="cmd")
    s = sub.add_parser("serve")
    s.add_argument("--stack", choices=STACKS, required=True)
    s.add_argument("--port", type=tcp_port, required=True)
    s.add_argument("--upstream", required=True)
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = ap.parse_args(argv)
    if args.cmd == "serve":
        SERVERS[args.stack](args.port, args.upstream)
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        procs = Procs(Path(tmp))
        try:
            sim = procs.sim(time_scale=0.0001, max_model_len=4_000_000)
            stacks = {stack: start_stack(procs, stack, sim.url) for stack in STACKS}
            paced = procs.sim(**EVENT_SIM)
            event_stacks = {stack: start_stack(procs, stack, paced.url) for stack in STACKS}
            added = added_latency(sim.url, {k: p.url for k, p in stacks.items()}, 200)
            for stack, p in stacks.items():
                cpu0 = p.cpu_seconds()
                ok = asyncio.run(big_prompts(p.url, 30, 195_000))
                big_cpu = (p.cpu_seconds() - cpu0) / max(ok, 1)
                cpu0 = p.cpu_seconds()
                rps = asyncio.run(concurrent(p.url, 600, 32))
                small_cpu = (p.cpu_seconds() - cpu0) / 600
                ep = event_stacks[stack]
                cpu0 = ep.cpu_seconds()
                # one event a token from a simulator whose tokens come
                # slower than it coalesces them
                events = asyncio.run(streams(ep.url, 64, 32, EVENT_STREAM_TOKENS))
                event_cpu = (ep.cpu_seconds() - cpu0) / max(events, 1)
                rows.append({"stack": stack, "added_p50_ms": round(added[stack] * 1000, 3),
                             "cpu_ms_per_195k_request": round(big_cpu * 1000, 2),
                             "cpu_ms_per_small_stream": round(small_cpu * 1000, 3),
                             "cpu_us_per_sse_event": round(event_cpu * 1e6, 1),
                             "streams_per_s_at_32": round(rps, 1)})
        finally:
            procs.close()
    print(table(["stack", "added p50 ms", "CPU ms per 195K-token request",
                 "CPU ms per small stream",
                 f"CPU us per SSE event ({EVENT_STREAM_TOKENS}-token streams)",
                 "streams/s at concurrency 32"],
                ([r["stack"], f"{r['added_p50_ms']:.2f}", f"{r['cpu_ms_per_195k_request']:.1f}",
                  f"{r['cpu_ms_per_small_stream']:.2f}", f"{r['cpu_us_per_sse_event']:.0f}",
                  f"{r['streams_per_s_at_32']:.0f}"] for r in rows), "lrrrrr"))
    write_json(Path(args.out) / "http_stack.json", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
