"""A client that sends one request and hangs up: raw sockets, since HTTP
clients wait for the answer."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def hanging_client(url: str, path: str, body: bytes, stream: bool) -> Iterator[None]:
    """Sends ``body``; the connection closes when the block ends. Streamed,
    the answer's headers are awaited first."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        if stream:
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
        yield
