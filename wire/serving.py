"""Serving an aiohttp app so that HTTP it cannot parse (a header line over
the parser's limit, an HTTP/2 preface on an HTTP/1 port) is refused in the
app's own JSON error shape, like every other bad request, instead of
aiohttp's plain-text page that quotes the offending line back.

aiohttp answers such requests before any middleware runs, from its
connection class's ``handle_error``; this swaps in a connection class
whose ``handle_error`` asks the app's error factory instead. The log line
for it is ``toposerve_cli.logs.ClientProtocolErrors``' (nothing of the line
itself is logged)."""

from __future__ import annotations

import asyncio
import contextlib
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


def run_app(app: web.Application, *, error_factory: ErrorFactory,
            sock: socket.socket | None = None, host: str | None = None,
            port: int | None = None, ssl_context: ssl.SSLContext | None = None,
            on_listening: Callable[[], None] = lambda: None,
            shutdown_timeout: float = 60.0, **handler_args: Any) -> None:
    """``web.run_app`` with JSON refusals: serves on ``sock`` when given,
    else ``host``:``port``, until SIGINT/SIGTERM, then shuts the app down
    gracefully (its on_shutdown, in-flight requests up to
    ``shutdown_timeout``, its on_cleanup)."""

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
            site = (web.SockSite(runner, sock, ssl_context=ssl_context) if sock else
                    web.TCPSite(runner, host, port, ssl_context=ssl_context))
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
