"""free_port: ports no outgoing connection can take before our process binds
them (below the kernel's ephemeral range), never the same one twice in a
row, and the OS's pick where the range leaves no room."""

from __future__ import annotations

import socket
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import pytest

from toposerve.localcluster import ports

pytestmark = pytest.mark.unit


def test_ports_below_the_ephemeral_range_and_distinct() -> None:
    lo, _ = ports.ephemeral_range()
    got = [ports.free_port() for _ in range(200)]
    # connect() takes its local port from [lo, hi]: none of these can be taken so
    assert all(ports.LOW <= p < min(ports.HIGH, lo) for p in got), got
    assert len(set(got)) == len(got)
    for p in got[:20]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_outgoing_connections_do_not_use_them() -> None:
    """The race this avoids: a burst of connections, as a benchmark's
    clients make, takes none of the ports handed out."""
    given = {ports.free_port() for _ in range(50)}
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(512)
        clients = [socket.create_connection(server.getsockname()) for _ in range(300)]
        try:
            used = {c.getsockname()[1] for c in clients}
        finally:
            for c in clients:
                c.close()
    assert not used & given


class Scripted:
    """A stand-in for the module's random source: these ports first."""

    def __init__(self, script: list[int]) -> None:
        self.script: Iterator[int] = iter(script)

    def randrange(self, lo: int, hi: int) -> int:
        return next(self.script)


def test_busy_and_recent_ports_are_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    busy_port = ports.free_port()
    recent = ports.free_port()
    fresh = ports.free_port()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", busy_port))
        busy.listen()
        monkeypatch.setattr(ports, "_pick", Scripted([busy_port, recent, fresh]))
        # ``fresh`` was handed out too: forget it, as if long ago
        monkeypatch.setattr(ports, "_recent", deque([recent], maxlen=8))
        assert ports.free_port() == fresh


def test_no_room_below_the_range_falls_back_to_the_os(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    wide = tmp_path / "range"
    wide.write_text("1024\t65535\n")
    monkeypatch.setattr(ports, "EPHEMERAL", wide)
    monkeypatch.setattr(ports, "_pick", Scripted([]))  # asked: StopIteration
    p = ports.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", p))


def test_unreadable_range_means_linux_default(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(ports, "EPHEMERAL", tmp_path / "missing")
    assert ports.ephemeral_range() == (32768, 60999)
    assert ports.LOW <= ports.free_port() < ports.HIGH
