"""The relay's own HTTP/1.1 client: one kept-alive connection per request
in flight to an endpoint, a C parser (httptools) under an asyncio
``Protocol``, and a pipe mode in which each body chunk goes from the
upstream socket's callback straight to the client's transport: no task
wake-up, no stream buffer and no await per relayed event. aiohttp's client
cost about three times our own code per event (its ``StreamReader``
resumes the transport and re-arms the read timeout on every read); the
scrapes and the non-streamed calls keep using it."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from typing import cast
from urllib.parse import urlsplit

import httptools

# the client's transport buffers this much before the upstream is paused;
# so does the answer's own buffer while a reader takes it a chunk at a time
HIGH_WATER = 256 * 1024


class UpstreamError(ConnectionError):
    """The upstream connection failed, closed or sent something that is
    not HTTP before its answer was complete."""


class Answer(asyncio.Protocol):
    """One connection; answers one request at a time. The body is read
    whole (``read``), a chunk at a time (``chunk``) or piped (``pipe``)."""

    def __init__(self, idle: list[Answer], read_timeout: float | None) -> None:
        self._idle, self._read_timeout = idle, read_timeout
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.status = 0
        self.headers: dict[str, str] = {}
        self.reused = False
        self.received = False  # a byte of this answer came
        self._parser: httptools.HttpResponseParser | None = None
        self._head: asyncio.Future[None] | None = None
        self._chunks: list[bytes] = []
        self._wake: asyncio.Future[None] | None = None  # a chunk, the end, a pause or an error
        self._complete = self._keep = False
        self._error: Exception | None = None
        self._framed = False
        self._chunked_out = False  # the pipe frames what it writes as HTTP/1.1 chunks
        self._saw: Callable[[bytes], None] = _ignore  # the pipe shows each piece to it
        self._dst: asyncio.WriteTransport | None = None  # the pipe's client transport
        self._last_rx = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._held = 0  # bytes in _chunks
        # a whole read's bound: a callback that counts each piece (raising
        # past what may be held) and the most one answer may hold
        self._take: Callable[[int], None] | None = None
        self._limit: int | None = None

    # --- asyncio.Protocol ----------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's subclass none of asyncio's

    def data_received(self, data: bytes) -> None:
        self.received = True
        self._last_rx = self._loop.time()
        assert self._parser is not None
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as err:
            self._fail(UpstreamError(f"malformed answer: {err}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self in self._idle:
            self._idle.remove(self)
        if self._head is not None and not self._complete:
            # a body that is neither chunked nor sized ends with the connection
            if self._head.done() and not self._framed and self._error is None:
                self.on_message_complete()
            else:
                self._fail(UpstreamError("upstream closed the connection"))

    # --- httptools callbacks -----------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        assert self._parser is not None and self._head is not None
        self.status = self._parser.get_status_code()
        self._framed = "content-length" in self.headers or "transfer-encoding" in self.headers
        if not self._head.done():
            self._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        dst = self._dst
        if dst is None:
            self._chunks.append(body)
            self._held += len(body)
            self._hold(len(body))
            self._wakeup()
            return
        # the hot path of every stream: one event in, one event out
        if dst.is_closing():
            self._fail(ConnectionResetError("the client went away"))
            return
        dst.write(b"%x\r\n%b\r\n" % (len(body), body) if self._chunked_out else body)
        self._saw(body)
        if dst.get_write_buffer_size() > HIGH_WATER and self.transport is not None:
            self.transport.pause_reading()
            self._wakeup()

    def on_message_complete(self) -> None:
        # asked now: once the message is complete the parser answers False
        self._keep = self._parser is not None and self._parser.should_keep_alive()
        self._complete = True
        self._stop_timer()
        self._wakeup()

    # --- the request ---------------------------------------------------------
    def send(self, head: bytes, body: bytes) -> None:
        assert self.transport is not None
        self._parser = httptools.HttpResponseParser(self)
        self._head = self._loop.create_future()
        self.status, self.headers, self._chunks, self._held = 0, {}, [], 0
        self._take = self._limit = None
        self.received = self._complete = self._framed = False
        self._error, self._dst, self._chunked_out = None, None, False
        self.transport.writelines((head, body))
        self._last_rx = self._loop.time()
        if self._read_timeout is not None:
            self._timer = self._loop.call_at(self._last_rx + self._read_timeout,
                                             self._idle_check)

    async def head(self) -> None:
        assert self._head is not None
        await self._head

    @property
    def buffered(self) -> bool:
        """A piece of the body came and is not read yet."""
        return bool(self._chunks)

    async def read(self, limit: int, take: Callable[[int], None]) -> bytes:
        """The whole body: at most ``limit`` bytes (else UpstreamError),
        each piece counted by ``take`` as it comes (which raises when the
        router may hold no more: the answer fails with that error)."""
        if self._held > limit:  # what came before the read
            raise UpstreamError(f"answer over {limit} bytes (server.maxAnswerBytes)")
        take(self._held)
        self._limit, self._take = limit, take
        while not self._complete:
            await self._wait()
        return b"".join(self._chunks)

    async def chunk(self) -> bytes:
        """The next piece of the body as it came; b"" at its end. While
        more than HIGH_WATER waits unread, the upstream is paused."""
        while not self._chunks and not self._complete:
            await self._wait()
        if not self._chunks:
            return b""
        body = self._chunks.pop(0)
        self._held -= len(body)
        if (self._held <= HIGH_WATER and self.transport is not None
                and not self.transport.is_reading() and not self._complete):
            self._last_rx = self._loop.time()  # our pause, not the upstream's silence
            self.transport.resume_reading()
        return body

    def rest(self) -> bytes | None:
        """The rest of the body when all of it has come (b"" for none
        left), else None: a short answer goes out in one write."""
        if not self._complete or self._error is not None:
            return None
        rest, self._chunks, self._held = b"".join(self._chunks), [], 0
        return rest

    async def pipe(self, dst: asyncio.WriteTransport, chunked: bool,
                   drain: Callable[[], Awaitable[None]], saw: Callable[[bytes], None]
                   ) -> None:
        """The rest of the body onto ``dst`` as it comes (``chunked``: in
        HTTP/1.1 chunks, else as it is), each piece shown to ``saw``;
        ``drain`` waits while the client reads slower than the upstream
        writes."""
        self._chunked_out, self._saw = chunked, saw
        for body in self._chunks:
            dst.write(b"%x\r\n%b\r\n" % (len(body), body) if chunked else body)
            saw(body)
        self._chunks, self._held = [], 0
        self._dst = dst
        try:
            while not self._complete:
                await self._wait()
                if self.transport is not None and not self.transport.is_reading():
                    await drain()
                    self._last_rx = self._loop.time()  # our pause, not the upstream's silence
                    self.transport.resume_reading()
        finally:
            self._dst = None

    def release(self) -> None:
        """Done with the answer: the connection serves the next request
        when the answer was read to its end, else it is closed."""
        self._stop_timer()
        if self._complete and self._keep and self._error is None and self.transport is not None:
            self._idle.append(self)
        else:
            self.close()

    def close(self) -> None:
        """Abort the connection: the upstream sees the client go and stops."""
        self._stop_timer()
        if self.transport is not None:
            self.transport.abort()
        self._fail(UpstreamError("connection closed by the router"))

    # --- internals -----------------------------------------------------------
    def _hold(self, n: int) -> None:
        """``n`` more bytes wait in the buffer: a whole read counts them
        against its bounds; a chunked reader that falls behind pauses the
        upstream (backpressure)."""
        if self._take is not None:
            assert self._limit is not None
            if self._held > self._limit:
                self._fail(UpstreamError(f"answer over {self._limit} bytes "
                                         "(server.maxAnswerBytes)"))
                return
            try:
                self._take(n)
            except Exception as err:  # the router's budget is spent
                self._fail(err)
        elif self._held > HIGH_WATER and self.transport is not None:
            self.transport.pause_reading()

    async def _wait(self) -> None:
        if self._error is not None:
            raise self._error
        self._wake = self._loop.create_future()
        try:
            await self._wake
        finally:
            self._wake = None
        if self._error is not None:
            raise self._error

    def _wakeup(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def _fail(self, err: Exception) -> None:
        if self._error is not None or self._complete:
            return
        self._error = err
        self._stop_timer()
        if self._head is not None and not self._head.done():
            self._head.set_exception(err)
            self._head.exception()  # retrieved: a failure nobody awaits is not an error
        self._wakeup()
        if self.transport is not None:
            self.transport.abort()

    def _idle_check(self) -> None:
        # one timer a read-timeout period, not one re-armed per chunk
        assert self._read_timeout is not None
        due = self._last_rx + self._read_timeout
        if self._loop.time() >= due:
            self._timer = None
            self._fail(TimeoutError(f"no byte from upstream in {self._read_timeout:g} s"))
        else:
            self._timer = self._loop.call_at(due, self._idle_check)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _ignore(body: bytes) -> None:
    pass


class Upstreams:
    """Kept-alive connections per endpoint URL, for the relay."""

    def __init__(self, connect_timeout: float | None, read_timeout: float | None) -> None:
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self._idle: dict[str, list[Answer]] = {}
        self._addr: dict[str, tuple[str, int, bool, bytes]] = {}
        self._tls: ssl.SSLContext | None = None  # made once: it loads the CA store

    async def post(self, url: str, path: str, headers: dict[str, str], body: bytes) -> Answer:
        """Send the request and wait for the answer's status and headers.
        A kept-alive connection the endpoint closed meanwhile (nothing came
        back on it) is retried once on a new one."""
        host, port, tls, hostport = self._address(url)
        head = b"".join((b"POST ", path.encode(), b" HTTP/1.1\r\nHost: ", hostport,
                         b"\r\nContent-Length: %d\r\nAccept-Encoding: identity\r\n" % len(body),
                         *(f"{k}: {v}\r\n".encode("utf-8", "surrogateescape")
                           for k, v in headers.items()), b"\r\n"))
        idle = self._idle.setdefault(url, [])
        while True:
            conn = await self._connection(idle, host, port, tls)
            conn.send(head, body)
            try:
                await conn.head()
                return conn
            except UpstreamError:
                conn.close()
                if conn.reused and not conn.received:
                    continue
                raise
            except BaseException:
                conn.close()
                raise

    async def _connection(self, idle: list[Answer], host: str, port: int, tls: bool
                          ) -> Answer:
        while idle:
            conn = idle.pop()
            if conn.transport is not None and not conn.transport.is_closing():
                conn.reused = True
                return conn
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: Answer(idle, self.read_timeout), host, port,
                    ssl=self._tls_context() if tls else None)
        except OSError as err:
            raise UpstreamError(f"cannot connect to {host}:{port}: {err}") from err
        return conn

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    def _address(self, url: str) -> tuple[str, int, bool, bytes]:
        if (addr := self._addr.get(url)) is None:
            u = urlsplit(url)
            tls = u.scheme == "https"
            host = u.hostname or "localhost"
            port = u.port or (443 if tls else 80)
            addr = self._addr[url] = (host, port, tls, u.netloc.encode("idna"))
        return addr

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in list(idle):
                conn.close()
        self._idle.clear()
