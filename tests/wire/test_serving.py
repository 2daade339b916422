"""wire.serving.run_app, in a process of its own as the router, the
simulator and the extender run it: HTTP the parser refuses gets the app's
JSON error (never the offending line), and SIGTERM shuts the app down
through its on_shutdown/on_cleanup."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator

from localcluster.ports import free_port

APP = textwrap.dedent("""
    import asyncio
    import sys
    from aiohttp import web
    from wire.serving import run_app

    async def hello(_):
        return web.json_response({"ok": True})

    async def bye(_):
        print("shutdown", flush=True)

    def leave():
        raise web.GracefulExit  # how a part stops the server from a callback

    async def slow_then_exit(_):
        asyncio.get_running_loop().call_later(0.1, leave)
        await asyncio.sleep(1)  # in flight when the server stops
        return web.json_response({"finished": True})

    app = web.Application()
    app.router.add_get("/", hello)
    app.router.add_get("/exit", slow_then_exit)
    app.on_shutdown.append(bye)
    run_app(app, error_factory=lambda s, m: web.json_response({"Error": m}, status=s),
            host="127.0.0.1", port=int(sys.argv[1]), max_line_size=1024,
            max_field_size=1024, on_listening=lambda: print("listening", flush=True))
""")


def _send(port: int, raw: bytes) -> tuple[bytes, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(raw)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    head, _, body = out.partition(b"\r\n\r\n")
    return head, body


@contextlib.contextmanager
def served() -> Iterator[tuple[int, subprocess.Popen[str]]]:
    """APP in a process of its own, listening; killed if a test leaves it up."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", APP, str(port)], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "listening"
        yield port, proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_unparsable_http_gets_the_apps_json_error_and_sigterm_drains() -> None:
    with served() as (port, proc):
        secret = "sk-" + "s" * 5000
        for raw in (f"GET / HTTP/1.1\r\nAuthorization: Bearer {secret}\r\n\r\n".encode(),
                    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"):
            head, body = _send(port, raw)
            assert head.split(b" ")[1] == b"400", head
            assert b"application/json" in head, head
            assert json.loads(body)["Error"], body
            assert b"sk-s" not in body
        head, body = _send(port, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert json.loads(body) == {"ok": True}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert proc.stdout is not None and proc.stdout.read().strip() == "shutdown"


def test_a_graceful_exit_from_a_callback_lets_requests_in_flight_finish() -> None:
    """web.GracefulExit raised from a loop callback (the router's standby
    stops so, after handing its Lease back) shuts the app down as SIGTERM
    does: the request in flight gets its answer, the exit status is 0."""
    with served() as (port, proc):
        _, body = _send(port, b"GET /exit HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert json.loads(body) == {"finished": True}
        assert proc.wait(30) == 0
        assert proc.stdout is not None and proc.stdout.read().strip() == "shutdown"
