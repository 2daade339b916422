"""toposerve.serving.http.run_app, in a process of its own as the router, the
simulator and the extender run it: HTTP the parser refuses gets the app's
JSON error (never the offending line), SIGTERM shuts the app down
through its on_shutdown/on_cleanup, and a burst of connections is
accepted at once."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import ssl
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

from toposerve.localcluster.ports import free_port

APP = textwrap.dedent("""
    import asyncio
    import sys
    from aiohttp import web
    from toposerve.serving.http import run_app

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


def _read(s: socket.socket) -> bytes:
    """All a socket gets until the server closes it."""
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def _send(port: int, raw: bytes) -> tuple[bytes, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(raw)
        out = _read(s)
    head, _, body = out.partition(b"\r\n\r\n")
    return head, body


@contextlib.contextmanager
def served(app: str = APP, *args: str) -> Iterator[tuple[int, subprocess.Popen[str]]]:
    """``app`` (a script taking its port, then ``args``) in a process of its
    own, listening; killed if a test leaves it up."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", app, str(port), *args],
                            stdout=subprocess.PIPE, text=True)
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


BUSY_APP = textwrap.dedent("""
    import asyncio
    import pathlib
    import sys
    import time
    import uvloop
    from aiohttp import web
    from toposerve.serving.http import run_app

    flags = pathlib.Path(sys.argv[2])
    ticks = 0

    def tick():  # counts the loop's passes
        global ticks
        ticks += 1
        asyncio.get_running_loop().call_soon(tick)

    async def start(_):
        tick()

    async def block(_):  # holds the loop, as a saturated server's pass does
        (flags / "blocking").touch()
        deadline = time.monotonic() + 20
        while not (flags / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return web.json_response({"tick": ticks})

    async def now(_):
        return web.json_response({"tick": ticks})

    app = web.Application()
    app.router.add_get("/block", block)
    app.router.add_get("/tick", now)
    app.on_startup.append(start)
    uvloop.install()
    run_app(app, error_factory=lambda s, m: web.json_response({"Error": m}, status=s),
            host="127.0.0.1", port=int(sys.argv[1]),
            on_listening=lambda: print("listening", flush=True))
""")


def test_connections_that_wait_are_all_accepted_in_one_pass(tmp_path: Path) -> None:
    """While the server's loop is held, 40 clients connect and send a
    request each. When it is free again, their requests are read within a
    few passes of the loop, not one connection a pass (uvloop's own
    accept since libuv 1.45: the last of a burst waited 40 passes)."""
    clients: list[socket.socket] = []
    with served(BUSY_APP, str(tmp_path)) as (port, _):
        try:
            held = socket.create_connection(("127.0.0.1", port), timeout=30)
            clients.append(held)
            held.sendall(b"GET /block HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            deadline = time.monotonic() + 20
            while not (tmp_path / "blocking").exists():
                assert time.monotonic() < deadline, "the server never took /block"
                time.sleep(0.01)
            for _ in range(40):  # queued by the kernel while the loop is held
                c = socket.create_connection(("127.0.0.1", port), timeout=30)
                clients.append(c)
                c.sendall(b"GET /tick HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            (tmp_path / "go").touch()
            ticks = [json.loads(_read(c).partition(b"\r\n\r\n")[2])["tick"] for c in clients]
        finally:
            for c in clients:
                c.close()
    assert max(ticks[1:]) - min(ticks[1:]) < 10, ticks

TLS_APP = textwrap.dedent("""
    import ssl
    import sys
    import uvloop
    from aiohttp import web
    from toposerve.serving.http import run_app

    async def hello(_):
        return web.json_response({"ok": True})

    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(sys.argv[2], sys.argv[3])
    app = web.Application()
    app.router.add_get("/", hello)
    uvloop.install()
    run_app(app, error_factory=lambda s, m: web.json_response({"Error": m}, status=s),
            host="127.0.0.1", port=int(sys.argv[1]), ssl_context=ctx,
            on_listening=lambda: print("listening", flush=True))
""")


def test_tls_is_served_and_a_failed_handshake_leaves_the_server_up(tmp_path: Path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    ctx = ssl.create_default_context(cafile=str(cert))
    request = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    with served(TLS_APP, str(cert), str(key)) as (port, proc):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as plain:
            plain.sendall(request)  # HTTP on the TLS port: no handshake
            assert b"HTTP/1.1 200" not in _read(plain)
        for _ in range(2):
            with ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10),
                                 server_hostname="127.0.0.1") as s:
                s.sendall(request)
                head, _, body = _read(s).partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200"), head
                assert json.loads(body) == {"ok": True}
        assert proc.poll() is None
