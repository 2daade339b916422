"""Raw-socket clients, for what HTTP clients will not do: hang up before
the answer, send a body in pieces, send something that is not HTTP/1.1."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager


def connect(url: str, timeout: float) -> socket.socket:
    """A TCP connection to the server of an ``http://host:port`` URL."""
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=timeout)


@contextmanager
def hanging_client(url: str, path: str, body: bytes, stream: bool) -> Iterator[None]:
    """Sends ``body``; the connection closes when the block ends. Streamed,
    the answer's headers are awaited first."""
    with connect(url, 10) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        if stream:
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
        yield
