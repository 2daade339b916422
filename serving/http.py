"""Serving an aiohttp app so that HTTP it cannot parse (a header line over
the parser's limit, an HTTP/2 preface on an HTTP/1 port) is refused in the
app's own JSON error shape, like every other bad request, instead of
aiohttp's plain-text page that quotes the offending line back.

aiohttp answers such requests before any middleware runs, from its
connection class's ``handle_error``; this swaps in a connection class
whose ``handle_error`` asks the app's error factory instead. The log line
for it is ``toposerve.logs.ClientProtocolErrors``' (nothing of the line
itself is logged).

It also accepts connections itself (``_AcceptingSite``): every waiting
connection each time the listening socket is readable, where uvloop's
libuv takes one a loop tick."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
import socket
import ssl
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import LineTooLong
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_runner import GracefulExit

# (status, message) -> the response a client gets
ErrorFactory = Callable[[int, str], web.Response]

BACKLOG = 1024  # the kernel's queue of connections not yet accepted
# connections accepted in one go at most (asyncio's own loop takes up to
# its backlog); a longer pause than that would be a stall of its own
ACCEPTS_A_TICK = 256
ACCEPT_RETRY_S = 1.0  # out of descriptors or memory: try again after this
# accept() errors that pass with time; anything else is the socket's end
_PASSING = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

log = logging.getLogger(__name__)


def bind(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A socket listening on ``host:port`` (IPv6 when the host has a colon);
    ``reuse_port``: one of several processes' sockets on it (SO_REUSEPORT:
    the kernel spreads the connections over them)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=BACKLOG,
                                reuse_port=reuse_port)


def unparsable(exc: BaseException | None) -> str:
    """What a client is told about HTTP the parser refused: never the line
    itself, which may hold a credential."""
    if isinstance(exc, LineTooLong):
        return "a request line or header line is too long for this server"
    return f"malformed HTTP request ({type(exc).__name__ if exc else 'unparsable'})"


class _Connection(RequestHandler):
    error_factory: ErrorFactory

    def handle_error(self, request: BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if status >= 500:  # the app's bug or a timeout: aiohttp's own handling
            return super().handle_error(request, status, exc, message)
        self.log_exception("Error handling request from %s", request.remote,
                           exc_info=exc)  # logged as one warning line
        resp = self.error_factory(status, unparsable(exc))
        resp.force_close()
        return resp


class _Server(web.Server):
    error_factory: ErrorFactory

    def __call__(self) -> RequestHandler:
        conn = _Connection(self, loop=self._loop, **self._kwargs)
        conn.error_factory = self.error_factory
        return conn


class _Runner(web.AppRunner):
    def __init__(self, app: web.Application, error_factory: ErrorFactory,
                 **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._error_factory = error_factory

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # aiohttp builds its Server inside the app (Application may not be
        # subclassed); _Server adds nothing but the connection class
        server.__class__ = _Server
        assert isinstance(server, _Server)
        server.error_factory = self._error_factory
        return server


class _AcceptingSite(web.BaseSite):
    """Serves a listening socket, accepting every connection that waits each
    time it is readable. Since libuv 1.45 (libuv#3696) uvloop takes one
    connection a loop tick, and a tick of a busy server is a pass over every
    busy connection: 128 clients connecting to a saturated router waited a
    tick each, the last one over a second before its first request was read
    (docs/benchmarks.md, "Sixth pass"), and clients that open a
    connection a request got one a tick."""

    __slots__ = ("_connecting", "_retry", "_sock")

    def __init__(self, runner: web.BaseRunner, sock: socket.socket,
                 ssl_context: ssl.SSLContext | None) -> None:
        super().__init__(runner, ssl_context=ssl_context)
        self._sock = sock
        self._connecting: set[asyncio.Task[None]] = set()  # TLS handshakes, mostly
        self._retry: asyncio.TimerHandle | None = None

    @property
    def name(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"{'https' if self._ssl_context else 'http'}://{host}:{port}"

    async def start(self) -> None:
        await super().start()
        self._sock.setblocking(False)
        asyncio.get_running_loop().add_reader(self._sock.fileno(), self._accept)

    def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(ACCEPTS_A_TICK):
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return  # none left (or one given up before it was taken)
            except OSError as err:
                if err.errno not in _PASSING:
                    raise  # the loop logs it; the socket is gone
                # the socket stays readable: stop watching it for a while
                log.warning("cannot accept a connection (%s); retrying in %.0f s",
                            err.strerror, ACCEPT_RETRY_S)
                loop.remove_reader(self._sock.fileno())
                self._retry = loop.call_later(
                    ACCEPT_RETRY_S, loop.add_reader, self._sock.fileno(), self._accept)
                return
            conn.setblocking(False)
            task = loop.create_task(self._connect(loop, conn))
            self._connecting.add(task)
            task.add_done_callback(self._connecting.discard)

    async def _connect(self, loop: asyncio.AbstractEventLoop, conn: socket.socket) -> None:
        server = self._runner.server
        assert server is not None
        try:
            await loop.connect_accepted_socket(server, conn, ssl=self._ssl_context)
        except OSError as err:  # a failed TLS handshake, a client already gone
            log.debug("connection not set up: %s", err)
            conn.close()

    async def stop(self) -> None:
        with contextlib.suppress(ValueError, OSError):  # never started, or closed
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
        if self._retry is not None:
            self._retry.cancel()
        for task in list(self._connecting):
            task.cancel()
        self._sock.close()
        await super().stop()


def run_app(app: web.Application, *, error_factory: ErrorFactory,
            sock: socket.socket | None = None, host: str | None = None,
            port: int | None = None, ssl_context: ssl.SSLContext | None = None,
            on_listening: Callable[[], None] = lambda: None,
            shutdown_timeout: float = 60.0, **handler_args: Any) -> None:
    """``web.run_app`` with JSON refusals: serves on ``sock`` when given,
    else ``host``:``port``, until SIGINT/SIGTERM, then shuts the app down
    gracefully (its on_shutdown, in-flight requests up to
    ``shutdown_timeout``, its on_cleanup)."""
    listening = sock if sock is not None else bind(host or "", 8080 if port is None else port)

    async def main() -> None:
        # the stop signals end the wait below, so the shutdown runs inside
        # this task while requests are still in flight
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        runner = _Runner(app, error_factory, handle_signals=False,
                         shutdown_timeout=shutdown_timeout, **handler_args)
        await runner.setup()
        try:
            site = _AcceptingSite(runner, listening, ssl_context)
            await site.start()
            on_listening()
            await stop.wait()
        finally:
            await runner.cleanup()

    # as web.run_app runs it: a part may also stop the server by raising
    # GracefulExit from a callback of its own (the router's standby does,
    # after handing its Lease back), which ends run_until_complete; the
    # serving task is then cancelled alone, so its finally shuts the app
    # down while the other tasks (requests in flight) carry on
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    task = loop.create_task(main())
    try:
        loop.run_until_complete(task)
    except (GracefulExit, KeyboardInterrupt):
        pass
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                loop.run_until_complete(task)
        rest = asyncio.all_tasks(loop)
        for t in rest:
            t.cancel()
        loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
