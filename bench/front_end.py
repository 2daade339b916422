"""An HTTP front end alone, for bench.router_overhead: it answers the
benchmark's streamed chat request itself (a one-token event stream, as the
null backend sends it) with no upstream and no routing, so its CPU a
request is what the server part of a Python router costs by itself.

    python -m bench.front_end aiohttp PORT     # aiohttp's web server, as the router uses it
    python -m bench.front_end httptools PORT   # a bare asyncio Protocol over httptools
                                               # (bench.null_backend's)

Both read the body and parse it as JSON, and send the router's response
headers; aiohttp's handler sends headers, event and end in one write, as
the router's relay does for an answer that came whole. Both on uvloop.
"""

from __future__ import annotations

import argparse
import sys

import orjson
import uvloop
from aiohttp import web

from bench.flags import tcp_port
from bench.null_backend import NOT_FOUND, _events, serve

EVENTS = _events(chat=True)
HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
           "X-Request-Id": "front-end", "X-Toposerve-Endpoint": "none"}
_HEAD = (b"HTTP/1.1 200 OK\r\n" + b"".join(f"{k}: {v}\r\n".encode() for k, v in HEADERS.items())
         + b"Transfer-Encoding: chunked\r\n\r\n")
_ANSWER = _HEAD + b"%x\r\n" % len(EVENTS) + EVENTS + b"\r\n0\r\n\r\n"
_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


class _Buffered(web.StreamResponse):
    _send_headers_immediately = False  # as the relay's: the headers go with the events


def serve_aiohttp(port: int) -> None:
    async def chat(request: web.Request) -> web.StreamResponse:
        orjson.loads(await request.read())
        out = _Buffered(headers=HEADERS)
        await out.prepare(request)
        await out.write_eof(EVENTS)
        return out

    async def health(request: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None,
                loop=uvloop.new_event_loop())


def router_answer(method: bytes, path: bytes, body: bytes) -> bytes:
    """The router's answer to the benchmark's request, made without routing."""
    if method == b"POST" and path == b"/v1/chat/completions":
        orjson.loads(body)
        return _ANSWER
    return _OK if (method, path) == (b"GET", b"/health") else NOT_FOUND


def serve_httptools(port: int) -> None:
    # the null backend's server, answering as the router would
    uvloop.run(serve([port], router_answer))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.front_end", description=__doc__)
    ap.add_argument("stack", choices=["aiohttp", "httptools"])
    ap.add_argument("port", type=tcp_port)
    args = ap.parse_args(argv)
    (serve_aiohttp if args.stack == "aiohttp" else serve_httptools)(args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
