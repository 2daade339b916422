"""A model server that answers at once: OpenAI-compatible enough that every
router takes it as a worker (/v1/chat/completions and /v1/completions,
streamed or not, /v1/models, /health, /metrics in vLLM's format), on raw
asyncio + httptools under uvloop, so what a router adds in front of it is
the router's own cost. One process serves any number of ports (a fleet of
64 endpoints is one process, not 64).

    python -m bench.null_backend --ports 8001 8002 ...
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
from collections.abc import Callable

import httptools

from bench.flags import tcp_port

MODEL = "toposerve/sim-model"  # what the benchmarks' clients ask for (harness.procs.MODEL)

_MODELS = (b'{"object":"list","data":[{"id":"' + MODEL.encode() +
           b'","object":"model","created":0,"owned_by":"null","max_model_len":131072}]}')
_LABELS = b'{model_name="' + MODEL.encode() + b'"}'
# the gauges the routers read (toposerve's scrape, the Rust routers' load
# policies); all zero: the server is never busy
_METRICS = b"".join(
    b"# TYPE vllm:%s gauge\nvllm:%s%s 0.0\n" % (name, name, _LABELS)
    for name in (b"num_requests_running", b"num_requests_waiting", b"kv_cache_usage_perc"))
_CHAT = (b'{"id":"chatcmpl-null","object":"chat.completion","created":0,"model":"'
         + MODEL.encode() + b'","choices":[{"index":0,"message":{"role":"assistant",'
         b'"content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,'
         b'"completion_tokens":1,"total_tokens":2}}')
_TEXT = (b'{"id":"cmpl-null","object":"text_completion","created":0,"model":"'
         + MODEL.encode() + b'","choices":[{"index":0,"text":"ok","finish_reason":"stop"}],'
         b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}')


def _events(chat: bool) -> bytes:
    """A one-token stream, whole: the token, the finish, [DONE]."""
    kind, obj = (b'"delta":{"content":"ok"}', b"chat.completion.chunk") if chat else (
        b'"text":"ok"', b"text_completion")
    head = b'{"id":"null","object":"' + obj + b'","created":0,"model":"' + MODEL.encode() + b'"'
    return (b"data: " + head + b',"choices":[{"index":0,' + kind +
            b',"finish_reason":null}]}\n\n' +
            b"data: " + head + b',"choices":[{"index":0,' + kind.replace(b'"ok"', b'""') +
            b',"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')


def _response(status: bytes, ctype: bytes, body: bytes) -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\nContent-Type: " + ctype +
            b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def _sse(body: bytes) -> bytes:
    # chunked, as vLLM streams; one chunk and the terminator in one write
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n" +
            b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")


GETS = {b"/health": _response(b"200 OK", b"application/json", b""),
        b"/v1/models": _response(b"200 OK", b"application/json", _MODELS),
        b"/metrics": _response(b"200 OK", b"text/plain; version=0.0.4", _METRICS)}
POSTS = {b"/v1/chat/completions": (_response(b"200 OK", b"application/json", _CHAT),
                                   _sse(_events(True))),
         b"/v1/completions": (_response(b"200 OK", b"application/json", _TEXT),
                              _sse(_events(False)))}
NOT_FOUND = _response(b"404 Not Found", b"application/json", b'{"detail":"Not Found"}')


def answer(method: bytes, path: bytes, body: bytes) -> bytes:
    """The whole HTTP answer to a request (``path`` without its query)."""
    if method == b"GET":
        return GETS.get(path, NOT_FOUND)
    if method == b"POST" and (pair := POSTS.get(path)) is not None:
        # the compact and the spaced JSON spellings of "stream": true
        stream = b'"stream":true' in body or b'"stream": true' in body
        return pair[stream]
    return NOT_FOUND


Answerer = Callable[[bytes, bytes, bytes], bytes]


class _Conn(asyncio.Protocol):
    def __init__(self, answer: Answerer) -> None:
        self.answer = answer
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        assert self.transport is not None
        path = self.url.split(b"?", 1)[0]
        self.transport.write(self.answer(self.parser.get_method(), path, b"".join(self.body)))
        if not self.parser.should_keep_alive():
            self.transport.close()
        self.url, self.body = b"", []


async def serve(ports: list[int], answerer: Answerer = answer) -> None:
    """Answers on each of ``ports`` (``answerer``: the whole HTTP answer to
    a method, path and body) until cancelled."""
    loop = asyncio.get_running_loop()
    for port in ports:
        await loop.create_server(functools.partial(_Conn, answerer), "127.0.0.1", port,
                                 backlog=1024)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.null_backend", description=__doc__)
    ap.add_argument("--ports", type=tcp_port, nargs="+", required=True)
    args = ap.parse_args(argv)
    import uvloop

    uvloop.run(serve(args.ports))
    return 0


if __name__ == "__main__":
    sys.exit(main())
