"""The relay's own HTTP/1.1 client (router/relay/upstream.py) against real
servers on loopback in this process: bodies read whole and piped as chunks,
kept-alive connections reused, a kept-alive connection the server dropped
retried once, a silent upstream timed out, a malformed answer refused, a
slow client pausing the upstream, and a closed answer seen by the server."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest

from toposerve.router.relay.upstream import HIGH_WATER, UpstreamError, Upstreams

pytestmark = pytest.mark.unit  # no cluster, no subprocess: `make unit`

RawHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
HEADERS = {"Content-Type": "application/json", "X-Request-Id": "abc"}



def _count(n: int) -> None:
    """A whole read's byte count, unbounded here."""

def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


async def serve(handler: RawHandler) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request's head and body (sized by Content-Length); b"" at EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return b""  # the client closed the connection
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    return head + await reader.readexactly(length)


def answers(*raw: bytes) -> RawHandler:
    """A server that answers its connection's requests with ``raw``, in turn."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for answer in raw:
            await read_request(reader)
            writer.write(answer)
            await writer.drain()
    return handler


def sse(events: list[bytes]) -> bytes:
    chunks = b"".join(b"%x\r\n%b\r\n" % (len(e), e) for e in events)
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n")


class Sink(asyncio.WriteTransport):
    """The client's side of a pipe: what was written, and a write buffer
    that stays over the high-water mark until ``drain`` is awaited."""

    def __init__(self, full: bool = False) -> None:
        super().__init__()
        self.data = bytearray()
        self.full, self.drains = full, 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.data += data

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return HIGH_WATER + 1 if self.full else 0

    async def drain(self) -> None:
        self.drains += 1
        self.full = False


def test_pipe_reframes_chunks_and_the_connection_is_reused() -> None:
    async def body() -> None:
        conns: list[int] = []
        requests: list[bytes] = []

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            conns.append(1)
            while req := await read_request(reader):
                requests.append(req)
                writer.write(sse([b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"]))
                await writer.drain()
            writer.close()

        server, url = await serve(handler)
        ups = Upstreams(1.0, 5.0)
        for _ in range(2):
            ans = await ups.post(url, "/v1/completions", HEADERS, b'{"x": 1}')
            assert ans.status == 200
            assert ans.headers["content-type"] == "text/event-stream"
            sink = Sink()
            seen: list[bytes] = []
            await ans.pipe(sink, True, sink.drain, seen.append)
            ans.release()
            assert bytes(sink.data) == (b"9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n"
                                        b"e\r\ndata: [DONE]\n\n\r\n")
            assert b"".join(seen) == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
        assert len(conns) == 1  # kept alive
        head = requests[0].split(b"\r\n\r\n")[0].decode()
        assert head.startswith("POST /v1/completions HTTP/1.1\r\n")
        assert "X-Request-Id: abc" in head and "Content-Length: 8" in head
        assert requests[0].endswith(b'{"x": 1}')
        ups.close()
        server.close()
    run(body)


def test_read_whole_and_chunk_by_chunk() -> None:
    async def body() -> None:
        server, url = await serve(answers(
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 5\r\n\r\nnope!", sse([b"a", b"b"])))
        ups = Upstreams(1.0, 5.0)
        ans = await ups.post(url, "/x", {}, b"")
        assert (ans.status, await ans.read(1024, _count)) == (404, b"nope!")
        ans.release()
        ans = await ups.post(url, "/x", {}, b"")
        got = [await ans.chunk() for _ in range(3)]
        assert got[-1] == b"" and b"".join(got) == b"ab"
        ans.release()
        ups.close()
        server.close()
    run(body)


def test_a_dropped_kept_alive_connection_is_retried_once_on_a_new_one() -> None:
    async def body() -> None:
        conns: list[int] = []

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            conns.append(1)
            if len(conns) == 1:
                await read_request(reader)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
                # the second request on this connection is read and dropped
                await read_request(reader)
                writer.transport.abort()
                return
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nnew")
            await writer.drain()

        server, url = await serve(handler)
        ups = Upstreams(1.0, 5.0)
        ans = await ups.post(url, "/x", {}, b"")
        assert await ans.read(1024, _count) == b"ok"
        ans.release()
        ans = await ups.post(url, "/x", {}, b"")
        assert await ans.read(1024, _count) == b"new"
        assert len(conns) == 2
        ups.close()
        server.close()
    run(body)


def test_a_silent_upstream_times_out_and_a_malformed_one_is_refused() -> None:
    async def body() -> None:
        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n")
            await writer.drain()
            await reader.read()  # then nothing, until the client goes

        server, url = await serve(silent)
        ups = Upstreams(1.0, 0.2)
        ans = await ups.post(url, "/x", {}, b"")
        assert await ans.chunk() == b"a"
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(TimeoutError):
            await ans.chunk()
        assert 0.15 < loop.time() - t0 < 2.0
        ans.release()
        bad, bad_url = await serve(answers(b"this is not HTTP\r\n\r\n"))
        with pytest.raises(UpstreamError, match="malformed"):
            await ups.post(bad_url, "/x", {}, b"")
        ups.close()
        server.close()
        bad.close()
    run(body)


def test_connect_refused_is_an_upstream_error() -> None:
    async def body() -> None:
        server, url = await serve(read_request_and_close)
        server.close()
        await server.wait_closed()
        with pytest.raises(UpstreamError, match="cannot connect"):
            await Upstreams(1.0, 1.0).post(url, "/x", {}, b"")
    run(body)


async def read_request_and_close(reader: asyncio.StreamReader,
                                 writer: asyncio.StreamWriter) -> None:
    writer.close()


def test_a_slow_client_pauses_the_upstream_and_close_reaches_the_server() -> None:
    async def body() -> None:
        gone = asyncio.Event()
        more = asyncio.Event()

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n1\r\na\r\n")
            await writer.drain()
            await more.wait()
            writer.write(b"1\r\nb\r\n")
            await writer.drain()
            await reader.read()  # EOF: the router closed the connection
            gone.set()

        server, url = await serve(handler)
        ups = Upstreams(1.0, 5.0)
        ans = await ups.post(url, "/x", {}, b"")
        sink = Sink(full=True)
        piping = asyncio.create_task(ans.pipe(sink, False, sink.drain, lambda b: None))
        more.set()
        await asyncio.wait_for(_until(lambda: sink.drains == 1), 5)
        assert bytes(sink.data) in (b"a", b"ab")
        ans.close()
        with pytest.raises(UpstreamError):
            await piping
        await asyncio.wait_for(gone.wait(), 5)
        ups.close()
        server.close()
    run(body)


async def _until(check: Callable[[], bool]) -> None:
    while not check():
        await asyncio.sleep(0.01)
