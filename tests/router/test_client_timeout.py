"""A client has server.clientTimeoutSeconds to send its request: a body
trickled a byte at a time gets 408 and gives its request slot back, and a
connection that never completes a request head (idle, or sending it a byte
at a time) is closed. Without it, a few thousand such connections held
every slot of maxInflightRequests, or every file descriptor, for as long
as the client liked. Each against a real router process."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

import httpx
import pytest
from pydantic import ValidationError

from harness.procs import MODEL, Procs
from harness.waiting import wait_for
from tests.router.hangup import connect
from toposerve.router.config import ServerConfig

CHAT = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
TIMEOUT_S = 1.0


class Trickle:
    """Sends ``head`` and then one byte of ``drip`` every 0.2 s, until the
    server closes the connection or answers; keeps what it answered."""

    def __init__(self, url: str, head: bytes, drip: bytes) -> None:
        self.sock = connect(url, 30)
        self.sock.sendall(head)
        self.drip, self.answer = drip, b""
        self.ended_at: float | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.sock.settimeout(0.2)
        for i in range(len(self.drip)):
            try:
                self.sock.sendall(self.drip[i:i + 1])
                got = self.sock.recv(65536)
            except TimeoutError:
                continue  # nothing yet: the next byte
            except OSError:
                break  # reset by the server
            if not got:
                break  # closed by the server
            self.answer += got
            with_body = self.answer.partition(b"\r\n\r\n")[2]
            if with_body.endswith(b"}"):
                break
        self.ended_at = time.monotonic()

    def close(self) -> None:
        self.sock.close()
        self.thread.join(5)


def test_a_trickled_body_gets_408_and_frees_its_slot(procs: Procs) -> None:
    sim = procs.sim()
    router = procs.router({"server": {"clientTimeoutSeconds": TIMEOUT_S,
                                      "maxInflightRequests": 2}}, endpoints=[sim.url])
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 500\r\n\r\n")
    started = time.monotonic()
    slow = [Trickle(router.url, head, b" " * 499) for _ in range(2)]
    try:
        # both slots held: a third request is refused...
        held = wait_for("the slots held", lambda: httpx.post(
            router.url + "/v1/chat/completions", json=CHAT, timeout=10).status_code == 429)
        assert held
        # ...until the trickled bodies run out of time, though bytes keep coming
        wait_for("both trickles answered", lambda: all(t.ended_at for t in slow), timeout=20)
        for t in slow:
            status, _, rest = t.answer.partition(b"\r\n")
            assert status == b"HTTP/1.1 408 Request Timeout", t.answer[:200]
            error = json.loads(rest.partition(b"\r\n\r\n")[2])["error"]
            assert "server.clientTimeoutSeconds" in error["message"]
            assert error["type"] == "RequestTimeout"
            assert t.ended_at is not None and t.ended_at - started < TIMEOUT_S + 5
        ok = httpx.post(router.url + "/v1/chat/completions", json=CHAT, timeout=10)
        assert ok.status_code == 200
    finally:
        for t in slow:
            t.close()


def _closed(sock: socket.socket, within_s: float) -> float:
    """Waits for the server to close ``sock``; when it did."""
    sock.settimeout(within_s)
    with contextlib.suppress(ConnectionResetError):
        assert sock.recv(1) == b""
    return time.monotonic()


def test_an_idle_new_connection_is_closed(procs: Procs) -> None:
    sim = procs.sim()
    router = procs.router({"server": {"clientTimeoutSeconds": TIMEOUT_S}},
                          endpoints=[sim.url])
    with connect(router.url, 30) as s:
        started = time.monotonic()
        took = _closed(s, TIMEOUT_S + 10) - started
    assert TIMEOUT_S * 0.9 <= took < TIMEOUT_S + 5


def test_a_head_sent_a_byte_at_a_time_is_closed(procs: Procs) -> None:
    """Bytes keep coming, a header line that never ends: closed all the
    same, unanswered (no request was ever whole)."""
    sim = procs.sim()
    router = procs.router({"server": {"clientTimeoutSeconds": TIMEOUT_S}},
                          endpoints=[sim.url])
    started = time.monotonic()
    t = Trickle(router.url, b"GET /health HTTP/1.1\r\nHost: x\r\n", b"X-Slow: " + b"a" * 200)
    try:
        wait_for("the connection closed", lambda: t.ended_at is not None, timeout=20)
        assert t.answer == b""
        assert t.ended_at is not None
        assert TIMEOUT_S * 0.9 <= t.ended_at - started < TIMEOUT_S + 5
    finally:
        t.close()


def test_a_kept_alive_connection_closes_when_idle_and_not_before(procs: Procs) -> None:
    """After an answer the connection stays usable within the timeout, and
    is closed once idle past it."""
    sim = procs.sim()
    router = procs.router({"server": {"clientTimeoutSeconds": 2 * TIMEOUT_S}},
                          endpoints=[sim.url])
    with connect(router.url, 30) as s:
        for _ in range(2):
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(65536).startswith(b"HTTP/1.1 200")
            time.sleep(TIMEOUT_S)  # within the timeout: still open
        idle_from = time.monotonic() - TIMEOUT_S
        took = _closed(s, 2 * TIMEOUT_S + 10) - idle_from
    assert took >= 2 * TIMEOUT_S * 0.9


@pytest.mark.parametrize(("bad", "why"), [(0, "greater than 0"), (-1, "greater than 0"),
                                          (3601, "less than or equal to 3600"),
                                          ("soon", "valid number")])
def test_the_timeout_is_checked_as_config(bad: object, why: str) -> None:
    with pytest.raises(ValidationError, match=f"clientTimeoutSeconds(.|\\n)*{why}"):
        ServerConfig.model_validate({"clientTimeoutSeconds": bad})
